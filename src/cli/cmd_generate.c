/* cli/cmd_generate.c: `keel generate PATH --prompt TEXT | --prompts FILE.jsonl`
 * — text from a run, a checkpoint or a Hugging Face directory, streamed to
 * stdout in prompt order (or one JSON line per prompt with --json). */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/infer.h"
#include "keel/kernels.h"

enum { MAX_STOPS = 16 };

static const char USAGE[] =
    "usage: keel generate PATH (--prompt TEXT | --prompts FILE.jsonl) [options]\n"
    "  PATH                a run directory (its final weights, else its newest good checkpoint),\n"
    "                      a checkpoint, or a Hugging Face LlamaForCausalLM directory\n"
    "  --prompt TEXT       one prompt\n"
    "  --prompts FILE      JSON Lines, one {\"prompt\": \"text\"} or {\"prompt\": [token ids]} per line\n"
    "  --max-new-tokens N  at most N new tokens a prompt (128)\n"
    "  --temperature X     0 (the default) is greedy; above 0 samples from softmax(logits / X)\n"
    "  --top-k K           sample among the K most likely only (0: all)\n"
    "  --top-p P           sample among the most likely whose probability reaches P, in (0, 1] (1: all)\n"
    "  --seed S            prompt i samples from its own generator seeded by (S, i) (0)\n"
    "  --stop TEXT         stop before TEXT (repeatable; not printed)\n"
    "  --stop-token TOKEN  stop at this special token, e.g. '<|eot_id|>' (repeatable), besides EOS\n"
    "  --ignore-eos        generate --max-new-tokens whatever comes\n"
    "  --no-bos            do not put the model's BOS before each prompt\n"
    "  --json              one JSON line per prompt: completion, ids, tokens, finish_reason\n"
    "  --bf16              bf16 weights and GEMMs (half the bytes a token reads; fp32 sums)\n"
    "  --batch N           prompts decoded together (8)\n"
    "  --threads N         threads (0: every core, the default; with --nproc, per process: the cores shared)\n"
    "  --nproc N           N processes on this machine, each generating every Nth prompt\n"
    "  --tokenizer FILE    tokenizer.json or .model, instead of the model's own\n";

/* Prompts printed in order: the one at `cur` streams, later ones wait. */
typedef struct {
    int n, cur;
    bool json;
    char **text;     /* (n) latest text of each prompt */
    size_t *ready, *printed;
    bool *done;
    cJSON **line;    /* (n) --json: each prompt's line once done */
} printer;

static void flush(printer *p) {
    while (p->cur < p->n) {
        int i = p->cur;
        if (!p->json && p->text[i] && p->ready[i] > p->printed[i]) {
            fwrite(p->text[i] + p->printed[i], 1, p->ready[i] - p->printed[i], stdout);
            p->printed[i] = p->ready[i];
        }
        if (!p->done[i]) break;
        if (p->json) {
            char *s = cJSON_PrintUnformatted(p->line[i]);
            printf("%s\n", s);
            cJSON_free(s);
        } else {
            fputs(i + 1 < p->n ? "\n\n" : "\n", stdout);
        }
        p->cur++;
    }
    fflush(stdout);
}

static void on_update(void *ctx, const keel_gen_update *u) {
    printer *p = ctx;
    int i = u->prompt;
    keel_free(p->text[i]);
    p->text[i] = keel_xmalloc(u->len + 1, "generated text");
    memcpy(p->text[i], u->text, u->len + 1);
    p->ready[i] = u->ready;
    p->done[i] = u->done;
    if (u->done && p->json) {
        cJSON *o = p->line[i] = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "prompt", i);
        cJSON_AddStringToObject(o, "completion", u->text);
        cJSON *ids = cJSON_AddArrayToObject(o, "ids");
        for (int j = 0; j < u->n_ids; j++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(u->ids[j]));
        cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
        cJSON_AddNumberToObject(o, "completion_tokens", u->n_ids);
        cJSON_AddStringToObject(o, "finish_reason", u->finish_reason);
    }
    flush(p);
}

