/* data/jsonl.h: one line of a JSON Lines input of `keel data prepare` — a JSON
 * object — as the text of one document (the string at a key). Internal to the
 * data module (textblocks.c calls it on its encoding threads; fuzzed by
 * tests/fuzz/fuzz_jsonl_record.c).
 *
 *     char *text, why[512];
 *     size_t len;
 *     bool is_record;
 *     if (jsonl_record_text(line, line_len, "text", &is_record, &text, &len, why, sizeof why))
 *         report(path, line_no, why);
 *     else if (is_record) { use(text, len); keel_free(text); }
 */
#ifndef KEEL_DATA_JSONL_H
#define KEEL_DATA_JSONL_H

#include "keel/core.h"

struct cJSON;

/* A record of this many bytes or more is refused (naming its file and line)
 * rather than held in memory whole. */
#define JSONL_MAX_RECORD_BYTES (1ull << 30)

/* line[0, len) (no line end; need not be NUL-ended) is a blank line — only
 * JSON whitespace: *is_record = false, *text = NULL — or one JSON object whose
 * member `key` is a string: *is_record = true and *text a new NUL-ended copy
 * of the string (keel_free; *text_len bytes, up to a \u0000 in it). Anything
 * else is KEEL_ERR_INPUT with `why` saying what is wrong and the fix, without
 * the file and line (the caller adds them): malformed JSON (where, and the
 * bytes near it), text after the value, a value that is not an object (its
 * JSON type), no member `key` (the keys it has; --text-key), or `key` not a
 * string (its JSON type). Safe on many threads at once. */
keel_status jsonl_record_text(const char *line, size_t len, const char *key, bool *is_record,
                              char **text, size_t *text_len, char *why, size_t why_n);

/* The first half of jsonl_record_text, for records read otherwise (chat.c):
 * line[0, len) is a blank line (*rec = NULL) or one JSON object, parsed into
 * *rec (the caller's: cJSON_Delete). Malformed JSON, text after the value
 * and a value that is not an object are KEEL_ERR_INPUT with `why` as
 * jsonl_record_text says them; `holds` ends the last of these ("the
 * document's text at \"text\"") by saying what the object must hold. */
/* "a string", "a number", "null", "an array", ...: v's JSON type, for messages. */
const char *jsonl_json_type(const struct cJSON *v);
/* The names of object v's first few members, quoted: "\"a\", \"b\", ...", in out. */
void jsonl_member_names(const struct cJSON *v, char *out, size_t out_n);

keel_status jsonl_record_object(const char *line, size_t len, const char *holds, struct cJSON **rec,
                                char *why, size_t why_n);

#endif
