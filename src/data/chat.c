/* data/chat.c: chat records for `keel data prepare --format chat` — the
 * "messages" of a JSON Lines record checked, rendered with the Llama 3
 * Instruct or Llama 2 chat template as transformers renders it, and encoded
 * with a loss mask over the assistant's turns (see chat.h).
 *
 * The two templates, as their Hugging Face chat_template (Jinja) writes a
 * conversation (`trim` and `strip()` are Python's str.strip()):
 *   llama3  bos_token, then for every message
 *           <|start_header_id|>ROLE<|end_header_id|>\n\n + trim(content) + <|eot_id|>
 *   llama2  for each user message and the assistant's answer after it
 *           bos_token + "[INST] " + strip(user) + " [/INST]" + " " + strip(answer) + " " + eos_token
 *           where the first user message, when a system message leads, is
 *           "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + user before the strip
 * transformers encodes the rendered string as a whole; a tokenizer splits
 * such a string at its special tokens first and encodes the text between
 * them piece by piece, so keel writes each special token's id and encodes
 * each piece of text on its own — the same ids, given special tokens that
 * leave the text beside them alone (keel_tokenizer_special_id checks that).
 *
 * The mask trains on what the model has to generate after the template's
 * generation prompt: the assistant's content and the token that ends its
 * turn (llama2: with the spaces the template puts around the answer). A
 * piece of text that holds both prompt and answer (llama2's "[INST] ...
 * [/INST] answer ", llama3's "\n\n" + answer) is encoded whole and its
 * prompt part alone: the answer's tokens are those after the longest common
 * prefix of the two, so a token that spans the border is trained on, as
 * transformers' assistant mask (char_to_token of the answer's first
 * character) has it. */
#include "data/chat.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "data/jsonl.h"

typedef enum { TEMPLATE_LLAMA3, TEMPLATE_LLAMA2 } template_kind;

const char CHAT_TEMPLATE_NAMES[] = "llama3 or llama2";

struct chat_template {
    template_kind kind;
    const keel_tokenizer *tok;
    int32_t bos_id, eos_id;                 /* llama2 */
    int32_t begin_id, start_id, end_id, eot_id; /* llama3: bos, <|start_header_id|>, ... */
};

typedef enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } role;
static const char *const ROLE_NAMES[] = {"system", "user", "assistant"};

typedef struct {
    role role;
    const char *content; /* in the parsed record */
    size_t len;
} message;

/* What the rendering leaves for the encoding: a special token, or a piece of
 * text (doc->text[start, start + len)) whose bytes from train_from on are the
 * answer's (len: none of them; 0: all). */
typedef struct {
    int32_t special; /* the id, or -1: text */
    bool trained;    /* special */
    size_t start, len, train_from;
} part;

/* A record's messages (pointing into its parsed JSON) and how many parts
 * (doc->parts) its rendering has made. */
typedef struct {
    message *messages;
    size_t n_messages, messages_cap;
    size_t n_parts;
} scratch;

/* ---- the template and the tokenizer ----------------------------------------- */

/* The id of the special token `name`, or a line saying which is missing. */
static bool need_special(const char *template_name, const keel_tokenizer *tok, const char *tok_path,
                         const char *name, int32_t *id) {
    *id = keel_tokenizer_special_id(tok, name);
    if (*id >= 0) return true;
    bool json = strcmp(keel_tokenizer_file_name(tok), "tokenizer.json") == 0;
    keel_errorf("data prepare: --chat-template %s needs the special token %s, which tokenizer %s "
                "lacks (%s); use the tokenizer of the model the template belongs to",
                template_name, name, tok_path,
                json ? "as an added token matched whole in text, without lstrip/rstrip"
                     : "as a control or user-defined piece");
    return false;
}

/* BOS or EOS (`which`, "bos_token") of the tokenizer, which the template
 * writes by id: it must exist, and a tokenizer.json's must be a special token
 * (transformers writes its text and encodes it). */