/* --nproc: one process's share (every nproc-th prompt), its updates as JSON lines */
typedef struct {
    keel_infer_model *m;
    const keel_gen_prompt *prompts;
    int n;
    const keel_gen_params *g;
    printer *p;
    FILE *out;
    const int *global; /* the share's prompt k is prompt global[k] of the whole */
    keel_gen_stats stats;
} split_ctx;

static void send_update(void *ctx, const keel_gen_update *u) {
    split_ctx *c = ctx;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompt", c->global[u->prompt]);
    cJSON_AddStringToObject(o, "text", u->text);
    cJSON_AddNumberToObject(o, "len", (double)u->len);
    cJSON_AddNumberToObject(o, "ready", (double)u->ready);
    cJSON *ids = cJSON_AddArrayToObject(o, "ids");
    for (int j = 0; u->done && j < u->n_ids; j++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(u->ids[j]));
    cJSON_AddNumberToObject(o, "n_ids", u->n_ids);
    cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
    cJSON_AddBoolToObject(o, "done", u->done);
    if (u->finish_reason) cJSON_AddStringToObject(o, "finish_reason", u->finish_reason);
    char *line = cJSON_PrintUnformatted(o);
    fprintf(c->out, "%s\n", line);
    fflush(c->out);
    cJSON_free(line);
    cJSON_Delete(o);
}

static keel_status share(void *ctx, int rank, int nproc, FILE *out) {
    split_ctx *c = ctx;
    int k = 0, *global = keel_xmalloc(sizeof(int) * (size_t)(c->n / nproc + 1), "share");
    keel_gen_prompt *mine = keel_xmalloc(sizeof *mine * (size_t)(c->n / nproc + 1), "share");
    /* each prompt keeps the generator it has in the whole: (seed, its index there) */
    for (int i = rank; i < c->n; i += nproc, k++) {
        global[k] = i, mine[k] = c->prompts[i];
        mine[k].seeded = true, mine[k].seed = c->g->seed, mine[k].seed_index = i;
    }
    c->out = out, c->global = global;
    keel_status st = k ? keel_infer_generate(c->m, mine, k, c->g, send_update, c, &c->stats) : KEEL_OK;
    if (st == KEEL_OK)
        fprintf(out, "{\"stats\": [%lld, %lld, %lld, %.9g, %.9g]}\n", (long long)c->stats.prompt_tokens,
                (long long)c->stats.new_tokens, (long long)c->stats.decode_tokens, c->stats.prefill_s, c->stats.decode_s);
    keel_free(global);
    keel_free(mine);
    return st;
}

/* A line from a share: an update for the printer, or the share's totals. */
static void take_line(void *ctx, const char *line) {
    split_ctx *c = ctx;
    cJSON *o = cJSON_Parse(line);
    const cJSON *stats = cJSON_GetObjectItemCaseSensitive(o, "stats");
    if (cJSON_GetArraySize(stats) == 5) {
        double v[5];
        for (int i = 0; i < 5; i++) v[i] = cJSON_GetArrayItem(stats, i)->valuedouble;
        c->stats.prompt_tokens += (int64_t)v[0], c->stats.new_tokens += (int64_t)v[1];
        c->stats.decode_tokens += (int64_t)v[2];
        /* the shares ran side by side: the slowest one's time is the call's */
        c->stats.prefill_s = v[3] > c->stats.prefill_s ? v[3] : c->stats.prefill_s;
        c->stats.decode_s = v[4] > c->stats.decode_s ? v[4] : c->stats.decode_s;
    } else if (cJSON_IsObject(o)) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "ids");
        int n = cJSON_GetArraySize(ids);
        int32_t *v = keel_xmalloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1), "ids");
        for (int i = 0; i < n; i++) v[i] = (int32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(o, "text");
        const cJSON *reason = cJSON_GetObjectItemCaseSensitive(o, "finish_reason");
        keel_gen_update u = {
            .prompt = (int)cJSON_GetObjectItemCaseSensitive(o, "prompt")->valuedouble,
            .text = text->valuestring,
            .len = strlen(text->valuestring),
            .ready = (size_t)cJSON_GetObjectItemCaseSensitive(o, "ready")->valuedouble,
            .ids = v,
            .n_ids = (int)cJSON_GetObjectItemCaseSensitive(o, "n_ids")->valuedouble,
            .prompt_tokens = (int)cJSON_GetObjectItemCaseSensitive(o, "prompt_tokens")->valuedouble,
            .done = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "done")),
            .finish_reason = cJSON_IsString(reason) ? reason->valuestring : NULL,
        };
        if (u.ready > u.len) u.ready = u.len;
        on_update(c->p, &u);
        keel_free(v);
    }
    cJSON_Delete(o);
}

