/* The token-shard file format: exact header bytes, round trips at both token
 * widths, and that every kind of damage is refused with a message that says
 * what is wrong; writes are atomic. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>
#include <xxhash.h>

#include "keel/data.h"

#define TESTLIB_QUIET
#include "../testlib.h"

static char tmpdir[64];

#define PATH_BYTES 256
static void tmp_path(char *out, const char *name) { snprintf(out, PATH_BYTES, "%s/%s", tmpdir, name); }

/* ---- errors are one line, and their words matter ------------------------- */

/* Open `path` expecting failure; returns the captured message. */
static const char *open_fails(const char *path) {
    keel_shard *s = NULL;
    capture_begin();
    keel_status st = keel_shard_open(path, &s);
    const char *msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT, "%s opened with status %d", path, (int)st);
    EXPECT(s == NULL, "no shard on failure");
    EXPECT(count_lines(msg) == 1, "one-line error, got: %s", msg);
    EXPECT(strstr(msg, path) != NULL, "error names the file: %s", msg);
    keel_shard_close(s);
    return msg;
}

/* ---- file helpers --------------------------------------------------------- */

static size_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
}

static uint8_t *read_all(const char *path, size_t *bytes) {
    *bytes = file_size(path);
    uint8_t *buf = malloc(*bytes + 1);
    FILE *f = fopen(path, "rb");
    if (!f || fread(buf, 1, *bytes, f) != *bytes) *bytes = 0;
    if (f) fclose(f);
    return buf;
}

static void write_all(const char *path, const void *buf, size_t bytes) {
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, bytes, f);
    fclose(f);
}

static uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Rewrite a shard's checksum to match its (edited) payload. */
static void fix_checksum(uint8_t *file, size_t bytes) {
    put_le(file + 32, XXH3_64bits(file + 64, bytes - 64), 8);
}

static int32_t *random_tokens(uint64_t n, uint32_t vocab, uint64_t seed) {
    int32_t *t = malloc(n * sizeof *t + 1);
    uint64_t x = seed;
    for (uint64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((x >> 33) % vocab);
    }
    if (n > 1) t[n - 1] = (int32_t)(vocab - 1); /* the largest id must survive */
    return t;
}

/* ---- tests ---------------------------------------------------------------- */

static void test_round_trip(uint32_t vocab, uint64_t n, int token_bytes) {
    char path[PATH_BYTES];
    tmp_path(path, "rt.bin");
    int32_t *tokens = random_tokens(n, vocab, vocab + n);
    EXPECT(keel_shard_write(path, tokens, NULL, 0, n, vocab) == KEEL_OK, "write vocab %u", vocab);

    size_t bytes;
    uint8_t *file = read_all(path, &bytes);
    EXPECT(bytes == 64 + n * (uint64_t)token_bytes, "size %zu for %lu tokens of %d bytes", bytes,
           (unsigned long)n, token_bytes);
    EXPECT(memcmp(file, "KEELTOK1", 8) == 0, "magic");
    EXPECT(get_le(file + 8, 4) == 1, "version");
    EXPECT(get_le(file + 12, 4) == (uint64_t)token_bytes, "token_bytes %lu",
           (unsigned long)get_le(file + 12, 4));
    EXPECT(get_le(file + 16, 8) == n, "n_tokens");
    EXPECT(get_le(file + 24, 4) == vocab, "vocab_size");
    EXPECT(get_le(file + 28, 4) == 0, "reserved");
    EXPECT(get_le(file + 32, 8) == XXH3_64bits(file + 64, bytes - 64), "checksum is XXH3-64");
    for (int i = 40; i < 64; i++) EXPECT(file[i] == 0, "padding byte %d", i);
    bool payload_ok = true;
    for (uint64_t i = 0; i < n && bytes; i++)
        payload_ok &= get_le(file + 64 + i * token_bytes, token_bytes) == (uint64_t)tokens[i];
    EXPECT(payload_ok, "payload is little-endian ids");
    free(file);

    keel_shard *s = NULL;
    EXPECT(keel_shard_open(path, &s) == KEEL_OK, "open");
    if (s) {
        EXPECT(keel_shard_n_tokens(s) == n, "n_tokens");
        EXPECT(keel_shard_vocab_size(s) == vocab, "vocab_size");
        int32_t *back = malloc(n * sizeof *back + 1);
        keel_shard_read(s, 0, n, back);
        EXPECT(n == 0 || memcmp(back, tokens, n * sizeof *back) == 0, "round trip");
        if (n > 10) {
            keel_shard_read(s, n / 2, 7, back);
            EXPECT(memcmp(back, tokens + n / 2, 7 * sizeof *back) == 0, "read from the middle");
        }
        free(back);
        keel_shard_close(s);
    }
    free(tokens);
    unlink(path);
}