static bool need_config_token(const char *template_name, const keel_tokenizer *tok,
                              const char *tok_path, int32_t id, const char *which,
                              const char *usual, int32_t *out) {
    *out = id;
    if (id < 0) {
        keel_errorf("data prepare: --chat-template %s needs the tokenizer's %s (%s), which tokenizer "
                    "%s does not define; give it in the tokenizer_config.json beside it (a "
                    "SentencePiece .model names its own)",
                    template_name, which, usual, tok_path);
        return false;
    }
    if (strcmp(keel_tokenizer_file_name(tok), "tokenizer.json") != 0) return true;
    char *text = NULL;
    size_t len = 0;
    bool ok = keel_tokenizer_decode_len(tok, &id, 1, &text, &len) == KEEL_OK && strlen(text) == len &&
              keel_tokenizer_special_id(tok, text) == id;
    if (!ok)
        keel_errorf("data prepare: --chat-template %s: the %s of tokenizer %s (id %d) is not a "
                    "special token (an added token matched whole in text); name %s in its "
                    "tokenizer_config.json",
                    template_name, which, tok_path, (int)id, usual);
    keel_free(text);
    return ok;
}

keel_status chat_template_open(const char *name, const keel_tokenizer *tok, const char *tok_path,
                               chat_template **out) {
    *out = NULL;
    chat_template ct = {.tok = tok};
    bool ok;
    if (strcmp(name, "llama3") == 0) {
        ct.kind = TEMPLATE_LLAMA3;
        ok = need_config_token(name, tok, tok_path, keel_tokenizer_bos_id(tok), "bos_token",
                               "<|begin_of_text|>", &ct.begin_id) &&
             need_special(name, tok, tok_path, "<|start_header_id|>", &ct.start_id) &&
             need_special(name, tok, tok_path, "<|end_header_id|>", &ct.end_id) &&
             need_special(name, tok, tok_path, "<|eot_id|>", &ct.eot_id);
    } else if (strcmp(name, "llama2") == 0) {
        ct.kind = TEMPLATE_LLAMA2;
        ok = need_config_token(name, tok, tok_path, keel_tokenizer_bos_id(tok), "bos_token", "<s>",
                               &ct.bos_id) &&
             need_config_token(name, tok, tok_path, keel_tokenizer_eos_id(tok), "eos_token", "</s>",
                               &ct.eos_id);
    } else {
        keel_errorf("data prepare: --chat-template '%s' is not a template keel knows; use %s "
                    "(Llama 3 Instruct, Llama 2 chat)",
                    name, CHAT_TEMPLATE_NAMES);
        return KEEL_ERR_INPUT;
    }
    if (!ok) return KEEL_ERR_INPUT;
    *out = keel_xmalloc(sizeof **out, "chat template");
    **out = ct;
    return KEEL_OK;
}

void chat_template_free(chat_template *ct) { keel_free(ct); }

const char *chat_template_name(const chat_template *ct) {
    return ct->kind == TEMPLATE_LLAMA3 ? "llama3" : "llama2";
}

/* ---- the record's messages -------------------------------------------------- */

/* Check the conversation's "messages" and list them in s. */
static bool read_messages(const cJSON *rec, scratch *s, char *why, size_t why_n) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(rec, "messages");
    if (!list) {
        char names[200];
        jsonl_member_names(rec, names, sizeof names);
        snprintf(why, why_n, "the record has no \"messages\" key (%s%s); a chat record holds the "
                 "conversation as \"messages\": [{\"role\": \"user\", \"content\": \"...\"}, "
                 "{\"role\": \"assistant\", \"content\": \"...\"}, ...]",
                 names[0] ? "its keys: " : "it is empty", names);
        return false;
    }
    if (!cJSON_IsArray(list)) {
        snprintf(why, why_n, "\"messages\" is %s, not an array; it must list the conversation's "
                 "messages: [{\"role\": ..., \"content\": ...}, ...]", jsonl_json_type(list));
        return false;
    }
    s->n_messages = 0;
    size_t i = 1; /* 1-based, as people count */
    for (const cJSON *m = list->child; m; m = m->next, i++) {
        if (!cJSON_IsObject(m)) {
            snprintf(why, why_n, "message %zu is %s, not an object; each message is {\"role\": "
                     "\"system\"|\"user\"|\"assistant\", \"content\": \"...\"}", i, jsonl_json_type(m));
            return false;
        }
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(r) || !r->valuestring) {
            snprintf(why, why_n, "message %zu %s%s%s; give each message \"role\": \"system\", "
                     "\"user\" or \"assistant\"", i, r ? "has a \"role\" that is " : "has no \"role\"",
                     r ? jsonl_json_type(r) : "", r ? ", not a string" : "");
            return false;
        }
        role ro;
        if (strcmp(r->valuestring, "system") == 0) ro = ROLE_SYSTEM;
        else if (strcmp(r->valuestring, "user") == 0) ro = ROLE_USER;
        else if (strcmp(r->valuestring, "assistant") == 0) ro = ROLE_ASSISTANT;
        else {
            snprintf(why, why_n, "message %zu has role \"%.40s\"; the roles are \"system\", \"user\" "
                     "and \"assistant\"", i, r->valuestring);
            return false;
        }
        if (!cJSON_IsString(c) || !c->valuestring) {
            snprintf(why, why_n, "message %zu (%s) %s%s%s; give each message its text as "
                     "\"content\": \"...\"", i, ROLE_NAMES[ro],
                     c ? "has a \"content\" that is " : "has no \"content\"", c ? jsonl_json_type(c) : "",
                     c ? ", not a string" : "");
            return false;
        }
        if (s->n_messages == s->messages_cap) {
            s->messages_cap = s->messages_cap ? 2 * s->messages_cap : 16;
            s->messages = keel_xrealloc(s->messages, s->messages_cap * sizeof *s->messages, "chat messages");
        }
        s->messages[s->n_messages++] =
            (message){.role = ro, .content = c->valuestring, .len = strlen(c->valuestring)};
    }
    return true;
}

