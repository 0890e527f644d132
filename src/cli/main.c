/* cli/main.c: `keel <command>` — dispatch to one small file per subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/core.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command COMMANDS[] = {
    {"train", keel_cmd_train, "train a model: keel train CONFIG.json [--set key=value ...] [--run-dir DIR]"},
    {"generate", keel_cmd_generate, "text from a model: keel generate PATH --prompt TEXT [--max-new-tokens N] [--temperature X]"},
    {"serve", keel_cmd_serve, "the OpenAI completions API for a model: keel serve PATH [--host ADDR] [--port N]"},
    {"eval", keel_cmd_eval, "loss of a run's weights: keel eval RUN_DIR --data PATH"},
    {"data", keel_cmd_data, "prepare token shards: keel data prepare --model M --input F... --out DIR"},
    {"tokenize", keel_cmd_tokenize, "text <-> ids with a SentencePiece model: keel tokenize --model M [--decode]"},
    {"ckpt", keel_cmd_ckpt, "checkpoints: keel ckpt list RUN_DIR | keel ckpt verify PATH"},
    {"config", keel_cmd_config, "config keys and resolved configs: keel config keys | keel config show CONFIG"},
    {"health", keel_cmd_health, "is this node fit to train: keel health [--json] [--dir PATH] [--config CONFIG]"},
    {"plan", keel_cmd_plan, "memory and step time before a run: keel plan CONFIG [--nodes N] [--per-node G] [--device D]"},
    {"status", keel_cmd_status, "a run at a glance: keel status RUN_DIR [--watch[=S]] [--json]"},
    {"plot", keel_cmd_plot, "loss and throughput curves: keel plot RUN_DIR --out FILE.svg"},
    {"cluster", keel_cmd_cluster, "a Slurm cluster from a spec: keel cluster up|down|status|env|exec|slurm-conf SPEC.json"},
    {"k8s", keel_cmd_k8s, "Kubernetes: keel k8s manifest SPEC.json|SPEC.env | keel k8s status|logs|delete NAME"},
    {"worker", keel_cmd_worker, "one rank of a distributed run (started by keel train --nproc)"},
    {"agent", keel_cmd_agent, "one node of a job whose nodes meet in etcd (Kubernetes): keel agent CONFIG --run-dir RUN"},
    {"launch", keel_cmd_launch, "N ranks on this machine over Gloo: keel launch -n N -- PROGRAM [ARGS...]"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: keel <command> [options]   (keel <command> --help for more)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(out, "  %-9s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("keel %s\n", KEEL_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(argv[1], COMMANDS[i].name)) return COMMANDS[i].run(argc - 1, argv + 1);
    keel_errorf("unknown command '%s'; run `keel --help` for the list", argv[1]);
    return 2;
}