/* A valid shard file in memory, to damage. */
static uint8_t *valid_file(size_t *bytes) {
    char path[PATH_BYTES];
    tmp_path(path, "good.bin");
    int32_t *tokens = random_tokens(1000, 100, 5);
    keel_shard_write(path, tokens, NULL, 0, 1000, 100);
    free(tokens);
    uint8_t *file = read_all(path, bytes);
    unlink(path);
    return file;
}

static void test_damage(void) {
    size_t bytes;
    uint8_t *file = valid_file(&bytes);
    char path[PATH_BYTES];
    tmp_path(path, "bad.bin");
    const char *msg;

    file[64 + 500] ^= 0x01; /* one flipped bit in the payload */
    write_all(path, file, bytes);
    msg = open_fails(path);
    EXPECT(strstr(msg, "checksum") != NULL, "flipped payload byte: %s", msg);
    file[64 + 500] ^= 0x01;

    file[33] ^= 0x10; /* flipped bit in the stored checksum */
    write_all(path, file, bytes);
    msg = open_fails(path);
    EXPECT(strstr(msg, "checksum") != NULL, "flipped checksum byte: %s", msg);
    file[33] ^= 0x10;

    write_all(path, file, bytes - 3);
    msg = open_fails(path);
    char expected[64], actual[64];
    snprintf(expected, sizeof expected, "%zu bytes", bytes);
    snprintf(actual, sizeof actual, "%zu bytes", bytes - 3);
    EXPECT(strstr(msg, "truncated") && strstr(msg, expected) && strstr(msg, actual),
           "truncated payload names expected %s and actual %s: %s", expected, actual, msg);

    write_all(path, file, 30);
    msg = open_fails(path);
    EXPECT(strstr(msg, "truncated") != NULL, "truncated header: %s", msg);

    write_all(path, file, bytes);
    FILE *f = fopen(path, "ab");
    fputs("junk", f);
    fclose(f);
    msg = open_fails(path);
    EXPECT(strstr(msg, "bytes") != NULL, "trailing data: %s", msg);

    put_le(file + 8, 3, 4); /* 1 and 2 (with bitmaps) are known */
    write_all(path, file, bytes);
    msg = open_fails(path);
    EXPECT(strstr(msg, "version 3") != NULL, "unknown version: %s", msg);
    put_le(file + 8, 1, 4);

    put_le(file + 28, KEEL_SHARD_FLAG_LOSS_MASK, 4); /* a mask flag in a version 1 file */
    write_all(path, file, bytes);
    msg = open_fails(path);
    EXPECT(strstr(msg, "flags") != NULL, "flags in version 1: %s", msg);
    put_le(file + 28, 0, 4);

    put_le(file + 12, 3, 4);
    write_all(path, file, bytes);
    msg = open_fails(path);
    EXPECT(strstr(msg, "token_bytes") != NULL, "bad token width: %s", msg);
    put_le(file + 12, 2, 4);

    /* An id past the vocabulary with a consistent checksum: only the id scan
     * can catch it. */
    put_le(file + 64 + 2 * 777, 150, 2);
    fix_checksum(file, bytes);
    write_all(path, file, bytes);
    msg = open_fails(path);
    EXPECT(strstr(msg, "token id 150") && strstr(msg, "777") && strstr(msg, "100"),
           "id >= vocab names the id, position and vocab: %s", msg);

    const char *foreign = "This is a text file, not a token shard at all. It is long enough "
                          "to hold a header.\n";
    write_all(path, foreign, strlen(foreign));
    msg = open_fails(path);
    EXPECT(strstr(msg, "not a keel token shard (bad magic)") &&
               strstr(msg, "keel data prepare"),
           "foreign file: %s", msg);

    write_all(path, "", 0);
    msg = open_fails(path);
    EXPECT(strstr(msg, "bad magic") != NULL, "empty file: %s", msg);

    unlink(path);
    tmp_path(path, "does-not-exist.bin");
    msg = open_fails(path);
    EXPECT(strstr(msg, "No such file") != NULL, "missing file: %s", msg);
    free(file);
}

