/* test_tokenizer_errors: bad .model files (missing, empty, garbage, truncated,
 * bit-flipped, invalid vocabularies, non-BPE) are rejected with KEEL_ERR_INPUT
 * and a one-line message; a small hand-built BPE model encodes to the ids
 * SentencePiece's algorithm gives (score order, leftmost ties, frozen
 * user-defined symbols, UNUSED re-splitting, byte fallback, unk runs) and
 * decode(encode(x)) == x for byte-fallback text. The match with spm_encode
 * on real models is tests/data/tokenizer_matches_spm.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/tokenizer.h"

#define TESTLIB_QUIET
#include "../testlib.h"

/* ---- a minimal protobuf writer for ModelProto ---------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_varint(buf *b, uint64_t v) {
    do {
        uint8_t c = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) c |= 0x80;
        put(b, &c, 1);
    } while (v);
}

static void put_key(buf *b, uint32_t field, uint32_t wire) {
    put_varint(b, (uint64_t)field << 3 | wire);
}
static void put_uint(buf *b, uint32_t field, uint64_t v) { put_key(b, field, 0), put_varint(b, v); }
static void put_bytes(buf *b, uint32_t field, const void *data, size_t n) {
    put_key(b, field, 2);
    put_varint(b, n);
    put(b, data, n);
}
static void put_str(buf *b, uint32_t field, const char *s) { put_bytes(b, field, s, strlen(s)); }
static void put_float(buf *b, uint32_t field, float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint8_t le[4] = {(uint8_t)bits, (uint8_t)(bits >> 8), (uint8_t)(bits >> 16),
                     (uint8_t)(bits >> 24)};
    put_key(b, field, 5);
    put(b, le, 4);
}
static void put_msg(buf *b, uint32_t field, buf *msg) {
    put_bytes(b, field, msg->p, msg->n);
    free(msg->p);
    *msg = (buf){0};
}

enum { NORMAL = 1, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE };

typedef struct {
    const char *piece;
    float score;
    int type;
} test_piece;

/* The test vocabulary. <unk> comes last so that every truncation of the file
 * loses it; bytes come just before it. ids: index in this table, then the
 * 256 byte pieces, then <unk>. */
static const test_piece VOCAB[] = {
    {"<s>", 0, CONTROL},
    {"</s>", 0, CONTROL},
    {"<sep>", 0, USER_DEFINED},
    {"\xe2\x96\x81", -10, NORMAL}, /* ▁ */
    {"a", -11, NORMAL},
    {"b", -12, NORMAL},
    {"c", -13, NORMAL},
    {"d", -14, NORMAL},
    {"\xc3\xa9", -15, NORMAL},     /* é */
    {"bc", -0.5f, NORMAL},
    {"\xe2\x96\x81" "a", -1, NORMAL},
    {"abc", -3, NORMAL},
    {"aa", -2, NORMAL},
    {"\xe2\x96\x81" "d", -2, NORMAL},
    {"dd", -2, NORMAL},
    {"ab", -4, NORMAL},
    {"abd", -0.1f, UNUSED},         /* formed from ab + d, then re-split */
    {"<sep>a", -0.2f, NORMAL},      /* never formed: <sep> is frozen */
};
#define N_VOCAB ((int)(sizeof VOCAB / sizeof VOCAB[0]))
#define BYTE_ID(b) (N_VOCAB + (b))
#define UNK_ID (N_VOCAB + 256)

static int vocab_id(const char *piece) {
    for (int i = 0; i < N_VOCAB; i++)
        if (strcmp(VOCAB[i].piece, piece) == 0) return i;
    fprintf(stderr, "test bug: no piece '%s'\n", piece);
    abort();
}

typedef struct {
    int model_type;          /* 2 = BPE */
    bool byte_fallback;
    bool with_bytes;         /* write the 256 <0xNN> pieces */
    int skip_byte;           /* byte piece left out, -1 = none */
    bool with_unk;
    const char *extra_piece; /* appended as NORMAL, NULL = none */
    int extra_type;
    const void *charsmap;    /* precompiled_charsmap bytes, NULL = identity */
    size_t charsmap_len;
} model_opts;

static model_opts default_opts(void) {
    return (model_opts){.model_type = 2, .byte_fallback = true, .with_bytes = true,
                        .skip_byte = -1, .with_unk = true, .extra_type = NORMAL};
}

static void put_piece(buf *b, const char *s, float score, int type) {
    buf p = {0};
    put_str(&p, 1, s);
    put_float(&p, 2, score);
    if (type != NORMAL) put_uint(&p, 3, (uint64_t)type);
    put_msg(b, 1, &p);
}

