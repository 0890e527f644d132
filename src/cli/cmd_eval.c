/* cli/cmd_eval.c: `keel eval PATH` — the loss over token shards (--data),
 * multiple-choice accuracy (--task FILE.jsonl), or perplexity and bits per
 * byte over documents (--text FILE): a table, then one JSON line. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/infer.h"
#include "keel/train.h"

static const char USAGE[] =
    "usage: keel eval PATH (--data DATA | --task FILE.jsonl | --text FILE) [options]\n"
    "  PATH               a run directory (its final weights, else its newest good checkpoint), a checkpoint,\n"
    "                     or (with --task and --text) a Hugging Face LlamaForCausalLM directory\n"
    "  --data DATA        mean loss over token shards: a directory from `keel data prepare` (its val split if\n"
    "                     present) or one shard file; prints {\"loss\", \"tokens\"}\n"
    "  --task FILE.jsonl  multiple choice, one {\"context\", \"choices\": [...], \"answer\": i} per line, scored by\n"
    "                     log-likelihood as lm-evaluation-harness does: acc and acc_norm (per byte of the choice)\n"
    "  --text FILE        perplexity and bits per byte: FILE.jsonl holds one {\"text\"} document per line, any\n"
    "                     other FILE is one document\n"
    "  --delimiter S      between a context and each choice (\" \", as lm-eval's target_delimiter)\n"
    "  --samples FILE     --task: each question's per-choice log-likelihoods as JSON Lines\n"
    "  --json             the JSON line only\n"
    "  --bf16             bf16 weights and GEMMs\n"
    "  --batch N          sequences scored together (8)\n"
    "  --threads N        threads (0: every core, the default; with --nproc, per process: the cores shared)\n"
    "  --nproc N          --task, --text: N processes on this machine, each scoring every Nth question or document\n"
    "  --tokenizer FILE   tokenizer.json or .model, instead of the model's own\n";

static keel_status read_input(const char *flag, const char *path, char **text, size_t *len) {
    char why[256];
    if (keel_read_regular(path, (size_t)1 << 31, text, len, why, sizeof why) == KEEL_OK) return KEEL_OK;
    keel_errorf("%s %s: %s", flag, path, why);
    return KEEL_ERR_INPUT;
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

static void print_line(cJSON *o) {
    char *line = cJSON_PrintUnformatted(o);
    printf("%s\n", line);
    cJSON_free(line);
    cJSON_Delete(o);
}

/* ---- --task: the questions split over processes, put back together ---------- */

typedef struct {
    keel_infer_model *m;
    const keel_task_item *items;
    int n;
    const char *delimiter;
    const keel_gen_params *g;
    FILE *out;          /* a share's pipe */
    const int *global;  /* a share's question k is question global[k] */
    int *pred, *pred_norm, got; /* the parent's: every question's predictions */
    char **lines;       /* the parent's: every question's --samples line, or NULL */
} task_ctx;

static void send_sample(void *ctx, const keel_task_sample *s) {
    task_ctx *c = ctx;
    int item = c->global[s->item];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "item", item);
    cJSON_AddNumberToObject(o, "answer", c->items[item].answer);
    cJSON_AddNumberToObject(o, "pred", s->pred);
    cJSON_AddNumberToObject(o, "pred_norm", s->pred_norm);
    cJSON *ll = cJSON_AddArrayToObject(o, "loglik"), *gr = cJSON_AddArrayToObject(o, "greedy");
    for (int i = 0; i < s->n_choices; i++) {
        cJSON_AddItemToArray(ll, cJSON_CreateNumber(s->loglik[i]));
        cJSON_AddItemToArray(gr, cJSON_CreateBool(s->greedy[i]));
    }
    char *line = cJSON_PrintUnformatted(o);
    fprintf(c->out, "%s\n", line);
    cJSON_free(line);
    cJSON_Delete(o);
}

static keel_status task_share(void *ctx, int rank, int nproc, FILE *out) {
    task_ctx *c = ctx;
    int k = 0, *global = keel_xmalloc(sizeof(int) * (size_t)(c->n / nproc + 1), "share");
    keel_task_item *mine = keel_xmalloc(sizeof *mine * (size_t)(c->n / nproc + 1), "share");
    for (int i = rank; i < c->n; i += nproc) global[k] = i, mine[k++] = c->items[i];
    c->out = out, c->global = global;
    keel_task_result r;
    keel_status st = k ? keel_infer_eval_task(c->m, mine, k, c->delimiter, c->g, &r, send_sample, c) : KEEL_OK;
    keel_free(global);
    keel_free(mine);
    return st;
}

static void take_sample(void *ctx, const char *line) {
    task_ctx *c = ctx;
    cJSON *o = cJSON_Parse(line);
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(o, "item");
    int i = cJSON_IsNumber(item) ? item->valueint : -1;
    if (i >= 0 && i < c->n) {
        c->pred[i] = cJSON_GetObjectItemCaseSensitive(o, "pred")->valueint;
        c->pred_norm[i] = cJSON_GetObjectItemCaseSensitive(o, "pred_norm")->valueint;
        c->got++;
        if (c->lines) c->lines[i] = keel_xstrdup(line);
    }
    cJSON_Delete(o);
}