/* The order every template here takes: a system message only first, then
 * user and assistant in turn from the user, the assistant last. */
static bool check_order(const scratch *s, char *why, size_t why_n) {
    if (s->n_messages == 0) {
        snprintf(why, why_n, "\"messages\" is empty; a conversation needs a user message and the "
                 "assistant's answer");
        return false;
    }
    size_t first = s->messages[0].role == ROLE_SYSTEM;
    if (first == s->n_messages) {
        snprintf(why, why_n, "the conversation is only a system message; it needs a user message "
                 "and the assistant's answer after it");
        return false;
    }
    for (size_t i = first; i < s->n_messages; i++) {
        role want = (i - first) % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT;
        role got = s->messages[i].role;
        if (got == want) continue;
        if (got == ROLE_SYSTEM)
            snprintf(why, why_n, "message %zu is a system message; only the first message may be "
                     "one (put the system prompt first)", i + 1);
        else if (i == first)
            snprintf(why, why_n, "message %zu is the assistant's, before any user message; a "
                     "conversation starts with the user (after an optional system message)", i + 1);
        else
            snprintf(why, why_n, "message %zu is %s's after %s's message %zu; messages must "
                     "alternate user, assistant, user, ... (merge the two or drop one)", i + 1,
                     got == ROLE_USER ? "the user" : "the assistant",
                     got == ROLE_USER ? "the user" : "the assistant", i);
        return false;
    }
    if (s->messages[s->n_messages - 1].role != ROLE_ASSISTANT) {
        snprintf(why, why_n, "the conversation ends with the user's message %zu; end it with the "
                 "assistant's answer (only the assistant's turns are trained on: drop the last "
                 "message)", s->n_messages);
        return false;
    }
    return true;
}

/* ---- rendering ---------------------------------------------------------------- */

/* Bytes of the Python whitespace character (str.isspace) at s[0, n), else 0. */
static size_t space_at(const unsigned char *s, size_t n) {
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0D) || (s[0] >= 0x1C && s[0] <= 0x20))) return 1;
    if (n >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;
    if (n < 3) return 0;
    if (s[0] == 0xE1 && s[1] == 0x9A && s[2] == 0x80) return 3; /* U+1680 */
    if (s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80) return 3; /* U+3000 */
    if (s[0] == 0xE2 && s[1] == 0x81 && s[2] == 0x9F) return 3; /* U+205F */
    if (s[0] == 0xE2 && s[1] == 0x80 &&
        (s[2] <= 0x8A || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF) && s[2] >= 0x80)
        return 3; /* U+2000..200A, U+2028, U+2029, U+202F */
    return 0;
}

/* The text[*from, *to) that Python's strip() leaves: whitespace characters off
 * both ends (bytes that are not UTF-8 are not whitespace). None of them is a
 * prefix of another character's bytes, so reading backwards is safe. */
static void strip(const char *text, size_t *from, size_t *to) {
    const unsigned char *s = (const unsigned char *)text;
    size_t k;
    while (*from < *to && (k = space_at(s + *from, *to - *from)) > 0) *from += k;
    for (bool more = true; more && *to > *from;) {
        more = false;
        for (k = 1; k <= 3 && k <= *to - *from; k++)
            if (space_at(s + *to - k, k) == k) {
                *to -= k;
                more = true;
                break;
            }
    }
}