static buf build_model(const model_opts *o) {
    buf m = {0}, t = {0}, ns = {0};
    put_uint(&t, 3, (uint64_t)o->model_type);
    put_uint(&t, 4, 300);
    put_uint(&t, 35, o->byte_fallback);
    put_msg(&m, 2, &t);
    put_str(&ns, 1, o->charsmap ? "test" : "identity");
    if (o->charsmap) put_bytes(&ns, 2, o->charsmap, o->charsmap_len);
    put_uint(&ns, 3, 1); /* add_dummy_prefix */
    put_uint(&ns, 4, 1); /* remove_extra_whitespaces */
    put_uint(&ns, 5, 1); /* escape_whitespaces */
    put_msg(&m, 3, &ns);
    for (int i = 0; i < N_VOCAB; i++) put_piece(&m, VOCAB[i].piece, VOCAB[i].score, VOCAB[i].type);
    if (o->extra_piece) put_piece(&m, o->extra_piece, -20, o->extra_type);
    for (int b = 0; o->with_bytes && b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        if (b != o->skip_byte) put_piece(&m, name, 0, BYTE);
    }
    if (o->with_unk) put_piece(&m, "<unk>", 0, UNKNOWN);
    return m;
}

/* ---- files and captured stderr ------------------------------------------- */

static char tmp_dir[64];

static const char *write_file(const char *name, const void *data, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        abort();
    }
    return path;
}

/* Load path with stderr captured; returns the status and the line count of
 * what was printed (want exactly 1 on failure, 0 on success). */
static keel_status load_captured(const char *path, keel_tokenizer **tok, int *lines,
                                 char *msg, size_t msg_size) {
    capture_begin();
    keel_status st = keel_tokenizer_load(path, tok);
    const char *captured = capture_end();
    size_t n = strlen(captured) < msg_size - 1 ? strlen(captured) : msg_size - 1;
    memcpy(msg, captured, n); /* its first msg_size - 1 bytes */
    msg[n] = '\0';
    *lines = count_lines(msg);
    return st;
}

static void expect_rejected(const char *what, const void *data, size_t n) {
    const char *path = write_file("bad.model", data, n);
    keel_tokenizer *tok = (keel_tokenizer *)&tok; /* must be reset to NULL */
    int lines;
    char msg[1024];
    keel_status st = load_captured(path, &tok, &lines, msg, sizeof msg);
    EXPECT(st == KEEL_ERR_INPUT, "%s: status %d, want KEEL_ERR_INPUT", what, (int)st);
    EXPECT(tok == NULL, "%s: *out not NULL on failure", what);
    EXPECT(lines == 1, "%s: %d lines of error, want 1: %s", what, lines, msg);
    EXPECT(strstr(msg, path) != NULL, "%s: message does not name the file: %s", what, msg);
    if (st == KEEL_OK) keel_tokenizer_free(tok);
}

static keel_tokenizer *load_ok(const model_opts *o) {
    buf m = build_model(o);
    const char *path = write_file("good.model", m.p, m.n);
    free(m.p);
    keel_tokenizer *tok = NULL;
    int lines;
    char msg[1024];
    keel_status st = load_captured(path, &tok, &lines, msg, sizeof msg);
    EXPECT(st == KEEL_OK && lines == 0, "loading the test model: status %d: %s", (int)st, msg);
    return st == KEEL_OK ? tok : NULL;
}

/* ---- error tests ----------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static void test_missing_and_garbage(void) {
    keel_tokenizer *tok = (keel_tokenizer *)&tok;
    int lines;
    char msg[1024];
    const char *missing = "/nonexistent-dir/tokenizer.model";
    EXPECT(load_captured(missing, &tok, &lines, msg, sizeof msg) == KEEL_ERR_INPUT,
           "missing file accepted");
    EXPECT(tok == NULL && lines == 1 && strstr(msg, missing), "missing file: %s", msg);
    EXPECT(load_captured(tmp_dir, &tok, &lines, msg, sizeof msg) == KEEL_ERR_INPUT,
           "a directory accepted");

    expect_rejected("empty file", "", 0);
    const char *text = "This is a README, not a SentencePiece model.\n";
    expect_rejected("text file", text, strlen(text));
    uint8_t junk[4096];
    for (int round = 0; round < 64; round++) {
        size_t n = 1 + rng() % sizeof junk;
        for (size_t i = 0; i < n; i++) junk[i] = (uint8_t)rng();
        expect_rejected("random bytes", junk, n);
    }
}

static void test_truncated(void) {
    model_opts o = default_opts();
    buf m = build_model(&o);
    for (size_t n = 0; n < m.n; n++) {
        char what[96];
        snprintf(what, sizeof what, "model truncated to %zu of %zu bytes", n, m.n);
        expect_rejected(what, m.p, n);
        if (failures > 20) break;
    }
    free(m.p);
}

/* Every single-byte corruption must load cleanly or be rejected; never crash
 * (run under ASan in `make test`). */