static keel_status eval_task(keel_infer_model *m, const char *path, const char *delimiter, const char *samples,
                             const keel_gen_params *g, bool json, int nproc, int threads) {
    char *text;
    size_t len;
    keel_task_item *items;
    int n;
    keel_status st = read_input("--task", path, &text, &len);
    if (st != KEEL_OK) return st;
    st = keel_infer_parse_task(text, len, path, &items, &n);
    keel_free(text);
    if (st != KEEL_OK) return st;
    FILE *out = NULL;
    if (samples && !(out = fopen(samples, "w"))) {
        keel_errorf("--samples %s: cannot write it", samples);
        keel_task_items_free(items, n);
        return KEEL_ERR_INPUT;
    }
    task_ctx c = {.m = m, .items = items, .n = n, .delimiter = delimiter, .g = g};
    c.pred = keel_xcalloc(sizeof(int) * (size_t)n * 2, "predictions"), c.pred_norm = c.pred + n;
    if (out) c.lines = keel_xcalloc(sizeof(char *) * (size_t)n, "samples");
    st = keel_infer_split(nproc, threads, task_share, take_sample, &c);
    if (st == KEEL_OK && c.got != n) {
        keel_errorf("--task %s: %d of %d questions came back from the processes", path, c.got, n);
        st = KEEL_ERR_IO;
    }
    keel_task_result r;
    if (st == KEEL_OK) keel_task_summarize(items, n, c.pred, c.pred_norm, &r);
    for (int i = 0; out && i < n; i++) {
        if (st == KEEL_OK) fprintf(out, "%s\n", c.lines[i]);
        keel_free(c.lines[i]);
    }
    if (out && fclose(out) != 0 && st == KEEL_OK) {
        keel_errorf("--samples %s: writing failed", samples);
        st = KEEL_ERR_IO;
    }
    keel_free(c.lines);
    keel_free(c.pred);
    keel_task_items_free(items, n);
    if (st != KEEL_OK) return st;
    if (!json)
        printf("%-24s %8s %8s %8s %9s %8s\n%-24.24s %8d %8.4f %8.4f %9.4f %8.4f\n", "task", "samples", "acc", "stderr",
               "acc_norm", "stderr", path, r.n, r.acc, r.acc_stderr, r.acc_norm, r.acc_norm_stderr);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "task", path);
    cJSON_AddNumberToObject(o, "samples", r.n);
    cJSON_AddNumberToObject(o, "acc", r.acc);
    cJSON_AddNumberToObject(o, "acc_stderr", r.acc_stderr);
    cJSON_AddNumberToObject(o, "acc_norm", r.acc_norm);
    cJSON_AddNumberToObject(o, "acc_norm_stderr", r.acc_norm_stderr);
    print_line(o);
    return KEEL_OK;
}

/* ---- --text: the documents split over processes, their sums added ---------- */

typedef struct {
    keel_infer_model *m;
    const char *const *docs;
    int n;
    const keel_gen_params *g;
    keel_ppl_result sum; /* the parent's */
} text_ctx;

static keel_status text_share(void *ctx, int rank, int nproc, FILE *out) {
    text_ctx *c = ctx;
    int k = 0;
    const char **mine = keel_xmalloc(sizeof(char *) * (size_t)(c->n / nproc + 1), "share");
    for (int i = rank; i < c->n; i += nproc) mine[k++] = c->docs[i];
    keel_ppl_result r = {0};
    keel_status st = k ? keel_infer_eval_text(c->m, mine, k, c->g, &r) : KEEL_OK;
    if (st == KEEL_OK)
        fprintf(out, "[%lld, %lld, %lld, %lld, %.17g]\n", (long long)r.docs, (long long)r.tokens, (long long)r.bytes,
                (long long)r.words, r.loglik);
    keel_free(mine);
    return st;
}

static void take_sums(void *ctx, const char *line) {
    text_ctx *c = ctx;
    cJSON *a = cJSON_Parse(line);
    if (cJSON_GetArraySize(a) == 5) {
        c->sum.docs += (int64_t)cJSON_GetArrayItem(a, 0)->valuedouble;
        c->sum.tokens += (int64_t)cJSON_GetArrayItem(a, 1)->valuedouble;
        c->sum.bytes += (int64_t)cJSON_GetArrayItem(a, 2)->valuedouble;
        c->sum.words += (int64_t)cJSON_GetArrayItem(a, 3)->valuedouble;
        c->sum.loglik += cJSON_GetArrayItem(a, 4)->valuedouble;
    }
    cJSON_Delete(a);
}

