/* infer: using a trained model — a model from any path keel writes or reads
 * (a run, a checkpoint, a Hugging Face directory) with its tokenizer and stop
 * tokens, and generation: prompts batched on a KV cache (keel/model.h's
 * keel_decoder), sampled by temperature, top-k and top-p from a seed, stopped
 * by EOS, stop tokens, stop strings or a length; scoring and evaluation
 * (keel eval); and serving it over the OpenAI completions API (keel serve).
 *
 *     keel_infer_model m;
 *     if (keel_infer_load("runs/x", NULL, &m) != KEEL_OK) return 2;   // one line said why
 *     keel_gen_params g = keel_gen_defaults();
 *     keel_gen_prompt p = {.text = "Once upon a time"};
 *     keel_infer_generate(&m, &p, 1, &g, on_text, ctx);              // streams through on_text
 *     keel_infer_model_free(&m);
 */
#ifndef KEEL_INFER_H
#define KEEL_INFER_H

#include <stdio.h>

#include "keel/core.h"
#include "keel/hf.h"
#include "keel/tokenizer.h"

typedef struct {
    keel_config cfg;             /* the model's config (a run's or a checkpoint's; defaults around an HF model) */
    float *params;               /* canonical fp32 parameters (keel_free) */
    keel_tokenizer *tok;         /* NULL when none was found or given */
    char *tokenizer_path;        /* where tok came from (keel_free), or NULL */
    int bos;                     /* prepended to a prompt's ids; -1: none */
    int32_t eos[KEEL_HF_MAX_EOS]; /* generation stops at these: generation_config.json's, else the tokenizer's */
    int n_eos;
    char what[4400];             /* "checkpoint runs/x/ckpt/step-00000100 (step 100)", for messages */
} keel_infer_model;

/* A model from path: a run directory's final weights (RUN/weights.bin), else
 * a Hugging Face LlamaForCausalLM directory (config.json + safetensors),
 * else a checkpoint or a run's newest good checkpoint (every file verified).
 * The tokenizer: `tokenizer` when given, else the HF directory's
 * tokenizer.json or tokenizer.model, else keel_ckpt_find_tokenizer's (the
 * checkpoint's carried copy, data.tokenizer, init_from's); none found is not
 * an error here (generate from token ids needs none). Its vocabulary must fit
 * the model's. Stop ids: generation_config.json's eos_token_id (the HF
 * directory's or the carried one), else the tokenizer's EOS. One line and
 * KEEL_ERR_INPUT (or KEEL_ERR_IO) on any problem, *out then empty. */
keel_status keel_infer_load(const char *path, const char *tokenizer, keel_infer_model *out);
void keel_infer_model_free(keel_infer_model *m);

/* How to generate. temperature 0 is greedy (the highest logit; the lowest
 * id on a tie, as torch.argmax); above 0 the logits are divided by it, cut to
 * the top_k largest (0: all) and then to the smallest set of the most likely
 * whose probability reaches top_p (1: all), and one is drawn. Prompt i draws
 * from its own generator seeded by (seed, i): the same seed and prompts give
 * the same samples however prompts are batched, on any thread count. */
typedef struct {
    int max_new_tokens;     /* default 128 */
    double temperature;     /* >= 0; default 0 (greedy) */
    int top_k;              /* >= 0; default 0 (off) */
    double top_p;           /* (0, 1]; default 1 (off) */
    uint64_t seed;          /* default 0 */
    const char *const *stop; /* generation stops before any of these strings (not printed) */
    int n_stop;
    const int32_t *stop_ids; /* and at these tokens, besides the model's EOS (not printed) */
    int n_stop_ids;
    bool ignore_eos;        /* generate max_new_tokens whatever comes */
    bool bf16;              /* bf16 GEMMs (weights in bf16): half the weight bytes a token reads */
    int batch;              /* prompts decoded together (KV cache slots); default 8 */
    int prefill_rows;       /* prompt tokens a step takes; default 512 */
    bool add_bos;           /* prepend the model's BOS to each prompt; default true */
    bool logprobs;          /* each new token's log-probability in keel_gen_update (off by default) */
    int top_logprobs;       /* and the log-probabilities of this many most likely tokens, 0 to KEEL_MAX_TOP_LOGPROBS */
} keel_gen_params;
/* The most alternatives a token's log-probability comes with (generation's
 * top_logprobs, scoring's n_top). */