static void test_corrupted_bytes(void) {
    model_opts o = default_opts();
    buf m = build_model(&o);
    for (size_t i = 0; i < m.n; i++) {
        uint8_t saved = m.p[i];
        m.p[i] ^= (uint8_t)(1u << (i % 8)) | 0x80;
        const char *path = write_file("flipped.model", m.p, m.n);
        keel_tokenizer *tok = NULL;
        int lines;
        char msg[1024];
        keel_status st = load_captured(path, &tok, &lines, msg, sizeof msg);
        EXPECT(st == KEEL_OK || (st == KEEL_ERR_INPUT && lines == 1),
               "byte %zu flipped: status %d, %d lines", i, (int)st, lines);
        if (st == KEEL_OK) {
            keel_ids ids = {0};
            const char *s = "abc d\xc3\xa9 <sep>dd \xe4\xb8\xad";
            keel_tokenizer_encode(tok, s, strlen(s), &ids);
            char *text = NULL;
            keel_tokenizer_decode(tok, ids.ids, ids.n, &text);
            free(text);
            keel_ids_free(&ids);
            keel_tokenizer_free(tok);
        }
        m.p[i] = saved;
    }
    free(m.p);
}

static void test_invalid_vocab(void) {
    struct {
        const char *what;
        model_opts o;
    } cases[] = {
        {"unigram model", default_opts()}, {"char model", default_opts()},
        {"no model_type", default_opts()}, {"no unk", default_opts()},
        {"two unks", default_opts()},      {"duplicate piece", default_opts()},
        {"empty piece", default_opts()},   {"byte pieces without byte_fallback", default_opts()},
        {"missing byte piece", default_opts()}, {"unknown piece type", default_opts()},
        {"bad byte piece", default_opts()}, {"charsmap too short", default_opts()},
        {"charsmap trie past end", default_opts()},
    };
    cases[0].o.model_type = 1;
    cases[1].o.model_type = 4;
    cases[2].o.model_type = 0; /* written as 0: neither BPE nor the default */
    cases[3].o.with_unk = false;
    cases[4].o.extra_piece = "<unk2>", cases[4].o.extra_type = UNKNOWN;
    cases[5].o.extra_piece = "bc";
    cases[6].o.extra_piece = "";
    cases[7].o.byte_fallback = false;
    cases[8].o.skip_byte = 0xA9;
    cases[9].o.extra_piece = "zz", cases[9].o.extra_type = 9;
    cases[10].o.extra_piece = "<0xZZ>", cases[10].o.extra_type = BYTE;
    static const uint8_t short_map[] = {1, 0, 0};
    cases[11].o.charsmap = short_map, cases[11].o.charsmap_len = sizeof short_map;
    static const uint8_t long_trie[] = {0xff, 0, 0, 0, 1, 2, 3, 4, 5, 6};
    cases[12].o.charsmap = long_trie, cases[12].o.charsmap_len = sizeof long_trie;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        buf m = build_model(&cases[i].o);
        expect_rejected(cases[i].what, m.p, m.n);
        free(m.p);
    }
    /* a wire-type mismatch inside a piece */
    buf m = {0}, p = {0};
    put_uint(&p, 1, 7); /* piece as a varint */
    put_msg(&m, 1, &p);
    expect_rejected("piece with wrong wire type", m.p, m.n);
    free(m.p);
}

/* A charsmap of random units and replacement bytes must never make the
 * normalizer read outside the model. */
static void test_random_charsmap(void) {
    for (int round = 0; round < 32; round++) {
        uint8_t map[4 + 4 * 64 + 48];
        uint32_t trie_bytes = 4 * 64;
        memcpy(map, &trie_bytes, 4); /* little-endian host */
        for (size_t i = 4; i < sizeof map; i++) map[i] = (uint8_t)rng();
        if (round % 2) map[4 + 4 * 64 + 47] = 0;
        model_opts o = default_opts();
        o.charsmap = map;
        o.charsmap_len = sizeof map;
        keel_tokenizer *tok = load_ok(&o);
        if (!tok) continue;
        char text[200];
        for (size_t i = 0; i < sizeof text; i++) text[i] = (char)rng();
        keel_ids ids = {0};
        EXPECT(keel_tokenizer_encode(tok, text, sizeof text, &ids) == KEEL_OK, "random charsmap");
        keel_ids_free(&ids);
        keel_tokenizer_free(tok);
    }
}

