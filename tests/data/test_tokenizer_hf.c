/* test_tokenizer_hf: hand-made tokenizer.json files — BPE merges applied as
 * tokenizers' Word::merge_all does (lowest rank first, leftmost ties),
 * ignore_merges, unk with and without fuse_unk next to byte fallback (the
 * ids were read off tokenizers 0.23.3), an unk_token the vocabulary lacks,
 * added-token ids assigned as tokenizers assigns them, BOS/EOS from
 * tokenizer_config.json (a string, {"content": ...}, none), invalid UTF-8 as
 * U+FFFD, the same ids from many threads at once, one-line refusals of
 * inconsistent or unsupported files (each naming the file), and a Hugging
 * Face export that carries a tokenizer.json (its tokenizer_config.json, its
 * BOS/EOS in config.json). The match with
 * the tokenizers library on real text is tests/data/tokenizer_matches_hf.sh. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/hf.h"
#include "keel/tokenizer.h"

#include "../testlib.h"

static char tmp_dir[64];

static const char *write_file(const char *dir, const char *name, const char *text) {
    static char path[512];
    char sub[256];
    snprintf(sub, sizeof sub, "%s/%s", tmp_dir, dir);
    mkdir(sub, 0755);
    snprintf(path, sizeof path, "%s/%s", sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, strlen(text), f) != strlen(text) || fclose(f) != 0) {
        perror(path);
        abort();
    }
    return path;
}

/* A tokenizer.json with a BPE model: model_extra goes inside "model" (after
 * vocab and merges), top_extra at the top level. */
static char *tokenizer_json(const char *vocab, const char *merges, const char *model_extra, const char *top_extra) {
    static char json[8192];
    snprintf(json, sizeof json,
             "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, %s%s"
             "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"vocab\": {%s}, \"merges\": [%s]%s%s}}",
             top_extra ? top_extra : "", top_extra ? ", " : "", vocab, merges, model_extra ? ", " : "",
             model_extra ? model_extra : "");
    return json;
}

/* Load dir/tokenizer.json (written from json; config too when not NULL). */
static keel_tokenizer *load(const char *dir, const char *json, const char *config, int *lines, char *msg,
                            size_t msg_size) {
    if (config) write_file(dir, "tokenizer_config.json", config);
    const char *path = write_file(dir, "tokenizer.json", json);
    keel_tokenizer *tok = (keel_tokenizer *)&tok; /* must be reset to NULL on failure */
    capture_begin();
    keel_status st = keel_tokenizer_load(path, &tok);
    const char *captured = capture_end();
    snprintf(msg, msg_size, "%s", captured);
    *lines = 0;
    for (const char *p = captured; *p; p++) *lines += *p == '\n';
    if (st != KEEL_OK) EXPECT(tok == NULL, "%s: *out not NULL on failure", dir);
    return st == KEEL_OK ? tok : NULL;
}

static keel_tokenizer *load_ok(const char *dir, const char *json, const char *config) {
    int lines;
    char msg[1024];
    keel_tokenizer *tok = load(dir, json, config, &lines, msg, sizeof msg);
    EXPECT(tok && lines == 0, "%s loads: %s", dir, msg);
    return tok;
}

static void expect_refused(const char *dir, const char *json, const char *config, const char *why) {
    int lines;
    char msg[1024];
    keel_tokenizer *tok = load(dir, json, config, &lines, msg, sizeof msg);
    EXPECT(!tok && lines == 1 && strstr(msg, dir) && strstr(msg, why),
           "%s is refused in one line naming the file and saying '%s': %s", dir, why, msg);
    keel_tokenizer_free(tok);
}

static bool same_ids(const keel_ids *got, const int32_t *want, size_t n) {
    if (got->n != n) return false;
    for (size_t i = 0; i < n; i++)
        if (got->ids[i] != want[i]) return false;
    return true;
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t))