#define KEEL_MAX_TOP_LOGPROBS 20
keel_gen_params keel_gen_defaults(void);

/* One prompt: text (encoded with the model's tokenizer, BOS prepended per
 * add_bos), or ids[0, n_ids) as they are (no BOS added) when text is NULL.
 * It samples from a generator seeded by (g->seed, its index in the call),
 * or with `seeded` by (seed, seed_index): a server that batches the prompts
 * of requests with seeds of their own gives each its request's. */
typedef struct {
    const char *text;
    size_t text_len; /* 0: strlen(text) */
    const int32_t *ids;
    int n_ids;
    bool seeded;
    uint64_t seed;
    int seed_index;
} keel_gen_prompt;

/* What a prompt has generated so far: text (decoded, stop strings cut) and
 * its ids; done with finish_reason "stop" (EOS, a stop token or string) or
 * "length" (max_new_tokens, or the model's context). `ready` bytes of text
 * are final (the rest could still become a stop string or the start of a
 * character still being decoded). */
typedef struct {
    int prompt;
    const char *text;
    size_t len, ready;
    const int32_t *ids;
    int n_ids;
    int prompt_tokens;
    bool done;
    const char *finish_reason;
    int32_t stop_id;             /* the token that stopped it (EOS or a stop id: not in ids), else -1 */
    /* With g->logprobs: each new token's log-probability under the model
     * (the log-softmax of its logits, before temperature, top-k and top-p),
     * n_ids of them and one more for stop_id when there is one; with k =
     * g->top_logprobs, top_ids[t * k + j] and top_logprobs[t * k + j] are
     * the j-th most likely token at new token t and its log-probability (the
     * lowest id first on a tie). NULL without g->logprobs. */
    const double *logprobs;
    const int32_t *top_ids;
    const double *top_logprobs;
} keel_gen_update;
typedef void (*keel_gen_fn)(void *ctx, const keel_gen_update *u);

/* Totals of a generate call, for speed reports. */
typedef struct {
    int64_t prompt_tokens, new_tokens; /* prompts' tokens run, tokens generated */
    int64_t decode_tokens;             /* of those, the ones decode steps made (not a prefill's first) */
    double prefill_s, decode_s;        /* seconds in prefill steps and in decode steps */
} keel_gen_stats;

/* Generate for n prompts, calling fn after every token of a prompt and once
 * more with done (in no fixed order across prompts). A prompt that does not
 * fit the model's context with room for one token, text without a
 * tokenizer, an id outside the vocabulary: one line naming the prompt,
 * KEEL_ERR_INPUT, before anything is generated. params are checked the same
 * way (keel_gen_check). */
keel_status keel_infer_generate(keel_infer_model *m, const keel_gen_prompt *prompts, int n, const keel_gen_params *g,
                                keel_gen_fn fn, void *ctx, keel_gen_stats *stats);
/* The params' ranges, one line naming the first that is out (--temperature,
 * --top-p, ...). */
keel_status keel_gen_check(const keel_gen_params *g);

/* Scoring: the log-likelihood of every token of a sequence from `from` on,
 * each given the tokens before it — what multiple-choice evaluation,
 * perplexity and a server's echoed logprobs need. */
