/* cli/cmd_serve.c: `keel serve PATH` — the OpenAI completions API for a
 * run, a checkpoint or a Hugging Face directory, on 127.0.0.1 by default,
 * until SIGINT or SIGTERM. Prints the base URL it serves on stdout (one line,
 * nothing else), the rest on stderr. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/infer.h"
#include "keel/kernels.h"

static const char USAGE[] =
    "usage: keel serve PATH [options]\n"
    "  PATH                a run directory (its final weights, else its newest good checkpoint),\n"
    "                      a checkpoint, or a Hugging Face LlamaForCausalLM directory\n"
    "  --host ADDR         the numeric IP address to bind (127.0.0.1; 0.0.0.0 lets other hosts in:\n"
    "                      there is no TLS and no authentication, see docs/security.md)\n"
    "  --port N            the port (8000; 0: a free one); stdout gets the URL served\n"
    "  --batch N           prompts run together, from requests that decode alike (8)\n"
    "  --queue N           requests that may wait while a batch runs; more are answered 503 (32)\n"
    "  --model-name NAME   what /v1/models and the answers call the model (PATH)\n"
    "  --bf16              bf16 weights and GEMMs (half the bytes a token reads; fp32 sums)\n"
    "  --threads N         threads (0: every core, the default)\n"
    "  --tokenizer FILE    tokenizer.json or .model, instead of the model's own\n"
    "Endpoints: POST /v1/completions, GET /v1/models, GET /health (docs/inference.md, \"keel serve\").\n";

int keel_cmd_serve(int argc, char **argv) {
    static const struct option options[] = {
        {"host", required_argument, NULL, 'H'},  {"port", required_argument, NULL, 'p'},
        {"batch", required_argument, NULL, 'c'}, {"queue", required_argument, NULL, 'q'},
        {"model-name", required_argument, NULL, 'm'}, {"bf16", no_argument, NULL, 'b'},
        {"threads", required_argument, NULL, 't'}, {"tokenizer", required_argument, NULL, 'z'},
        {"help", no_argument, NULL, 'h'},        {0, 0, 0, 0},
    };
    keel_serve_options o = {.host = "127.0.0.1", .port = 8000, .batch = 8, .queue = 32};
    const char *tokenizer = NULL;
    long long x, threads = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'H': o.host = optarg; break;
        case 'p':
            if (!cli_parse_int("--port", optarg, 0, 65535, &x)) return 2;
            o.port = (int)x;
            break;
        case 'c':
            if (!cli_parse_int("--batch", optarg, 1, 4096, &x)) return 2;
            o.batch = (int)x;
            break;
        case 'q':
            if (!cli_parse_int("--queue", optarg, 1, 1 << 16, &x)) return 2;
            o.queue = (int)x;
            break;
        case 'm': o.model_name = optarg; break;
        case 'b': o.bf16 = true; break;
        case 't':
            if (!cli_parse_int("--threads", optarg, 0, 4096, &threads)) return 2;
            break;
        case 'z': tokenizer = optarg; break;
        case 'h': fputs(USAGE, stdout); return 0;
        default: return 2;
        }
    }
    if (optind != argc - 1) {
        keel_errorf("usage: keel serve PATH [--host ADDR] [--port N] [options] (keel serve --help)");
        return 2;
    }
    if (!o.model_name) o.model_name = argv[optind];
    /* SIGINT and SIGTERM are taken by sigwait below: blocked in every thread started from here */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-answer is libmicrohttpd's to notice, not a reason to die */
    keel_infer_model m;
    keel_status st = keel_infer_load(argv[optind], tokenizer, &m);
    if (st != KEEL_OK) return keel_status_exit_code(st);
    int used = keel_kernels_init((int)threads);
    keel_server *s = NULL;
    st = keel_serve_start(&m, &o, &s);
    if (st == KEEL_OK) {
        printf("%s\n", keel_serve_url(s));
        fflush(stdout);
        keel_log_info("serve: %s (%s, %d thread(s), context %d) at %s/completions; --batch %d, --queue %d",
                      m.what, o.bf16 ? "bf16" : "fp32", used, m.cfg.model.max_seq_len, keel_serve_url(s), o.batch,
                      o.queue);
        int sig = 0;
        sigwait(&stop, &sig);
        keel_log_info("serve: %s: stopping (requests still queued are answered 503)", strsignal(sig));
        keel_serve_stop(s);
    }
    keel_kernels_shutdown();
    keel_infer_model_free(&m);
    return keel_status_exit_code(st);
}
