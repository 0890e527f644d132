/* infer/completions.c: an OpenAI completions request read from a client's
 * JSON, and the answers written back (infer/completions.h). Every field is
 * checked for its type and range here, each refusal one line naming it. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/completions.h"

static const char PROMPT_SHAPE[] =
    "a string, a list of strings, a list of token ids or a list of lists of token ids";

void infer_completion_free(completion_request *req) {
    keel_free(req->model);
    keel_gen_prompts_free(req->prompts, req->n_prompts);
    for (int i = 0; i < req->n_stop; i++) keel_free(req->stop[i]);
    keel_free(req->stop);
    memset(req, 0, sizeof *req);
}

/* ---- the prompt ---------------------------------------------------------------- */

static void text_of(const cJSON *s, keel_gen_prompt *p) {
    p->text = keel_xstrdup(s->valuestring);
    p->text_len = strlen(p->text);
}

/* "prompt": a string, [strings], [ids] or [[ids]]. */
static keel_status parse_prompt(const cJSON *v, completion_request *req) {
    if (!v || cJSON_IsNull(v)) {
        keel_errorf("\"prompt\" is missing: give %s", PROMPT_SHAPE);
        return KEEL_ERR_INPUT;
    }
    if (cJSON_IsString(v)) {
        req->prompts = keel_xcalloc(sizeof *req->prompts, "prompts");
        text_of(v, &req->prompts[0]);
        req->n_prompts = 1;
        return KEEL_OK;
    }
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (n < 1) {
        keel_errorf("\"prompt\" must be %s (an empty list asks for nothing)", PROMPT_SHAPE);
        return KEEL_ERR_INPUT;
    }
    const cJSON *first = v->child;
    if (cJSON_IsNumber(first)) { /* one prompt of ids */
        req->prompts = keel_xcalloc(sizeof *req->prompts, "prompts");
        req->n_prompts = 1;
        if (keel_gen_prompt_ids(v, &req->prompts[0])) return KEEL_OK;
        keel_errorf("\"prompt\": a list of token ids holds only whole numbers from 0 to %d", INT32_MAX);
        return KEEL_ERR_INPUT;
    }
    if (n > COMPLETION_MAX_PROMPTS) {
        keel_errorf("\"prompt\" holds %d prompts: at most %d a request", n, COMPLETION_MAX_PROMPTS);
        return KEEL_ERR_INPUT;
    }
    bool strings = cJSON_IsString(first);
    req->prompts = keel_xcalloc(sizeof *req->prompts * (size_t)n, "prompts");
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        keel_gen_prompt *p = &req->prompts[req->n_prompts];
        if (strings && cJSON_IsString(e)) text_of(e, p);
        else if (!strings && cJSON_IsArray(e) && keel_gen_prompt_ids(e, p)) {
        } else {
            keel_errorf("\"prompt\" item %d: %s; a list of prompts holds %s", req->n_prompts + 1,
                        strings ? "not a string" : "not a non-empty list of token ids (whole numbers >= 0)",
                        strings ? "strings only" : "lists of token ids only");
            return KEEL_ERR_INPUT;
        }
        req->n_prompts++;
    }
    return KEEL_OK;
}

/* ---- the other fields ------------------------------------------------------------ */

/* v absent or null: the default stays. Each returns false after one error line. */
static bool int_field(const cJSON *v, const char *name, int64_t lo, int64_t hi, const char *what, int64_t *out) {
    if (!v || cJSON_IsNull(v)) return true;
    if (keel_json_int(v, lo, hi, out)) return true;
    if (cJSON_IsNumber(v)) keel_errorf("\"%s\" %.17g: %s", name, v->valuedouble, what);
    else keel_errorf("\"%s\" must be a whole number: %s", name, what);
    return false;
}

static bool number_field(const cJSON *v, const char *name, double *out) {
    if (!v || cJSON_IsNull(v)) return true;
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) {
        *out = v->valuedouble;
        return true;
    }
    keel_errorf("\"%s\" must be a number", name);
    return false;
}

static bool bool_field(const cJSON *v, const char *name, bool *out) {
    if (!v || cJSON_IsNull(v)) return true;
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v);
        return true;
    }
    keel_errorf("\"%s\" must be true or false", name);
    return false;
}