static keel_status eval_text(keel_infer_model *m, const char *path, const keel_gen_params *g, bool json, int nproc,
                             int threads) {
    char *text;
    size_t len;
    keel_status st = read_input("--text", path, &text, &len);
    if (st != KEEL_OK) return st;
    keel_gen_prompt *docs = NULL;
    int n = 0;
    if (ends_with(path, ".jsonl") || ends_with(path, ".json")) st = keel_infer_parse_prompts(text, len, path, "text", &docs, &n);
    else if (memchr(text, '\0', len)) {
        keel_errorf("--text %s: holds a NUL byte; give text, or JSON Lines of {\"text\"} named .jsonl", path);
        st = KEEL_ERR_INPUT;
    } else {
        docs = keel_xcalloc(sizeof *docs, "documents");
        docs[0].text = text, n = 1, text = NULL;
    }
    keel_free(text);
    const char **texts = keel_xcalloc(sizeof(char *) * (size_t)(n > 0 ? n : 1), "documents");
    for (int i = 0; i < n && st == KEEL_OK; i++)
        if (!(texts[i] = docs[i].text)) {
            keel_errorf("--text %s: document %d is token ids; give text (bytes are what bits per byte count)", path, i + 1);
            st = KEEL_ERR_INPUT;
        }
    text_ctx c = {.m = m, .docs = texts, .n = n, .g = g};
    if (st == KEEL_OK) st = keel_infer_split(nproc, threads, text_share, take_sums, &c);
    if (st == KEEL_OK && c.sum.docs != n) {
        keel_errorf("--text %s: %lld of %d documents came back from the processes", path, (long long)c.sum.docs, n);
        st = KEEL_ERR_IO;
    }
    keel_ppl_result r = c.sum;
    if (st == KEEL_OK) st = keel_ppl_finish(&r);
    keel_free(texts);
    keel_gen_prompts_free(docs, n);
    if (st != KEEL_OK) return st;
    if (!json)
        printf("%-24s %6s %9s %10s %10s %10s %8s\n%-24.24s %6lld %9lld %10.4f %10.4f %10.4f %8.4f\n", "text", "docs",
               "tokens", "token_ppl", "word_ppl", "byte_ppl", "bpb", path, (long long)r.docs, (long long)r.tokens,
               r.token_perplexity, r.word_perplexity, r.byte_perplexity, r.bits_per_byte);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "text", path);
    cJSON_AddNumberToObject(o, "documents", (double)r.docs);
    cJSON_AddNumberToObject(o, "tokens", (double)r.tokens);
    cJSON_AddNumberToObject(o, "bytes", (double)r.bytes);
    cJSON_AddNumberToObject(o, "words", (double)r.words);
    cJSON_AddNumberToObject(o, "loglikelihood", r.loglik);
    cJSON_AddNumberToObject(o, "token_perplexity", r.token_perplexity);
    cJSON_AddNumberToObject(o, "word_perplexity", r.word_perplexity);
    cJSON_AddNumberToObject(o, "byte_perplexity", r.byte_perplexity);
    cJSON_AddNumberToObject(o, "bits_per_byte", r.bits_per_byte);
    print_line(o);
    return KEEL_OK;
}

int keel_cmd_eval(int argc, char **argv) {
    static const struct option options[] = {
        {"data", required_argument, NULL, 'd'}, {"task", required_argument, NULL, 'k'},
        {"text", required_argument, NULL, 'x'}, {"delimiter", required_argument, NULL, 'D'},
        {"samples", required_argument, NULL, 's'}, {"json", no_argument, NULL, 'j'},
        {"bf16", no_argument, NULL, 'b'}, {"batch", required_argument, NULL, 'c'},
        {"threads", required_argument, NULL, 'T'}, {"tokenizer", required_argument, NULL, 'z'},
        {"nproc", required_argument, NULL, 'N'}, {"help", no_argument, NULL, 'h'}, {0, 0, 0, 0},
    };
    const char *data = NULL, *task = NULL, *text = NULL, *delimiter = " ", *samples = NULL, *tokenizer = NULL;
    keel_gen_params g = keel_gen_defaults();
    bool json = false;
    long long x, threads = 0, nproc = 1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'd': data = optarg; break;
        case 'k': task = optarg; break;
        case 'x': text = optarg; break;
        case 'D': delimiter = optarg; break;
        case 's': samples = optarg; break;
        case 'j': json = true; break;
        case 'b': g.bf16 = true; break;
        case 'c':
            if (!cli_parse_int("--batch", optarg, 1, 4096, &x)) return 2;
            g.batch = (int)x;
            break;
        case 'T':
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
    if (optind != argc - 1 || (!!data + !!task + !!text) != 1) {
        keel_errorf("usage: keel eval PATH (--data DATA | --task FILE.jsonl | --text FILE) (see keel eval --help)");
        return 2;
    }
    if (data) {
        double loss;
        uint64_t tokens;
        keel_status st = keel_eval_run(argv[optind], data, &loss, &tokens);
        if (st != KEEL_OK) return keel_status_exit_code(st);
        printf("{\"loss\": %.6f, \"tokens\": %llu}\n", loss, (unsigned long long)tokens);
        return 0;
    }
    keel_infer_model m;
    keel_status st = keel_infer_load(argv[optind], tokenizer, &m);
    if (st != KEEL_OK) return keel_status_exit_code(st);
    st = task ? eval_task(&m, task, delimiter, samples, &g, json, (int)nproc, (int)threads)
              : eval_text(&m, text, &g, json, (int)nproc, (int)threads);
    keel_infer_model_free(&m);
    return keel_status_exit_code(st);
}