typedef struct {
    const int32_t *ids;   /* the whole sequence (context, then what is scored) */
    int n;                /* 2 <= n <= model.max_seq_len + 1 */
    int from;             /* 1 <= from < n: tokens from..n-1 are scored */
    double *logprob;      /* (n - from) log p(ids[t] | ids[0..t-1]) */
    int32_t *top_id;      /* (n - from) × k or NULL: the k most likely tokens at t, most likely first (lowest id on a tie) */
    double *top_logprob;  /* (n - from) × k or NULL: their log-probabilities */
    int n_top;            /* k, 0 to KEEL_MAX_TOP_LOGPROBS (0 counts as 1); above 1 both arrays are needed */
} keel_score_request;
/* Score n requests, batched on the decoder: up to g->batch sequences share a
 * step of up to g->prefill_rows tokens; g->bf16 as for generation (the
 * other params are not used). Log-softmax in double over fp32 logits. A
 * request out of range (ids outside the vocabulary, longer than the
 * context): one line naming it, KEEL_ERR_INPUT, before anything runs. */
keel_status keel_infer_score(keel_infer_model *m, keel_score_request *r, int n, const keel_gen_params *g);

/* ---- evaluation ------------------------------------------------------------ */

/* A multiple-choice question: the context, its choices, the right one. */
typedef struct {
    char *context;
    char **choices;
    int n_choices;
    int answer;
} keel_task_item;
/* A task file's text[0, len) (name stands for it): JSON Lines, each
 * non-blank line {"context": string, "choices": [at least one string],
 * "answer": index into choices}; other keys are ignored. One line naming the
 * file, line and field on anything else, KEEL_ERR_INPUT. The fuzz harness's
 * entry (tests/fuzz/fuzz_task.c). */
keel_status keel_infer_parse_task(const char *text, size_t len, const char *name, keel_task_item **items, int *n);
void keel_task_items_free(keel_task_item *items, int n);

/* What a multiple-choice evaluation scores, as lm-evaluation-harness does:
 * each choice's log-likelihood as the continuation of its context (the
 * context's trailing whitespace moved onto the continuation, which is
 * delimiter + choice; ids of the continuation = ids(context + continuation)
 * past ids(context); BOS first when the model has one). acc: the highest
 * log-likelihood is the answer; acc_norm: the highest log-likelihood per
 * byte of the choice (UTF-8; lm-eval divides by characters, the same for
 * ASCII). Standard errors of the mean, as lm-eval's. */
typedef struct {
    int n;
    double acc, acc_stderr, acc_norm, acc_norm_stderr;
} keel_task_result;
/* One scored question, for a --samples file: per choice its log-likelihood
 * and whether every continuation token was the most likely one. */
typedef struct {
    int item;
    const double *loglik;
    const bool *greedy;
    int n_choices, pred, pred_norm;
} keel_task_sample;
typedef void (*keel_task_sample_fn)(void *ctx, const keel_task_sample *s);
keel_status keel_infer_eval_task(keel_infer_model *m, const keel_task_item *items, int n, const char *delimiter,
                                 const keel_gen_params *g, keel_task_result *res, keel_task_sample_fn fn,
                                 void *ctx);
/* The result from each question's predictions (pred: by log-likelihood,
 * pred_norm: per byte): what keel_infer_eval_task reports, for the shares of
 * an --nproc split put back together. */
void keel_task_summarize(const keel_task_item *items, int n, const int *pred, const int *pred_norm,
                         keel_task_result *res);

/* Perplexity over documents, as lm-eval's loglikelihood_rolling: a
 * document's ids after BOS (after its first id when the model has no BOS)
 * are scored in windows of the context's length, every one once, each
 * window given the context's length of ids before its last. */
typedef struct {
    int64_t docs, tokens, bytes, words; /* words: runs of non-space bytes */
    double loglik;                      /* summed, natural log */
    double token_perplexity, byte_perplexity, word_perplexity, bits_per_byte;
} keel_ppl_result;
/* Sets res's sums (docs, tokens, bytes, words, loglik); keel_ppl_finish
 * then gives the rest. */
keel_status keel_infer_eval_text(keel_infer_model *m, const char *const *docs, int n, const keel_gen_params *g,
                                 keel_ppl_result *res);