static void expect_ids(const keel_tokenizer *tok, const char *what, const char *text, const int32_t *want,
                       size_t n) {
    keel_ids ids = {0};
    keel_status st = keel_tokenizer_encode(tok, text, strlen(text), &ids);
    char got[256] = "";
    for (size_t i = 0; i < ids.n && strlen(got) < 200; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", i ? " " : "", ids.ids[i]);
    EXPECT(st == KEEL_OK && same_ids(&ids, want, n), "%s: '%s' encodes to the expected ids (got %s)", what, text,
           got);
    keel_ids_free(&ids);
}

static const char ABC_VOCAB[] = "\"a\": 0, \"b\": 1, \"c\": 2, \"aa\": 3, \"ab\": 4, \"bc\": 5, \"abc\": 6";
static const char ABC_MERGES[] = "\"a a\", [\"b\", \"c\"], \"a b\", \"ab c\"";

static void test_merges(void) {
    keel_tokenizer *tok = load_ok("merges", tokenizer_json(ABC_VOCAB, ABC_MERGES, NULL, NULL), NULL);
    if (!tok) return;
    EXPECT(strcmp(keel_tokenizer_file_name(tok), "tokenizer.json") == 0, "a tokenizer.json is named so");
    EXPECT(keel_tokenizer_vocab_size(tok) == 7, "vocab size %d, want 7", keel_tokenizer_vocab_size(tok));
    EXPECT(keel_tokenizer_bos_id(tok) == -1 && keel_tokenizer_eos_id(tok) == -1,
           "no tokenizer_config.json: no BOS or EOS");
    expect_ids(tok, "leftmost tie", "aaa", IDS(3, 0));
    expect_ids(tok, "lowest rank first", "abc", IDS(0, 5)); /* b c (rank 1) beats a b (rank 2) */
    expect_ids(tok, "a longer word", "aaaabc", IDS(3, 3, 5));
    expect_ids(tok, "no character in the vocabulary and no unk_token: dropped", "xax", IDS(0));
    expect_ids(tok, "invalid UTF-8 as U+FFFD (dropped here, before merging)", "a\xff" "a", IDS(3));
    keel_tokenizer_free(tok);

    tok = load_ok("ignore_merges", tokenizer_json(ABC_VOCAB, ABC_MERGES, "\"ignore_merges\": true", NULL), NULL);
    if (!tok) return;
    expect_ids(tok, "ignore_merges: a word in the vocabulary is one token", "abc", IDS(6));
    expect_ids(tok, "ignore_merges: others merge as usual", "aaa", IDS(3, 0));
    keel_tokenizer_free(tok);
}

static void test_unknown(void) {
    static const char vocab[] = "\"<unk>\": 0, \"a\": 1, \"<0x78>\": 2, \"\\u00ef\": 3";
    keel_tokenizer *tok = load_ok(
        "fuse_unk",
        tokenizer_json(vocab, "", "\"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true", NULL),
        NULL);
    if (!tok) return;
    /* tokenizers adds a byte-fallback character before the unk run it interrupts */
    expect_ids(tok, "fuse_unk with byte fallback", "yzxa", IDS(2, 0, 1));
    expect_ids(tok, "fuse_unk", "yza", IDS(0, 1));
    keel_tokenizer_free(tok);
    tok = load_ok("no_fuse_unk",
                  tokenizer_json(vocab, "", "\"unk_token\": \"<unk>\", \"fuse_unk\": false, \"byte_fallback\": true",
                                 NULL),
                  NULL);
    if (!tok) return;
    expect_ids(tok, "unk without fuse_unk, with byte fallback", "yzxa", IDS(0, 2, 0, 1));
    keel_tokenizer_free(tok);

    tok = load_ok("missing_unk", tokenizer_json("\"a\": 0", "", "\"unk_token\": \"<zz>\"", NULL), NULL);
    if (!tok) return;
    expect_ids(tok, "an unk_token outside the vocabulary is not needed", "aa", IDS(0, 0));
    keel_ids ids = {0};
    capture_begin();
    keel_status st = keel_tokenizer_encode(tok, "ab", 2, &ids);
    const char *msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && strstr(msg, "<zz>") && strchr(msg, '\n') == msg + strlen(msg) - 1,
           "an unk_token outside the vocabulary that is needed fails in one line: %s", msg);
    keel_ids_free(&ids);
    keel_tokenizer_free(tok);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    return text;
}