static bool one_stop(const cJSON *s, completion_request *req) {
    size_t n = strlen(s->valuestring);
    if (n == 0 || n > COMPLETION_MAX_STOP_BYTES) {
        keel_errorf("\"stop\": %s", n ? "a stop string is at most 1024 bytes"
                                      : "an empty stop string would stop before the first token; leave it out");
        return false;
    }
    req->stop[req->n_stop++] = keel_xstrdup(s->valuestring);
    return true;
}

/* "stop": a string or a list of up to COMPLETION_MAX_STOPS strings. */
static bool stop_field(const cJSON *v, completion_request *req) {
    if (!v || cJSON_IsNull(v)) return true;
    int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0 || n > COMPLETION_MAX_STOPS) {
        keel_errorf("\"stop\" must be a string or a list of at most %d strings", COMPLETION_MAX_STOPS);
        return false;
    }
    req->stop = keel_xcalloc(sizeof(char *) * (size_t)(n > 0 ? n : 1), "stop strings");
    if (cJSON_IsString(v)) return one_stop(v, req);
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsString(e)) {
            keel_errorf("\"stop\" must be a string or a list of at most %d strings", COMPLETION_MAX_STOPS);
            return false;
        }
        if (!one_stop(e, req)) return false;
    }
    return true;
}

/* The OpenAI fields keel does not do: refused when they ask for something
 * other than their default, so that nothing is silently left out. */
static bool unsupported(const cJSON *body, const char **param) {
    enum { ONE, FALSE, ZERO, EMPTY }; /* each one's default */
    static const struct {
        const char *name;
        int fine;
        const char *why;
    } FIELDS[] = {
        {"n", ONE, "only 1 completion a prompt (send the prompt again, with another seed)"},
        {"best_of", ONE, "only 1 (no server-side best-of)"},
        {"stream", FALSE, "streaming is not supported: leave it out or false"},
        {"suffix", EMPTY, "insertion (suffix) is not supported"},
        {"presence_penalty", ZERO, "penalties are not supported: leave it out or 0"},
        {"frequency_penalty", ZERO, "penalties are not supported: leave it out or 0"},
        {"logit_bias", EMPTY, "logit_bias is not supported: leave it out or {}"},
    };
    for (size_t i = 0; i < sizeof FIELDS / sizeof FIELDS[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, FIELDS[i].name);
        if (!v || cJSON_IsNull(v)) continue;
        switch (FIELDS[i].fine) {
        case ONE: if (cJSON_IsNumber(v) && v->valuedouble == 1) continue; break;
        case FALSE: if (cJSON_IsFalse(v)) continue; break;
        case ZERO: if (cJSON_IsNumber(v) && v->valuedouble == 0) continue; break;
        default: if ((cJSON_IsObject(v) && !v->child) || (cJSON_IsString(v) && !v->valuestring[0])) continue;
        }
        keel_errorf("\"%s\": %s", FIELDS[i].name, FIELDS[i].why);
        *param = FIELDS[i].name;
        return false;
    }
    return true;
}