static void text_reserve(chat_doc *doc, size_t extra) {
    if (doc->text_len + extra + 1 <= doc->text_cap) return;
    size_t cap = doc->text_cap ? doc->text_cap : 1024;
    while (cap < doc->text_len + extra + 1) cap *= 2;
    doc->text = keel_xrealloc(doc->text, cap, "chat text");
    doc->text_cap = cap;
}

static void put(chat_doc *doc, const char *s, size_t n) {
    text_reserve(doc, n);
    if (n) memcpy(doc->text + doc->text_len, s, n);
    doc->text_len += n;
    doc->text[doc->text_len] = '\0';
}
static void puts_(chat_doc *doc, const char *s) { put(doc, s, strlen(s)); }

/* Put s[0, n) (not in doc->text) stripped as Python's strip() would. */
static void put_stripped(chat_doc *doc, const char *s, size_t n) {
    size_t from = 0, to = n;
    strip(s, &from, &to);
    put(doc, s + from, to - from);
}

static part *new_part(chat_doc *doc, scratch *s) {
    if (s->n_parts * sizeof(part) >= doc->parts_cap) {
        size_t cap = doc->parts_cap ? 2 * doc->parts_cap : 64 * sizeof(part);
        doc->parts = keel_xrealloc(doc->parts, cap, "chat parts");
        doc->parts_cap = cap;
    }
    part *p = &((part *)doc->parts)[s->n_parts++];
    *p = (part){.special = -1};
    return p;
}

/* A special token: its id, and its text in doc->text (the rendered string). */
static void put_special(chat_doc *doc, scratch *s, int32_t id, const char *name, bool trained) {
    part *p = new_part(doc, s);
    p->special = id;
    p->trained = trained;
    puts_(doc, name);
}

/* A piece of text starts here; end_text closes it with its answer's start. */
static part *begin_text(chat_doc *doc, scratch *s) {
    part *p = new_part(doc, s);
    p->start = doc->text_len;
    return p;
}
static void end_text(chat_doc *doc, part *p, size_t train_from) {
    p->len = doc->text_len - p->start;
    p->train_from = train_from == SIZE_MAX ? p->len : train_from - p->start;
}

static void render_llama3(const chat_template *ct, chat_doc *doc, scratch *s) {
    put_special(doc, s, ct->begin_id, "<|begin_of_text|>", false);
    for (size_t i = 0; i < s->n_messages; i++) {
        const message *m = &s->messages[i];
        bool answer = m->role == ROLE_ASSISTANT;
        put_special(doc, s, ct->start_id, "<|start_header_id|>", false);
        part *p = begin_text(doc, s);
        puts_(doc, ROLE_NAMES[m->role]);
        end_text(doc, p, SIZE_MAX);
        put_special(doc, s, ct->end_id, "<|end_header_id|>", false);
        p = begin_text(doc, s);
        puts_(doc, "\n\n");
        size_t answer_from = doc->text_len;
        put_stripped(doc, m->content, m->len);
        end_text(doc, p, answer ? answer_from : SIZE_MAX);
        put_special(doc, s, ct->eot_id, "<|eot_id|>", answer);
    }
}

/* llama2's first user message with the system message: the whole of
 * "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + user is stripped, as the
 * template strips its `content`. */
static void put_user_llama2(chat_doc *doc, const message *sys, const message *user) {
    if (!sys) {
        put_stripped(doc, user->content, user->len);
        return;
    }
    size_t from = doc->text_len;
    puts_(doc, "<<SYS>>\n");
    put(doc, sys->content, sys->len);
    puts_(doc, "\n<</SYS>>\n\n");
    put(doc, user->content, user->len);
    size_t a = from, b = doc->text_len;
    strip(doc->text, &a, &b);
    memmove(doc->text + from, doc->text + a, b - a);
    doc->text_len = from + (b - a);
    doc->text[doc->text_len] = '\0';
}