/* keel_hf_export with the tokenizer.json of dir "added" (and its tokenizer_config.json), then
 * with one that has no config beside it. */
static void test_export(const char *json) {
    keel_config c;
    keel_config_defaults(&c);
    c.model = (keel_model_config){.dim = 8, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .vocab_size = 6,
                                  .multiple_of = 8, .norm_eps = 1e-5, .rope_theta = 10000.0, .max_seq_len = 16};
    c.data.synthetic = true;
    if (keel_config_finalize(&c) != KEEL_OK) abort();
    keel_model_layout lay;
    keel_model_layout_init(&lay, &c.model);
    float *params = calloc((size_t)lay.n_params, sizeof(float));
    char src[512], out[512], path[600];
    for (int with_config = 1; with_config >= 0; with_config--) {
        snprintf(src, sizeof src, "%s/%s/tokenizer.json", tmp_dir, with_config ? "added" : "export_src");
        if (!with_config) write_file("export_src", "tokenizer.json", json);
        snprintf(out, sizeof out, "%s/export%d", tmp_dir, with_config);
        EXPECT(keel_hf_export(&c.model, keel_params_from_buffer, params, src, NULL, out, 0) == KEEL_OK,
               "export with a tokenizer.json (config beside it: %d)", with_config);
        snprintf(path, sizeof path, "%s/tokenizer.json", out);
        char *copy = slurp(path);
        EXPECT(copy && strcmp(copy, json) == 0, "tokenizer.json is copied as tokenizer.json");
        snprintf(path, sizeof path, "%s/tokenizer_config.json", out);
        copy = slurp(path);
        EXPECT(copy && (with_config ? strstr(copy, "\"eos_token\": {\"content\": \"abc\"}") != NULL
                                    : strstr(copy, "PreTrainedTokenizerFast") != NULL),
               "tokenizer_config.json: %s", with_config ? "the one beside tokenizer.json" : "a minimal one");
        snprintf(path, sizeof path, "%s/config.json", out);
        cJSON *cfg = cJSON_Parse(slurp(path) ? slurp(path) : "");
        const cJSON *bos = cJSON_GetObjectItem(cfg, "bos_token_id"), *eos = cJSON_GetObjectItem(cfg, "eos_token_id");
        EXPECT(with_config ? cJSON_IsNumber(bos) && bos->valuedouble == 5 && cJSON_IsNumber(eos) && eos->valuedouble == 4
                           : cJSON_IsNull(bos) && cJSON_IsNull(eos),
               "config.json: bos_token_id / eos_token_id %s", with_config ? "5 and 4" : "null");
        cJSON_Delete(cfg);
    }
    free(params);
    keel_model_layout_free(&lay);
    keel_config_free(&c);
}

