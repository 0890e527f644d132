/* cli/cli.h: one function per `keel` subcommand. Each parses its own argv (argv[0]
 * is the subcommand name), validates, calls a module, and returns the process
 * exit code (0 ok, 2 bad input, 1 other failure). No logic of its own. */
#ifndef KEEL_CLI_H
#define KEEL_CLI_H

#include <stdbool.h>

#include "keel/core.h"

int keel_cmd_train(int argc, char **argv);
int keel_cmd_eval(int argc, char **argv);
int keel_cmd_generate(int argc, char **argv);
int keel_cmd_serve(int argc, char **argv);
int keel_cmd_tokenize(int argc, char **argv);
int keel_cmd_data(int argc, char **argv);
int keel_cmd_config(int argc, char **argv);
int keel_cmd_worker(int argc, char **argv);
int keel_cmd_agent(int argc, char **argv);
int keel_cmd_launch(int argc, char **argv);
int keel_cmd_ckpt(int argc, char **argv);
int keel_cmd_health(int argc, char **argv);
int keel_cmd_plan(int argc, char **argv);
int keel_cmd_status(int argc, char **argv);
int keel_cmd_plot(int argc, char **argv);
int keel_cmd_cluster(int argc, char **argv);
int keel_cmd_k8s(int argc, char **argv);

/* Strict numeric options: the whole text is a number in [min, max], or one
 * error line names the flag, the text and the range, and false comes back. */
bool cli_parse_int(const char *flag, const char *text, long long min, long long max, long long *out);
bool cli_parse_double(const char *flag, const char *text, double min, double max, double *out);

/* One --set key=value more into sets (room for CLI_MAX_SETS): false, with
 * one error line, when there are too many. */
#define CLI_MAX_SETS 256
bool cli_add_set(char **sets, int *n_sets, char *text);

/* CONFIG with the --set overrides applied in order, finalized (keel train,
 * keel plan, keel agent). On failure one line has said why; cfg is to be freed either way. */
keel_status cli_load_config(keel_config *cfg, const char *path, char **sets, int n_sets);

#endif