/* Bitmaps: version 2, the stored flags in the header, a bit per token after
 * the ids for each (loss mask, then document starts; in the checksum), read
 * back as KEEL_TOKEN_* bytes with defaults for what is not stored; damage
 * refused. */
static void test_bitmaps(uint64_t n, uint32_t stored) {
    char path[PATH_BYTES];
    tmp_path(path, "flags.bin");
    int32_t *tokens = random_tokens(n, 300, n);
    uint8_t *flags = malloc(n + 1), *back = malloc(n + 1);
    for (uint64_t i = 0; i < n; i++) /* any other bits are not stored */
        flags[i] = (uint8_t)(((i * 7 + i / 5) % 3 ? KEEL_TOKEN_TRAIN : 0) | (i % 11 == 3 ? KEEL_TOKEN_DOC_START : 0) |
                             (i % 4 == 1 ? 0x40 : 0));
    EXPECT(keel_shard_write(path, tokens, flags, stored, n, 300) == KEEL_OK, "write %lu tokens, bitmaps %u",
           (unsigned long)n, stored);
    size_t bytes;
    uint8_t *file = read_all(path, &bytes);
    int maps = (stored & 1) + (stored >> 1 & 1);
    uint64_t map_bytes = (n + 7) / 8;
    EXPECT(bytes == 64 + 2 * n + maps * map_bytes, "size %zu: header, ids, %d bitmaps of %lu bytes", bytes, maps,
           (unsigned long)map_bytes);
    EXPECT(get_le(file + 8, 4) == 2 && get_le(file + 28, 4) == stored, "version 2, stored %u", stored);
    EXPECT(get_le(file + 32, 8) == XXH3_64bits(file + 64, bytes - 64), "the checksum covers the bitmaps");
    bool bits_ok = true;
    const uint8_t *map = file + 64 + 2 * n;
    for (int b = 0; b < 2; b++) {
        if (!(stored >> b & 1)) continue;
        uint8_t flag = b ? KEEL_TOKEN_DOC_START : KEEL_TOKEN_TRAIN;
        for (uint64_t i = 0; i < n; i++) bits_ok &= (map[i / 8] >> (i % 8) & 1) == ((flags[i] & flag) != 0);
        map += map_bytes;
    }
    EXPECT(bits_ok, "bit i %% 8 of byte i / 8 is token i's, loss mask first");
    keel_shard *s = NULL;
    EXPECT(keel_shard_open(path, &s) == KEEL_OK, "open");
    if (s) {
        EXPECT(keel_shard_stored(s) == stored, "stored %u", keel_shard_stored(s));
        keel_shard_read_flags(s, n / 3, n - n / 3, back);
        bool same = true;
        for (uint64_t i = n / 3; i < n; i++) {
            uint8_t want = (uint8_t)((stored & KEEL_SHARD_FLAG_LOSS_MASK ? flags[i] & KEEL_TOKEN_TRAIN : KEEL_TOKEN_TRAIN) |
                                     (stored & KEEL_SHARD_FLAG_DOC_STARTS ? flags[i] & KEEL_TOKEN_DOC_START : 0));
            same &= back[i - n / 3] == want;
        }
        EXPECT(same, "flags read back from an unaligned middle, defaults where not stored");
        keel_shard_close(s);
    }
    if (n % 8) { /* a padding bit set, checksum fixed: only the padding check can catch it */
        file[bytes - 1] |= 0x80;
        fix_checksum(file, bytes);
        write_all(path, file, bytes);
        const char *msg = open_fails(path);
        EXPECT(strstr(msg, "past the last token") != NULL, "padding bit set: %s", msg);
        file[bytes - 1] &= 0x7f;
        fix_checksum(file, bytes);
    }
    write_all(path, file, bytes - 1);
    const char *msg = open_fails(path);
    EXPECT(strstr(msg, "truncated") && strstr(msg, "flags"), "truncated bitmap: %s", msg);
    file[64 + 2 * n + 1] ^= 0x04;
    write_all(path, file, bytes);
    msg = open_fails(path);
    EXPECT(strstr(msg, "checksum") != NULL, "a flipped bitmap bit: %s", msg);
    file[64 + 2 * n + 1] ^= 0x04;
    put_le(file + 28, 4, 4); /* an unknown bitmap */
    write_all(path, file, bytes);
    msg = open_fails(path);
    EXPECT(strstr(msg, "flags") != NULL, "an unknown bitmap flag: %s", msg);
    unlink(path);
    free(file), free(tokens), free(flags), free(back);
}