/* ---- encode / decode ------------------------------------------------------- */

static void expect_ids(const keel_tokenizer *tok, const char *text, const int32_t *want,
                       size_t n_want) {
    keel_ids ids = {0};
    EXPECT(keel_tokenizer_encode(tok, text, strlen(text), &ids) == KEEL_OK, "encode '%s'", text);
    bool same = ids.n == n_want && (n_want == 0 || memcmp(ids.ids, want, n_want * 4) == 0);
    if (!same) {
        char got[512] = "", exp[512] = "";
        for (size_t i = 0; i < ids.n && strlen(got) < 480; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), " %d", ids.ids[i]);
        for (size_t i = 0; i < n_want && strlen(exp) < 480; i++)
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), " %d", want[i]);
        EXPECT(same, "encode '%s': got [%s ] want [%s ]", text, got, exp);
    }
    keel_ids_free(&ids);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / 4

static void test_encode(void) {
    model_opts o = default_opts();
    keel_tokenizer *tok = load_ok(&o);
    if (!tok) return;
    EXPECT(keel_tokenizer_vocab_size(tok) == N_VOCAB + 257, "vocab %d",
           keel_tokenizer_vocab_size(tok));
    EXPECT(keel_tokenizer_bos_id(tok) == 0 && keel_tokenizer_eos_id(tok) == 1, "bos %d eos %d",
           keel_tokenizer_bos_id(tok), keel_tokenizer_eos_id(tok));
    int sp = vocab_id("\xe2\x96\x81"), a = vocab_id("a"), c = vocab_id("c"), d = vocab_id("d");
    int sp_a = vocab_id("\xe2\x96\x81" "a"), bc = vocab_id("bc"), aa = vocab_id("aa");
    int ab = vocab_id("ab"), dd = vocab_id("dd"), sep = vocab_id("<sep>");
    int e_acute = vocab_id("\xc3\xa9");

    /* "bc" (-0.5) beats "▁a" (-1); "abc" can no longer form once ▁a took the a */
    expect_ids(tok, "abc", IDS(sp_a, bc));
    expect_ids(tok, "aaa", IDS(sp_a, aa));
    /* ties go to the leftmost pair: ▁d (-2) before dd (-2) */
    expect_ids(tok, "dd", IDS(vocab_id("\xe2\x96\x81" "d"), d));
    expect_ids(tok, "ddd", IDS(vocab_id("\xe2\x96\x81" "d"), dd));
    /* whitespace: leading/trailing/duplicate spaces are removed */
    expect_ids(tok, "  abc   abc ", IDS(sp_a, bc, sp_a, bc));
    expect_ids(tok, "", NULL, 0);
    expect_ids(tok, "   ", NULL, 0);
    /* UNUSED "abd" (-0.1) forms from ab + d and is split back into them */
    expect_ids(tok, "cabd", IDS(sp, c, ab, d));
    /* user-defined symbols are never merged and need no surrounding space */
    expect_ids(tok, "a<sep>a", IDS(sp_a, sep, a));
    /* unknown characters fall back to UTF-8 bytes; known é stays a piece */
    expect_ids(tok, "\xc3\xa9\xe4\xb8\xad",
               IDS(sp, e_acute, BYTE_ID(0xE4), BYTE_ID(0xB8), BYTE_ID(0xAD)));
    /* control pieces in text are plain characters */
    expect_ids(tok, "<s>", IDS(sp, BYTE_ID('<'), BYTE_ID('s'), BYTE_ID('>')));
    /* malformed UTF-8 becomes U+FFFD (EF BF BD) per bad byte */
    expect_ids(tok, "a\xff", IDS(sp_a, BYTE_ID(0xEF), BYTE_ID(0xBF), BYTE_ID(0xBD)));
    keel_tokenizer_free(tok);

    /* without byte fallback a run of unknown pieces is one unk */
    o.byte_fallback = false;
    o.with_bytes = false;
    tok = load_ok(&o);
    if (!tok) return;
    int unk = keel_tokenizer_vocab_size(tok) - 1;
    expect_ids(tok, "a\xe4\xb8\xad\xe6\x96\x87x d", IDS(sp_a, unk, vocab_id("\xe2\x96\x81" "d")));
    expect_ids(tok, "\xe4\xb8\xad c", IDS(sp, unk, sp, c));
    keel_tokenizer_free(tok);
}