static keel_status parse_fields(const cJSON *body, completion_request *req, const char **param) {
#define FIELD(name) (*param = name, cJSON_GetObjectItemCaseSensitive(body, name))
    const cJSON *model = FIELD("model");
    if (model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) {
            keel_errorf("\"model\" must be a string");
            return KEEL_ERR_INPUT;
        }
        req->model = keel_xstrdup(model->valuestring);
    }
    if (parse_prompt(FIELD("prompt"), req) != KEEL_OK) return KEEL_ERR_INPUT;
    int64_t x = req->max_tokens;
    if (!int_field(FIELD("max_tokens"), "max_tokens", 0, COMPLETION_MAX_TOKENS, "must be from 0 to 16777216", &x))
        return KEEL_ERR_INPUT;
    req->max_tokens = (int)x;
    if (!number_field(FIELD("temperature"), "temperature", &req->temperature)) return KEEL_ERR_INPUT;
    if (!(req->temperature >= 0 && req->temperature <= 1e6)) {
        keel_errorf("\"temperature\" %g: must be 0 (greedy) or more, up to 1e6", req->temperature);
        return KEEL_ERR_INPUT;
    }
    if (!number_field(FIELD("top_p"), "top_p", &req->top_p)) return KEEL_ERR_INPUT;
    if (!(req->top_p > 0 && req->top_p <= 1)) {
        keel_errorf("\"top_p\" %g: must be in (0, 1]", req->top_p);
        return KEEL_ERR_INPUT;
    }
    x = req->top_k;
    if (!int_field(FIELD("top_k"), "top_k", -1, 1 << 30, "must be -1 or 0 (off) or more", &x)) return KEEL_ERR_INPUT;
    req->top_k = x < 0 ? 0 : (int)x;
    const cJSON *seed = FIELD("seed");
    x = 0;
    if (!int_field(seed, "seed", -(1ll << 53), 1ll << 53, "must be a whole number (within ±2^53)", &x))
        return KEEL_ERR_INPUT;
    req->has_seed = seed && !cJSON_IsNull(seed), req->seed = (uint64_t)x;
    if (!stop_field(FIELD("stop"), req)) return KEEL_ERR_INPUT;
    x = req->logprobs;
    const cJSON *logprobs = FIELD("logprobs");
    if (cJSON_IsBool(logprobs)) {
        keel_errorf("\"logprobs\" is a number here (the alternatives each token comes with, 0 to %d), not true or false",
                    COMPLETION_MAX_LOGPROBS);
        return KEEL_ERR_INPUT;
    }
    if (!int_field(logprobs, "logprobs", 0, COMPLETION_MAX_LOGPROBS, "must be from 0 to 5 (the alternatives each token "
                   "comes with)", &x))
        return KEEL_ERR_INPUT;
    req->logprobs = (int)x;
    if (!bool_field(FIELD("echo"), "echo", &req->echo)) return KEEL_ERR_INPUT;
    if (!bool_field(FIELD("ignore_eos"), "ignore_eos", &req->ignore_eos)) return KEEL_ERR_INPUT;
    if (req->max_tokens == 0 && !req->echo) {
        *param = "max_tokens";
        keel_errorf("\"max_tokens\" 0 asks for nothing without \"echo\": true (which scores the prompt)");
        return KEEL_ERR_INPUT;
    }
    if (!unsupported(body, param)) return KEEL_ERR_INPUT;
#undef FIELD
    *param = "";
    return KEEL_OK;
}

keel_status infer_completion_parse(const char *body, size_t len, completion_request *req, const char **param) {
    *req = (completion_request){.max_tokens = COMPLETION_DEFAULT_MAX_TOKENS, .temperature = 1, .top_p = 1,
                                .logprobs = -1};
    *param = "";
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!j) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        keel_errorf("the body is not valid JSON (at byte %zu of %zu): send one JSON object", at, len);
        return KEEL_ERR_INPUT;
    }
    keel_status st = KEEL_ERR_INPUT;
    if (!cJSON_IsObject(j)) keel_errorf("the body must be a JSON object, e.g. {\"prompt\": \"Hello\", \"max_tokens\": 16}");
    else st = parse_fields(j, req, param);
    cJSON_Delete(j);
    if (st != KEEL_OK) infer_completion_free(req);
    return st;
}

bool infer_completion_compatible(const completion_request *a, const completion_request *b) {
    if (a->max_tokens != b->max_tokens || a->temperature != b->temperature || a->top_p != b->top_p ||
        a->top_k != b->top_k || a->logprobs != b->logprobs || a->ignore_eos != b->ignore_eos || a->n_stop != b->n_stop)
        return false;
    for (int i = 0; i < a->n_stop; i++)
        if (strcmp(a->stop[i], b->stop[i])) return false;
    return true;
}

/* ---- answers ------------------------------------------------------------------------ */

void infer_completion_choice_free(completion_choice *c) {
    keel_free(c->text);
    keel_free(c->tokens);
    keel_free(c->logprob);
    keel_free(c->top_id);
    keel_free(c->top_logprob);
    memset(c, 0, sizeof *c);
}

/* Bytes of the well-formed UTF-8 character at s[0, n), or 0 when none starts there. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c >= 0x01 && c <= 0x7F) return 1;
    size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!need || n < need) return 0;
    unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range: no overlong forms, surrogates or > U+10FFFF */
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
    else if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < need; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return need;
}

/* s[0, n) as a JSON string can carry it: each byte that starts no
 * well-formed UTF-8 character, and NUL (which ends cJSON's strings), as
 * U+FFFD. A new string (keel_free). */
