/* infer/completions.h: a request of the OpenAI completions API (POST
 * /v1/completions) as keel serve takes it, parsed from a client's JSON with
 * no HTTP in sight (the fuzz harness tests/fuzz/fuzz_completions.c feeds it
 * anything), and the answers — a completion, an error — as OpenAI writes
 * them. Internal to the infer module: serve.c is its one user.
 *
 *     completion_request r;
 *     const char *param;
 *     if (infer_completion_parse(body, len, &r, &param) != KEEL_OK)
 *         answer 400 with infer_completion_error(keel_last_error(), "invalid_request_error", param);
 */
#ifndef KEEL_INFER_COMPLETIONS_H
#define KEEL_INFER_COMPLETIONS_H

#include "keel/infer.h"

enum {
    COMPLETION_MAX_PROMPTS = 4096,  /* prompts in one request */
    COMPLETION_MAX_STOPS = 16,      /* stop strings */
    COMPLETION_MAX_STOP_BYTES = 1024,
    COMPLETION_MAX_LOGPROBS = 5,    /* alternatives a token's log-probability may come with, as OpenAI's */
    COMPLETION_MAX_TOKENS = 1 << 24,
    COMPLETION_DEFAULT_MAX_TOKENS = 16,
};

/* What a request asks for. Prompts are text (NUL-ended; text_len its bytes)
 * or token ids (checked against the model's vocabulary later, by serve.c). */
typedef struct {
    char *model;              /* as sent, or NULL */
    keel_gen_prompt *prompts; /* (n_prompts) */
    int n_prompts;
    int max_tokens;           /* 0 only with echo */
    double temperature;       /* >= 0; default 1, as OpenAI's */
    double top_p;             /* (0, 1]; default 1 */
    int top_k;                /* 0: off (vLLM's extension; -1 is read as 0) */
    bool has_seed;
    uint64_t seed;
    char **stop;              /* (n_stop) non-empty strings */
    int n_stop;
    int logprobs;             /* -1: none; else the alternatives each token comes with, 0 to COMPLETION_MAX_LOGPROBS */
    bool echo;                /* the prompt's tokens come first, in text and in logprobs */
    bool ignore_eos;          /* vLLM's extension: go on past EOS */
} completion_request;

/* body[0, len): a completions request, a JSON object. KEEL_OK with *req
 * filled (free with infer_completion_free), or KEEL_ERR_INPUT with one line
 * (keel_errorf) naming the field and what it must be, *param that field's
 * name ("" for the body as a whole) and *req empty. Unknown fields are
 * ignored; fields keel does not do (n or best_of other than 1, stream,
 * suffix, penalties, logit_bias) are refused by name. */
keel_status infer_completion_parse(const char *body, size_t len, completion_request *req, const char **param);
void infer_completion_free(completion_request *req);
/* Whether two requests can share a batch: the same decoding (max_tokens,
 * temperature, top_p, top_k, stop strings, logprobs, ignore_eos). */
bool infer_completion_compatible(const completion_request *a, const completion_request *b);

/* One prompt's answer, for infer_completion_answer. */
typedef struct {
    char *text;                /* echo: the prompt's text, then the completion's */
    size_t len;
    size_t prompt_len;         /* bytes of text that are the prompt's (0 without echo) */
    const char *finish_reason; /* "stop" or "length" */
    int prompt_tokens, completion_tokens;
    /* With logprobs (>= 0): the tokens reported (echo: the prompt's, then the
     * new ones, the stop token included), each one's log-probability (NAN:
     * none, the first token of an echoed prompt) and k = logprobs
     * alternatives (ids -1 past the vocabulary). */
    int32_t *tokens;
    int n_tokens;
    double *logprob;           /* (n_tokens) */
    int32_t *top_id;           /* (n_tokens × k) */
    double *top_logprob;
    int added_tokens;          /* the first tokens are not in text (the BOS keel put before a text prompt) */
} completion_choice;
void infer_completion_choice_free(completion_choice *c);

/* The answer as OpenAI's text_completion object: {"id", "object",
 * "created", "model", "choices": [{"index", "text", "logprobs" (null without
 * logprobs; else tokens, token_logprobs, top_logprobs, text_offset — token
 * strings decoded one token at a time by tok), "finish_reason"}], "usage"}.
 * A new string (free). */
char *infer_completion_answer(const completion_request *req, const completion_choice *choices,
                              const keel_tokenizer *tok, const char *id, long long created, const char *model);
/* {"error": {"message", "type", "param" (null when empty or NULL), "code": null}}: a new string (free). */
char *infer_completion_error(const char *message, const char *type, const char *param);

/* Run n requests that infer_completion_compatible says decode alike on m
 * (completions_run.c): each prompt's ids checked against the vocabulary and
 * the context (never cut), every prompt generated in one keel_infer_generate
 * call (o->batch at once, o->bf16), the echoed ones scored in one
 * keel_infer_score call. Request i's answer in status[i] (200, 400 when one
 * of its prompts does not fit — the others still run —, 500) and answer[i]
 * (a new JSON string: free). A request without a seed samples from
 * (seed + i). Errors go through keel_errorf: capture them. */
void infer_completions_run(keel_infer_model *m, completion_request *const *reqs, int n, const keel_serve_options *o,
                           uint64_t seed, const char *id_prefix, unsigned *status, char **answer);

#endif