static void test_added_and_config(void) {
    static const char added[] =
        "\"added_tokens\": [{\"id\": 999, \"content\": \"<x>\", \"single_word\": false, \"lstrip\": false, "
        "\"rstrip\": false, \"normalized\": false, \"special\": true}, {\"id\": 3, \"content\": \"ab\", "
        "\"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": false}]";
    const char *json = tokenizer_json("\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"abc\": 4", "\"a b\", \"ab c\"",
                                      NULL, added);
    keel_tokenizer *tok = load_ok("added", json, "{\"bos_token\": \"<x>\", \"eos_token\": {\"content\": \"abc\"}}");
    if (!tok) return;
    /* as tokenizers 0.23.3: "<x>" gets the id after the vocabulary (5), not the file's 999 */
    EXPECT(keel_tokenizer_vocab_size(tok) == 6, "vocab size %d, want 6", keel_tokenizer_vocab_size(tok));
    EXPECT(keel_tokenizer_bos_id(tok) == 5 && keel_tokenizer_eos_id(tok) == 4,
           "BOS and EOS from tokenizer_config.json: %d %d", keel_tokenizer_bos_id(tok), keel_tokenizer_eos_id(tok));
    expect_ids(tok, "added tokens split out first", "abc<x>ab", IDS(3, 2, 5, 3));
    char *text;
    size_t len;
    keel_status st = keel_tokenizer_decode_len(tok, IDS(0, 1, 5, 3), &text, &len);
    EXPECT(st == KEEL_OK && strcmp(text, "a b <x> ab") == 0, "no decoder joins with spaces: '%s'", text);
    keel_free(text);
    keel_tokenizer_free(tok);

    test_export(json);

    tok = load_ok("added_null_config", json, "{\"bos_token\": null}");
    if (tok) EXPECT(keel_tokenizer_bos_id(tok) == -1 && keel_tokenizer_eos_id(tok) == -1, "null BOS, absent EOS");
    keel_tokenizer_free(tok);
    expect_refused("config_unknown", json, "{\"bos_token\": \"<s>\"}", "bos_token '<s>' is not a token");
    expect_refused("config_broken", json, "{\"bos_token\": ", "tokenizer_config.json");
}

/* ---- many threads ------------------------------------------------------------ */

static const char *const LINES[] = {
    "Hello world, it's 2024!", "  two  spaces\tand a tab ", "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
    "bad \xff utf8", "aaaa bbbb abab", "", "1234567 numbers 89", "<x> special <x>",
};
#define N_LINES (sizeof LINES / sizeof LINES[0])

typedef struct {
    const keel_tokenizer *tok;
    keel_ids want[N_LINES];
    int mismatches;
} thread_job;

static void *encode_many(void *arg) {
    thread_job *job = arg;
    keel_ids ids = {0};
    for (int round = 0; round < 300; round++) {
        size_t i = (size_t)round % N_LINES;
        if (keel_tokenizer_encode(job->tok, LINES[i], strlen(LINES[i]), &ids) != KEEL_OK ||
            !same_ids(&ids, job->want[i].ids, job->want[i].n))
            job->mismatches++;
    }
    keel_ids_free(&ids);
    return NULL;
}

static void test_threads(void) {
    /* Llama 3's layout: the Split regex, then ByteLevel */
    static const char top[] =
        "\"added_tokens\": [{\"id\": 300, \"content\": \"<x>\", \"single_word\": false, \"lstrip\": false, "
        "\"rstrip\": false, \"normalized\": false, \"special\": true}], "
        "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
        "{\"Regex\": \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
        "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": "
        "\"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
        "\"use_regex\": false}]}, \"decoder\": {\"type\": \"ByteLevel\"}";
    /* every byte as its own token (the ByteLevel alphabet), a few merges */
    char vocab[8192] = "";
    int id = 0, n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : 256 + n++;
        snprintf(vocab + strlen(vocab), sizeof vocab - strlen(vocab), "%s\"\\u%04x\": %d", b ? ", " : "", cp, id++);
    }
    snprintf(vocab + strlen(vocab), sizeof vocab - strlen(vocab),
             ", \"aa\": %d, \"bb\": %d, \"ab\": %d, \"\\u0120w\": %d, \"or\": %d", id, id + 1, id + 2, id + 3, id + 4);
    const char *merges = "\"a a\", \"b b\", \"a b\", \"\\u0120 w\", \"o r\"";
    keel_tokenizer *tok = load_ok("threads", tokenizer_json(vocab, merges, NULL, top), NULL);
    if (!tok) return;
    thread_job jobs[4];
    for (int j = 0; j < 4; j++) {
        jobs[j] = (thread_job){.tok = tok};
        for (size_t i = 0; i < N_LINES; i++)
            EXPECT(keel_tokenizer_encode(tok, LINES[i], strlen(LINES[i]), &jobs[j].want[i]) == KEEL_OK,
                   "line %zu encodes", i);
    }
    /* decode(encode(x)) == x on the valid lines */
    for (size_t i = 0; i < N_LINES; i++) {
        if (strchr(LINES[i], '\xff')) continue;
        char *text;
        size_t len;
        keel_status st = keel_tokenizer_decode_len(tok, jobs[0].want[i].ids, jobs[0].want[i].n, &text, &len);
        EXPECT(st == KEEL_OK && len == strlen(LINES[i]) && memcmp(text, LINES[i], len) == 0,
               "decode(encode('%s')) gives it back: '%s'", LINES[i], text ? text : "");
        keel_free(text);
    }
    pthread_t threads[4];
    for (int j = 0; j < 4; j++) pthread_create(&threads[j], NULL, encode_many, &jobs[j]);
    int mismatches = 0;
    for (int j = 0; j < 4; j++) {
        pthread_join(threads[j], NULL);
        mismatches += jobs[j].mismatches;
        for (size_t i = 0; i < N_LINES; i++) keel_ids_free(&jobs[j].want[i]);
    }
    EXPECT(mismatches == 0, "4 threads encoding at once give the single thread's ids (%d mismatches)", mismatches);
    keel_tokenizer_free(tok);
}

