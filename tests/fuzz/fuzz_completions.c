/* tests/fuzz/fuzz_completions.c: a keel serve request body — POST
 * /v1/completions JSON from any client (infer_completion_parse,
 * src/infer/completions.c) — the input, in a buffer of exactly its size.
 * Success must give 1 to COMPLETION_MAX_PROMPTS prompts, each text or ids
 * >= 0 (never both, never neither), and every field in its range; a failure
 * gives an empty request, the field's name (or "") and one error line. The
 * answer written for what was accepted (each prompt's bytes as its text,
 * whatever they are) and the error written for what was refused must be
 * JSON that parses back, its strings well-formed UTF-8. */
#include <cjson/cJSON.h>
#include <math.h>

#include "infer/completions.h"

#include "fuzz.h"

/* Whether s[0, n) is well-formed UTF-8 without NUL. */
static bool utf8_ok(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        size_t k = c >= 0x01 && c <= 0x7F ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                   : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!k || i + k > n) return false;
        unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        if (k > 1 && (u[i + 1] < lo || u[i + 1] > hi)) return false;
        for (size_t j = 2; j < k; j++)
            if (u[i + j] < 0x80 || u[i + j] > 0xBF) return false;
        i += k;
    }
    return true;
}

/* Every string in j is well-formed UTF-8 (cJSON keeps the bytes of a parsed string). */
static void check_strings(const cJSON *j) {
    for (; j; j = j->next) {
        if (cJSON_IsString(j) && !utf8_ok(j->valuestring, strlen(j->valuestring))) abort();
        if (j->string && !utf8_ok(j->string, strlen(j->string))) abort();
        check_strings(j->child);
    }
}

static void check_json(char *text) {
    if (!text) abort();
    cJSON *j = cJSON_Parse(text);
    if (!j) abort();
    check_strings(j);
    cJSON_Delete(j);
    free(text);
}

static void check_request(const completion_request *r) {
    if (r->n_prompts < 1 || r->n_prompts > COMPLETION_MAX_PROMPTS || !r->prompts) abort();
    for (int i = 0; i < r->n_prompts; i++) {
        const keel_gen_prompt *p = &r->prompts[i];
        if (!p->text == !p->ids) abort();
        if (p->text && p->text_len != strlen(p->text)) abort();
        if (p->ids && p->n_ids < 1) abort();
        for (int j = 0; p->ids && j < p->n_ids; j++)
            if (p->ids[j] < 0) abort();
    }
    if (r->max_tokens < 0 || r->max_tokens > COMPLETION_MAX_TOKENS || (r->max_tokens == 0 && !r->echo)) abort();
    if (!(r->temperature >= 0 && r->temperature <= 1e6) || !(r->top_p > 0 && r->top_p <= 1) || r->top_k < 0) abort();
    if (r->logprobs < -1 || r->logprobs > COMPLETION_MAX_LOGPROBS) abort();
    if (r->n_stop < 0 || r->n_stop > COMPLETION_MAX_STOPS) abort();
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i][0] || strlen(r->stop[i]) > COMPLETION_MAX_STOP_BYTES) abort();
    if (!infer_completion_compatible(r, r)) abort();
}

/* The answer for r, each choice's text the prompt's bytes (ids as bytes): JSON that parses back. */
static void check_answer(const completion_request *r) {
    completion_choice *c = calloc((size_t)r->n_prompts, sizeof *c);
    if (!c) abort();
    for (int i = 0; i < r->n_prompts; i++) {
        const keel_gen_prompt *p = &r->prompts[i];
        size_t n = p->text ? p->text_len : (size_t)p->n_ids;
        c[i].text = malloc(n + 1);
        if (!c[i].text) abort();
        for (size_t b = 0; b < n; b++) c[i].text[b] = p->text ? p->text[b] : (char)(unsigned char)(p->ids[b] & 0xFF);
        c[i].text[n] = 0;
        c[i].len = n;
        c[i].finish_reason = i % 2 ? "stop" : "length";
    }
    check_json(infer_completion_answer(r, c, NULL, "cmpl-fuzz", 0, r->model ? r->model : "model"));
    for (int i = 0; i < r->n_prompts; i++) infer_completion_choice_free(&c[i]);
    free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    char *body = malloc(size ? size : 1);
    if (!body) abort();
    memcpy(body, data, size);
    completion_request r;
    const char *param = NULL;
    keel_status st = infer_completion_parse(body, size, &r, &param);
    if (!param) abort();
    if (st == KEEL_OK) {
        if (param[0]) abort();
        check_request(&r);
        check_answer(&r);
        infer_completion_free(&r);
    } else {
        if (r.prompts || r.n_prompts || r.model || r.stop || r.n_stop) abort();
        fuzz_expect_error_line(st, "infer_completion_parse");
        check_json(infer_completion_error(keel_last_error(), "invalid_request_error", param));
    }
    free(body);
    return 0;
}