/* The perplexities and bits per byte from res's sums (summed over the shares
 * of an --nproc split); no tokens at all: one line, KEEL_ERR_INPUT. */
keel_status keel_ppl_finish(keel_ppl_result *res);

/* ---- work split over processes (--nproc) ------------------------------------ */

/* One process's share: rank of nproc (it takes items rank, rank + nproc,
 * ...), writing its results as JSON lines to out. */
typedef keel_status (*keel_split_work)(void *ctx, int rank, int nproc, FILE *out);
/* Run work in nproc processes on this machine, forked after the model is
 * loaded (they share its memory), each with keel_infer_split_threads(threads,
 * nproc) kernel threads (the caller must not have started its own); on_line
 * gets every line any of them writes, in the parent, as it comes. KEEL_OK
 * when every process exited 0; else the first failure (exit 2:
 * KEEL_ERR_INPUT), having said why. */
keel_status keel_infer_split(int nproc, int threads, keel_split_work work, void (*on_line)(void *ctx, const char *line),
                             void *ctx);
/* Kernel threads per process: threads when given (> 0), else the cores this
 * process may use shared among nproc (at least 1; nproc 1: 0, every core). */
int keel_infer_split_threads(int threads, int nproc);

/* A prompts file's text[0, len) (name stands for it in messages): JSON Lines,
 * each non-blank line an object whose `key` ("prompt"; "text" for eval's
 * documents) is a string or a list of token ids (used as they are: no BOS
 * added). *prompts (n of them; free
 * with keel_gen_prompts_free) on success; one line naming the file, line and
 * what is wrong, KEEL_ERR_INPUT, otherwise. The fuzz harness's entry
 * (tests/fuzz/fuzz_prompts.c). */
keel_status keel_infer_parse_prompts(const char *text, size_t len, const char *name, const char *key,
                                     keel_gen_prompt **prompts, int *n);
void keel_gen_prompts_free(keel_gen_prompt *prompts, int n);
/* A JSON list of token ids as a prompt's ids (each an integer in [0,
 * INT32_MAX], at least one, at most 2^24; the vocabulary is checked later,
 * against the model): what the prompts file and keel serve's requests take.
 * false, and *p untouched, otherwise. */
bool keel_gen_prompt_ids(const struct cJSON *list, keel_gen_prompt *p);

/* ---- serving ------------------------------------------------------------------ */

/* keel serve: the OpenAI completions API over HTTP for one model — POST
 * /v1/completions (the subset lm-evaluation-harness's local-completions
 * uses: prompts as text or token ids, max_tokens, temperature, top_p, seed,
 * stop, logprobs, echo), GET /v1/models, GET /health. Requests wait in a
 * bounded queue; one worker thread runs those that decode alike together
 * (docs/inference.md, "keel serve"). */
typedef struct {
    const char *host;       /* a numeric IP address to bind; NULL: 127.0.0.1 */
    int port;               /* 0: a free one */
    int batch;              /* prompts run together (KV-cache slots) */
    int queue;              /* requests that may wait beyond the batch running; more are answered 503 */
    bool bf16;              /* as keel_gen_params.bf16 */
    const char *model_name; /* what /v1/models and the answers call the model */
} keel_serve_options;
typedef struct keel_server keel_server;
/* Serve m (which must have a tokenizer, and outlives the server) on its own
 * threads: the HTTP one and the worker, with keel_kernels_init done. One
 * line and KEEL_ERR_INPUT when the address cannot be bound or the model has
 * no tokenizer. Stop with keel_serve_stop. */
keel_status keel_serve_start(keel_infer_model *m, const keel_serve_options *o, keel_server **out);
/* "http://127.0.0.1:PORT/v1": the base URL an OpenAI client takes (the port bound). */
const char *keel_serve_url(const keel_server *s);
/* Stop taking requests (503), answer those still queued 503, finish the
 * batch running and deliver its answers (5 s at most), then close: every
 * thread joined, everything freed. */
void keel_serve_stop(keel_server *s);

#endif