static char *utf8_clean(const char *s, size_t n) {
    char *out = keel_xmalloc(3 * n + 1, "text"), *o = out;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char((const unsigned char *)s + i, n - i);
        if (k) memcpy(o, s + i, k), o += k, i += k;
        else memcpy(o, "\xEF\xBF\xBD", 3), o += 3, i++;
    }
    *o = 0;
    return out;
}

/* A token's text alone, as utf8_clean leaves it (a piece of a character is U+FFFD). */
static char *token_text(const keel_tokenizer *tok, int32_t id) {
    char *text = NULL;
    size_t len;
    if (id < 0 || keel_tokenizer_decode_len(tok, &id, 1, &text, &len) != KEEL_OK) return keel_xstrdup("");
    char *clean = utf8_clean(text, len);
    free(text);
    return clean;
}

/* Characters of UTF-8 text (bytes that do not continue a character). */
static long long chars_of(const char *s) {
    long long n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static cJSON *number_or_null(double x) { return isfinite(x) ? cJSON_CreateNumber(x) : cJSON_CreateNull(); }

/* OpenAI's logprobs object of one choice: tokens, token_logprobs,
 * top_logprobs (the k alternatives and the token itself, one key per text:
 * the more likely kept) and text_offset (characters into text). */
static cJSON *logprobs_json(const completion_choice *c, int k, const keel_tokenizer *tok) {
    cJSON *o = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs"),
          *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offsets = cJSON_AddArrayToObject(o, "text_offset");
    long long offset = 0;
    for (int t = 0; t < c->n_tokens; t++) {
        char *text = token_text(tok, c->tokens[t]);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(text));
        cJSON_AddItemToArray(lps, number_or_null(c->logprob[t]));
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
        if (t >= c->added_tokens) offset += chars_of(text);
        if (!isfinite(c->logprob[t])) {
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
        } else {
            cJSON *top = cJSON_CreateObject();
            for (int j = 0; j < k; j++) {
                int32_t id = c->top_id[(size_t)t * k + j];
                if (id < 0) continue;
                char *alt = token_text(tok, id);
                if (!cJSON_GetObjectItemCaseSensitive(top, alt))
                    cJSON_AddItemToObject(top, alt, number_or_null(c->top_logprob[(size_t)t * k + j]));
                keel_free(alt);
            }
            if (!cJSON_GetObjectItemCaseSensitive(top, text))
                cJSON_AddItemToObject(top, text, number_or_null(c->logprob[t]));
            cJSON_AddItemToArray(tops, top);
        }
        keel_free(text);
    }
    return o;
}

char *infer_completion_answer(const completion_request *req, const completion_choice *choices,
                              const keel_tokenizer *tok, const char *id, long long created, const char *model) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    const char *name = req->model ? req->model : model; /* a client's bytes: any */
    char *clean = utf8_clean(name, strlen(name));
    cJSON_AddStringToObject(o, "model", clean);
    keel_free(clean);
    cJSON *list = cJSON_AddArrayToObject(o, "choices");
    long long prompt_tokens = 0, completion_tokens = 0;
    for (int i = 0; i < req->n_prompts; i++) {
        const completion_choice *c = &choices[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", i);
        char *text = utf8_clean(c->text ? c->text : "", c->text ? c->len : 0);
        cJSON_AddStringToObject(ch, "text", text);
        keel_free(text);
        cJSON_AddItemToObject(ch, "logprobs", req->logprobs >= 0 ? logprobs_json(c, req->logprobs, tok)
                                                                  : cJSON_CreateNull());
        cJSON_AddStringToObject(ch, "finish_reason", c->finish_reason ? c->finish_reason : "length");
        cJSON_AddItemToArray(list, ch);
        prompt_tokens += c->prompt_tokens, completion_tokens += c->completion_tokens;
    }
    cJSON *usage = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(usage, "prompt_tokens", (double)prompt_tokens);
    cJSON_AddNumberToObject(usage, "completion_tokens", (double)completion_tokens);
    cJSON_AddNumberToObject(usage, "total_tokens", (double)(prompt_tokens + completion_tokens));
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

char *infer_completion_error(const char *message, const char *type, const char *param) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param && param[0]) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    cJSON_AddNullToObject(e, "code");
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}