/* Without bitmaps the tokens are a version 1 file: every target trained, no document start. */
static void test_no_bitmaps(void) {
    char path[PATH_BYTES];
    tmp_path(path, "plain.bin");
    int32_t *tokens = random_tokens(100, 300, 9);
    uint8_t back[100];
    keel_shard *s = NULL;
    EXPECT(keel_shard_write(path, tokens, NULL, 0, 100, 300) == KEEL_OK && keel_shard_open(path, &s) == KEEL_OK &&
               keel_shard_stored(s) == 0,
           "no bitmaps");
    if (s) {
        keel_shard_read_flags(s, 0, 100, back);
        bool ones = true;
        for (int i = 0; i < 100; i++) ones &= back[i] == KEEL_TOKEN_TRAIN;
        EXPECT(ones, "a shard without bitmaps trains every target and starts no document");
        keel_shard_close(s);
    }
    unlink(path);
    free(tokens);
}

static bool dir_holds_only(const char *only) {
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    bool ok = true;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (!only || strcmp(e->d_name, only) != 0) {
            fprintf(stderr, "unexpected file %s\n", e->d_name);
            ok = false;
        }
    }
    closedir(d);
    return ok;
}

static void test_atomic_write(void) {
    char path[PATH_BYTES], bad_path[PATH_BYTES];
    tmp_path(path, "atomic.bin");
    tmp_path(bad_path, "no/such/dir/x.bin");
    int32_t *first = random_tokens(5000, 300, 1), *second = random_tokens(9000, 300, 2);
    EXPECT(keel_shard_write(path, first, NULL, 0, 5000, 300) == KEEL_OK, "first write");
    EXPECT(dir_holds_only("atomic.bin"), "no temporary file after a write");
    EXPECT(keel_shard_write(path, second, NULL, 0, 9000, 300) == KEEL_OK, "overwrite");
    EXPECT(file_size(path) == 64 + 2 * 9000, "overwrite replaced the file");
    size_t old_bytes;
    uint8_t *old = read_all(path, &old_bytes);

    /* A write that fails half way (file size limit) must leave the old file
     * as it was and no temporary behind. */
    struct rlimit saved, small = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
    getrlimit(RLIMIT_FSIZE, &saved);
    small.rlim_max = saved.rlim_max;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &small);
    capture_begin();
    keel_status st = keel_shard_write(path, first, NULL, 0, 5000, 300);
    const char *msg = capture_end();
    setrlimit(RLIMIT_FSIZE, &saved);
    EXPECT(st == KEEL_ERR_IO, "failed write returns KEEL_ERR_IO, got %d", (int)st);
    EXPECT(count_lines(msg) == 1 && strstr(msg, path), "one line naming the file: %s", msg);
    size_t now_bytes;
    uint8_t *now = read_all(path, &now_bytes);
    EXPECT(now_bytes == old_bytes && memcmp(now, old, old_bytes) == 0, "old file untouched");
    EXPECT(dir_holds_only("atomic.bin"), "no temporary file after a failed write");
    free(now);
    free(old);

    /* Ids outside the vocabulary are refused before anything is written. */
    int32_t bad[3] = {1, 300, 2};
    unlink(path);
    capture_begin();
    st = keel_shard_write(path, bad, NULL, 0, 3, 300);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && strstr(msg, "300"), "id >= vocab refused: %s", msg);
    bad[1] = -1;
    capture_begin();
    st = keel_shard_write(path, bad, NULL, 0, 3, 300);
    capture_end();
    EXPECT(st == KEEL_ERR_INPUT, "negative id refused");
    EXPECT(dir_holds_only(NULL), "nothing written for bad ids");

    capture_begin();
    st = keel_shard_write(bad_path, first, NULL, 0, 10, 300);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_IO && count_lines(msg) == 1, "unwritable path: %s", msg);
    free(first);
    free(second);
}