static void render_llama2(const chat_template *ct, chat_doc *doc, scratch *s) {
    const message *sys = s->messages[0].role == ROLE_SYSTEM ? &s->messages[0] : NULL;
    for (size_t i = sys != NULL; i + 1 < s->n_messages; i += 2) {
        const message *user = &s->messages[i], *answer = &s->messages[i + 1];
        put_special(doc, s, ct->bos_id, "<s>", false);
        part *p = begin_text(doc, s);
        puts_(doc, "[INST] ");
        put_user_llama2(doc, i == 1 ? sys : NULL, user);
        puts_(doc, " [/INST]");
        size_t answer_from = doc->text_len;
        puts_(doc, " ");
        put_stripped(doc, answer->content, answer->len);
        puts_(doc, " ");
        end_text(doc, p, answer_from);
        put_special(doc, s, ct->eos_id, "</s>", true);
    }
}

/* ---- encoding ------------------------------------------------------------------- */

static void append_ids(chat_doc *doc, const int32_t *ids, size_t n, uint8_t trained) {
    keel_ids *out = &doc->ids;
    if (out->n + n > out->cap) {
        size_t cap = out->cap ? out->cap : 1024;
        while (cap < out->n + n) cap *= 2;
        out->ids = keel_xrealloc(out->ids, cap * sizeof *out->ids, "chat ids");
        out->cap = cap;
    }
    if (out->n + n > doc->mask_cap) {
        doc->mask = keel_xrealloc(doc->mask, out->cap, "chat mask");
        doc->mask_cap = out->cap;
    }
    if (n) memcpy(out->ids + out->n, ids, n * sizeof *ids);
    memset(doc->mask + out->n, trained, n);
    out->n += n;
}

/* A piece of text: its ids, the answer's (from train_from) trained on. */
static keel_status encode_text(const chat_template *ct, chat_doc *doc, const part *p, keel_ids *piece) {
    const char *text = doc->text + p->start;
    keel_status st = keel_tokenizer_encode(ct->tok, text, p->len, piece);
    if (st != KEEL_OK || p->len == 0) return st;
    size_t prompt_ids = piece->n; /* train_from == len: none trained */
    if (p->train_from == 0) {
        prompt_ids = 0;
    } else if (p->train_from < p->len) {
        st = keel_tokenizer_encode(ct->tok, text, p->train_from, &doc->prefix);
        if (st != KEEL_OK) return st;
        prompt_ids = 0;
        while (prompt_ids < doc->prefix.n && prompt_ids < piece->n &&
               piece->ids[prompt_ids] == doc->prefix.ids[prompt_ids])
            prompt_ids++;
    }
    append_ids(doc, piece->ids, prompt_ids, 0);
    append_ids(doc, piece->ids + prompt_ids, piece->n - prompt_ids, 1);
    return KEEL_OK;
}

static keel_status encode_parts(const chat_template *ct, chat_doc *doc, const scratch *s) {
    doc->ids.n = 0;
    keel_ids piece = {0};
    keel_status st = KEEL_OK;
    for (size_t i = 0; i < s->n_parts && st == KEEL_OK; i++) {
        const part *p = (const part *)doc->parts + i;
        if (p->special >= 0) append_ids(doc, &p->special, 1, p->trained);
        else st = encode_text(ct, doc, p, &piece);
    }
    keel_ids_free(&piece);
    return st;
}

/* ---- a record ------------------------------------------------------------------- */

keel_status chat_record_encode(const chat_template *ct, const char *line, size_t len, chat_doc *doc,
                               bool *is_record, char *why, size_t why_n) {
    *is_record = false;
    why[0] = '\0';
    cJSON *rec;
    keel_status st = jsonl_record_object(line, len, "the conversation at \"messages\"", &rec, why, why_n);
    if (st != KEEL_OK || !rec) return st;
    scratch s = {0};
    if (!read_messages(rec, &s, why, why_n) || !check_order(&s, why, why_n)) {
        st = KEEL_ERR_INPUT;
        goto done;
    }
    doc->text_len = 0;
    text_reserve(doc, 0);
    doc->text[0] = '\0';
    if (ct->kind == TEMPLATE_LLAMA3) render_llama3(ct, doc, &s);
    else render_llama2(ct, doc, &s);
    doc->n_messages = s.n_messages;
    st = encode_parts(ct, doc, &s);
    *is_record = st == KEEL_OK;
done:
    keel_free(s.messages);
    cJSON_Delete(rec);
    return st;
}

void chat_doc_free(chat_doc *doc) {
    keel_free(doc->text);
    keel_ids_free(&doc->ids);
    keel_ids_free(&doc->prefix);
    keel_free(doc->mask);
    keel_free(doc->parts);
    *doc = (chat_doc){0};
}