/* ---- refusals ------------------------------------------------------------------- */

static void test_refusals(void) {
    expect_refused("duplicate_id", tokenizer_json("\"a\": 0, \"b\": 0", "", NULL, NULL), NULL, "both have id 0");
    expect_refused("sparse", tokenizer_json("\"a\": 0, \"b\": 9000000", "", NULL, NULL), NULL, "too sparse");
    expect_refused("negative_id", tokenizer_json("\"a\": -1", "", NULL, NULL), NULL, "model.vocab['a']");
    expect_refused("merge_unknown", tokenizer_json("\"a\": 0, \"b\": 1", "\"a b\"", NULL, NULL), NULL,
                   "merge 0: 'ab' is not in the vocabulary");
    expect_refused("merge_three", tokenizer_json(ABC_VOCAB, "\"a b c\"", NULL, NULL), NULL, "merge 0 is not two tokens");
    expect_refused("version", "{\"version\": \"2.0\", \"model\": {\"type\": \"BPE\"}}", NULL, "version");
    expect_refused("dropout2", "{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}}",
                   NULL, "dropout");
    expect_refused("prefix", tokenizer_json(ABC_VOCAB, "", "\"continuing_subword_prefix\": \"##\"", NULL), NULL,
                   "continuing_subword_prefix");
    expect_refused("decoder", tokenizer_json(ABC_VOCAB, "", NULL, "\"decoder\": {\"type\": \"WordPiece\"}"), NULL,
                   "decoder WordPiece is not supported");
    expect_refused("pre_tokenizer",
                   tokenizer_json(ABC_VOCAB, "", NULL, "\"pre_tokenizer\": {\"type\": \"Whitespace\"}"), NULL,
                   "pre_tokenizer Whitespace is not supported");
    expect_refused("behavior",
                   tokenizer_json(ABC_VOCAB, "", NULL,
                                  "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, "
                                  "\"behavior\": \"Sideways\", \"invert\": false}"),
                   NULL, "behavior must be one of");
    expect_refused("bad_regex",
                   tokenizer_json(ABC_VOCAB, "", NULL,
                                  "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a(b\"}, "
                                  "\"behavior\": \"Isolated\", \"invert\": false}"),
                   NULL, "regex is invalid: PCRE2: ");
    expect_refused("wordpiece", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", NULL,
                   "model type WordPiece is not supported");
    expect_refused("truncated", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\"", NULL, "not valid JSON");
    expect_refused("not_utf8", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\xff\": 0}, \"merges\": []}}", NULL,
                   "not valid UTF-8");
}

int main(void) {
    if (!temp_dir_create(tmp_dir, sizeof tmp_dir, "tokhf")) return 1;
    test_merges();
    test_unknown();
    test_added_and_config();
    test_threads();
    test_refusals();
    remove_tree(tmp_dir);
    return test_summary("test_tokenizer_hf");
}
