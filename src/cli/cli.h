/* cli: one function per `keel` subcommand. Each parses its own argv (argv[0]
 * is the subcommand name), validates, calls a module, and returns the process
 * exit code (0 ok, 2 bad input, 1 other failure). No logic of its own. */
#ifndef KEEL_CLI_H
#define KEEL_CLI_H

int keel_cmd_train(int argc, char **argv);
int keel_cmd_eval(int argc, char **argv);
int keel_cmd_tokenize(int argc, char **argv);
int keel_cmd_data(int argc, char **argv);
int keel_cmd_config(int argc, char **argv);
int keel_cmd_worker(int argc, char **argv);
int keel_cmd_ckpt(int argc, char **argv);
int keel_cmd_health(int argc, char **argv);

#endif