static keel_status read_prompts(const char *path, keel_gen_prompt **prompts, int *n) {
    char *text = NULL, why[256];
    size_t len = 0;
    if (keel_read_regular(path, (size_t)1 << 30, &text, &len, why, sizeof why) != KEEL_OK) {
        keel_errorf("--prompts %s: %s", path, why);
        return KEEL_ERR_INPUT;
    }
    keel_status st = keel_infer_parse_prompts(text, len, path, "prompt", prompts, n);
    keel_free(text);
    return st;
}

int keel_cmd_generate(int argc, char **argv) {
    static const struct option options[] = {
        {"prompt", required_argument, NULL, 'p'}, {"prompts", required_argument, NULL, 'P'},
        {"max-new-tokens", required_argument, NULL, 'n'}, {"temperature", required_argument, NULL, 't'},
        {"top-k", required_argument, NULL, 'k'}, {"top-p", required_argument, NULL, 'q'},
        {"seed", required_argument, NULL, 's'}, {"stop", required_argument, NULL, 'S'},
        {"stop-token", required_argument, NULL, 'T'}, {"ignore-eos", no_argument, NULL, 'e'},
        {"no-bos", no_argument, NULL, 'B'}, {"json", no_argument, NULL, 'j'}, {"bf16", no_argument, NULL, 'b'},
        {"batch", required_argument, NULL, 'c'}, {"threads", required_argument, NULL, 'h' + 256},
        {"tokenizer", required_argument, NULL, 'z'}, {"nproc", required_argument, NULL, 'N'},
        {"help", no_argument, NULL, 'h'}, {0, 0, 0, 0},
    };
    keel_gen_params g = keel_gen_defaults();
    const char *prompt = NULL, *prompts_file = NULL, *tokenizer = NULL, *stops[MAX_STOPS], *stop_tokens[MAX_STOPS];
    int n_stops = 0, n_stop_tokens = 0;
    long long x, threads = 0, nproc = 1;
    bool json = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'p': prompt = optarg; break;
        case 'P': prompts_file = optarg; break;
        case 'n':
            if (!cli_parse_int("--max-new-tokens", optarg, 1, 1 << 24, &x)) return 2;
            g.max_new_tokens = (int)x;
            break;
        case 't':
            if (!cli_parse_double("--temperature", optarg, 0, 1e6, &g.temperature)) return 2;
            break;
        case 'k':
            if (!cli_parse_int("--top-k", optarg, 0, 1 << 30, &x)) return 2;
            g.top_k = (int)x;
            break;
        case 'q':
            if (!cli_parse_double("--top-p", optarg, 0, 1, &g.top_p)) return 2;
            break;
        case 's':
            if (!cli_parse_int("--seed", optarg, 0, (1ll << 62), &x)) return 2;
            g.seed = (uint64_t)x;
            break;
        case 'S':
        case 'T':
            if ((c == 'S' ? n_stops : n_stop_tokens) == MAX_STOPS) {
                keel_errorf("%s: at most %d", c == 'S' ? "--stop" : "--stop-token", MAX_STOPS);
                return 2;
            }
            if (c == 'S') stops[n_stops++] = optarg;
            else stop_tokens[n_stop_tokens++] = optarg;
            break;
        case 'e': g.ignore_eos = true; break;
        case 'B': g.add_bos = false; break;
        case 'j': json = true; break;
        case 'b': g.bf16 = true; break;
        case 'c':
            if (!cli_parse_int("--batch", optarg, 1, 4096, &x)) return 2;
            g.batch = (int)x;
            break;
        case 'h' + 256:
            if (!cli_parse_int("--threads", optarg, 0, 4096, &threads)) return 2;
            break;
        case 'z': tokenizer = optarg; break;
        case 'N':
            if (!cli_parse_int("--nproc", optarg, 1, 256, &nproc)) return 2;
            break;
        case 'h': fputs(USAGE, stdout); return 0;
        default: return 2;
        }
    }
    if (optind != argc - 1 || !prompt == !prompts_file) {
        keel_errorf("usage: keel generate PATH (--prompt TEXT | --prompts FILE.jsonl) [options] (keel generate --help)");
        return 2;
    }
    g.stop = stops, g.n_stop = n_stops;
    if (keel_gen_check(&g) != KEEL_OK) return 2;
    keel_gen_prompt *ps = NULL;
    int n = 0;
    if (prompts_file && read_prompts(prompts_file, &ps, &n) != KEEL_OK) return 2;
    if (prompt) {
        ps = keel_xcalloc(sizeof *ps, "prompts");
        ps[0].text = keel_xstrdup(prompt);
        n = 1;
    }
    keel_infer_model m;
    keel_status st = keel_infer_load(argv[optind], tokenizer, &m);
    bool loaded = st == KEEL_OK;
    int32_t stop_ids[MAX_STOPS];
    for (int i = 0; st == KEEL_OK && i < n_stop_tokens; i++) {
        stop_ids[i] = m.tok ? keel_tokenizer_special_id(m.tok, stop_tokens[i]) : -1;
        if (stop_ids[i] < 0) {
            keel_errorf("--stop-token '%s': unknown stop token, not a special token of the tokenizer%s%s; use --stop "
                        "for text", stop_tokens[i], m.tokenizer_path ? " " : "", m.tokenizer_path ? m.tokenizer_path : "");
            st = KEEL_ERR_INPUT;
        }
    }
    g.stop_ids = stop_ids, g.n_stop_ids = n_stop_tokens;
    if (st == KEEL_OK) {
        int used = nproc > 1 ? keel_infer_split_threads((int)threads, (int)nproc) : keel_kernels_init((int)threads);
        printer p = {.n = n, .json = json};
        p.text = keel_xcalloc(sizeof(char *) * (size_t)n, "printer");
        p.ready = keel_xcalloc(sizeof(size_t) * (size_t)n, "printer");
        p.printed = keel_xcalloc(sizeof(size_t) * (size_t)n, "printer");
        p.done = keel_xcalloc(sizeof(bool) * (size_t)n, "printer");
        p.line = keel_xcalloc(sizeof(cJSON *) * (size_t)n, "printer");
        keel_gen_stats stats;
        if (nproc > 1) {
            split_ctx sc = {.m = &m, .prompts = ps, .n = n, .g = &g, .p = &p};
            st = keel_infer_split((int)nproc, used, share, take_line, &sc);
            stats = sc.stats;
        } else
            st = keel_infer_generate(&m, ps, n, &g, on_update, &p, &stats);
        if (st == KEEL_OK)
            keel_log_info("%s (%s, %lld process(es) x %d thread(s)): %d prompt(s), %lld prompt tokens at %.1f "
                          "tokens/s, %lld new tokens (decode %.1f tokens/s)", m.what, g.bf16 ? "bf16" : "fp32", nproc,
                          used, n,
                          (long long)stats.prompt_tokens,
                          stats.prefill_s > 0 ? (double)stats.prompt_tokens / stats.prefill_s : 0.0,
                          (long long)stats.new_tokens,
                          stats.decode_s > 0 ? (double)stats.decode_tokens / stats.decode_s : 0.0);
        for (int i = 0; i < n; i++) keel_free(p.text[i]), cJSON_Delete(p.line[i]);
        keel_free(p.text), keel_free(p.ready), keel_free(p.printed), keel_free(p.done), keel_free(p.line);
        if (nproc == 1) keel_kernels_shutdown();
    }
    if (loaded) keel_infer_model_free(&m);
    keel_gen_prompts_free(ps, n);
    return keel_status_exit_code(st);
}