static void test_names(void) {
    uint64_t index = 99;
    EXPECT(keel_shard_name_parse("train-00000.bin", "train", &index) && index == 0, "00000");
    EXPECT(keel_shard_name_parse("val-00012.bin", "val", &index) && index == 12, "val 12");
    EXPECT(keel_shard_name_parse("train-123456.bin", "train", &index) && index == 123456, "6");
    EXPECT(!keel_shard_name_parse("train-000001.bin", "train", &index), "non-canonical");
    EXPECT(!keel_shard_name_parse("train-0001.bin", "train", &index), "4 digits");
    EXPECT(!keel_shard_name_parse("val-00000.bin", "train", &index), "other split");
    EXPECT(!keel_shard_name_parse("train-00000.bin.tmp.42", "train", &index), "temporary");
    EXPECT(!keel_shard_name_parse("train-00000.binx", "train", &index), "suffix");
    char name[64];
    snprintf(name, sizeof name, KEEL_SHARD_NAME_FMT, "train", (uint64_t)7);
    EXPECT(strcmp(name, "train-00007.bin") == 0, "format %s", name);
}

int main(void) {
    if (!temp_dir_create(tmpdir, sizeof tmpdir, "shard")) return 1;
    test_round_trip(1000, 100003, 2); /* spans several write chunks */
    test_round_trip(65536, 4000, 2);  /* largest vocabulary with 2-byte ids */
    test_round_trip(65537, 4000, 4);
    test_round_trip(200000, 70000, 4);
    test_round_trip(50, 0, 2); /* an empty shard is still a valid file */
    test_damage();
    test_bitmaps(1003, KEEL_SHARD_FLAG_LOSS_MASK);                               /* padding bits */
    test_bitmaps(1003, KEEL_SHARD_FLAG_DOC_STARTS);
    test_bitmaps(131072, KEEL_SHARD_FLAG_LOSS_MASK | KEEL_SHARD_FLAG_DOC_STARTS); /* two write chunks */
    test_bitmaps(77, KEEL_SHARD_FLAG_LOSS_MASK | KEEL_SHARD_FLAG_DOC_STARTS);
    test_no_bitmaps();
    test_atomic_write();
    test_names();
    remove_tree(tmpdir);
    return test_summary("test_shard_format");
}