static void expect_decode(const keel_tokenizer *tok, const int32_t *ids, size_t n,
                          const char *want) {
    char *text = NULL;
    EXPECT(keel_tokenizer_decode(tok, ids, n, &text) == KEEL_OK, "decode");
    EXPECT(text && strcmp(text, want) == 0, "decode: got '%s' want '%s'", text ? text : "(null)",
           want);
    free(text);
}

static void test_decode(void) {
    model_opts o = default_opts();
    keel_tokenizer *tok = load_ok(&o);
    if (!tok) return;
    int sp = vocab_id("\xe2\x96\x81"), sp_a = vocab_id("\xe2\x96\x81" "a"), bc = vocab_id("bc");
    expect_decode(tok, IDS(0, sp_a, bc, sp_a, 1), "abc a");
    expect_decode(tok, IDS(sp, sp, sp_a), "a"); /* all leading spaces go */
    expect_decode(tok, IDS(UNK_ID, bc), " \xe2\x81\x87 bc");
    expect_decode(tok, IDS(BYTE_ID(0xE4), BYTE_ID(0xB8), BYTE_ID(0xAD), bc), "\xe4\xb8\xad" "bc");
    expect_decode(tok, IDS(BYTE_ID(0xE4), BYTE_ID(0xB8), bc, BYTE_ID(0xFF)),
                  "\xef\xbf\xbd\xef\xbf\xbd" "bc" "\xef\xbf\xbd");
    expect_decode(tok, NULL, 0, "");

    char *text = (char *)&text;
    int32_t bad[] = {sp, keel_tokenizer_vocab_size(tok)};
    capture_begin(); /* the two error lines are not checked */
    keel_status st = keel_tokenizer_decode(tok, bad, 2, &text);
    int32_t negative = -1;
    keel_status st2 = keel_tokenizer_decode(tok, &negative, 1, &text);
    capture_end();
    EXPECT(st == KEEL_ERR_INPUT && st2 == KEEL_ERR_INPUT && text == NULL,
           "out-of-range ids: status %d %d", (int)st, (int)st2);

    int32_t nul_ids[] = {sp_a, BYTE_ID(0), bc};
    size_t len = 0;
    EXPECT(keel_tokenizer_decode_len(tok, nul_ids, 3, &text, &len) == KEEL_OK && len == 4 &&
               memcmp(text, "a\0bc", 4) == 0,
           "decode keeps NUL bytes (len %zu)", len);
    free(text);
    keel_tokenizer_free(tok);
}

/* Append one random code point of a class as UTF-8. */
static size_t random_char(char *out) {
    static const uint32_t ranges[][2] = {
        {'a', 'd'}, {'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {0xC0, 0x17F}, {0x391, 0x3C9},
        {0x4E00, 0x4FFF}, {0x1F600, 0x1F64F}, {0xE9, 0xE9}, {'!', '/'},
    };
    size_t r = rng() % (sizeof ranges / sizeof ranges[0]);
    uint32_t cp = ranges[r][0] + rng() % (ranges[r][1] - ranges[r][0] + 1);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Text already in normal form (single spaces, none at the ends) survives
 * encode then decode byte for byte. */
static void test_round_trip(void) {
    model_opts o = default_opts();
    keel_tokenizer *tok = load_ok(&o);
    if (!tok) return;
    keel_ids ids = {0};
    for (int round = 0; round < 2000; round++) {
        char text[1024];
        size_t n = 0;
        int words = 1 + (int)(rng() % 12);
        for (int w = 0; w < words; w++) {
            if (w) text[n++] = ' ';
            int chars = 1 + (int)(rng() % 8);
            for (int c = 0; c < chars; c++) n += random_char(text + n);
            if (rng() % 5 == 0) n += (size_t)sprintf(text + n, "<sep>");
        }
        text[n] = '\0';
        EXPECT(keel_tokenizer_encode(tok, text, n, &ids) == KEEL_OK, "encode");
        char *back = NULL;
        EXPECT(keel_tokenizer_decode(tok, ids.ids, ids.n, &back) == KEEL_OK, "decode");
        EXPECT(back && strcmp(back, text) == 0, "round trip: '%s' -> '%s'", text,
               back ? back : "(null)");
        free(back);
        if (failures > 20) break;
    }
    keel_ids_free(&ids);
    keel_tokenizer_free(tok);
}

int main(void) {
    if (!temp_dir_create(tmp_dir, sizeof tmp_dir, "tok")) return 1;
    test_missing_and_garbage();
    test_truncated();
    test_corrupted_bytes();
    test_invalid_vocab();
    test_random_charsmap();
    test_encode();
    test_decode();
    test_round_trip();
    remove_tree(tmp_dir);
    return test_summary("test_tokenizer_errors");
}
