/* data/shard.c: the token-shard file — a 64-byte header, then n_tokens ids
 * and, in version 2, bitmaps of per-token flags.
 *
 * Layout (all integers little-endian):
 *   0  char[8] magic "KEELTOK1"      24  u32 vocab_size
 *   8  u32 version (1 or 2)          28  u32 stored bitmaps (version 1: 0)
 *  12  u32 token_bytes (2 or 4)      32  u64 XXH3-64 of the payload
 *  16  u64 n_tokens                  40  zero padding up to byte 64
 *  64  payload: n_tokens ids of token_bytes each, then for each bitmap stored,
 *      in this order, ceil(n_tokens / 8) bytes — bit i % 8 of byte i / 8 is
 *      token i's, the padding bits 0:
 *        1 (KEEL_SHARD_FLAG_LOSS_MASK)  token i is trained on as a target
 *        2 (KEEL_SHARD_FLAG_DOC_STARTS) token i starts a document
 * A shard with no bitmap is written as version 1. Files are written
 * atomically and verified completely when opened, so a training run never
 * reads a torn or damaged shard. */
#include "keel/data.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 8,
    OFF_TOKEN_BYTES = 12,
    OFF_N_TOKENS = 16,
    OFF_VOCAB = 24,
    OFF_FLAGS = 28,
    OFF_CHECKSUM = 32,
};

#define WRITE_CHUNK_TOKENS 65536

struct keel_shard {
    char *path;
    void *map;              /* the whole file, read-only */
    size_t map_bytes;
    const uint8_t *payload; /* map + 64 */
    const uint8_t *bitmap[2]; /* the loss mask's and the document starts' (after the ids), or NULL */
    uint64_t n_tokens;
    uint32_t token_bytes;
    uint32_t vocab_size;
    uint32_t version, flags;
};

#define MASK_BYTES(n) (((n) + 7) / 8)
#define KNOWN_BITMAPS (KEEL_SHARD_FLAG_LOSS_MASK | KEEL_SHARD_FLAG_DOC_STARTS)

/* The token flag (KEEL_TOKEN_*) of bitmap b, which is stored flag 1 << b. */
static const uint8_t TOKEN_FLAG[2] = {KEEL_TOKEN_TRAIN, KEEL_TOKEN_DOC_START};

static int popcount2(uint32_t stored) { return (int)(stored & 1) + (int)(stored >> 1 & 1); }

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Id number i of a payload with the given width. */
static inline uint32_t token_at(const uint8_t *payload, uint32_t token_bytes, uint64_t i) {
    return token_bytes == 2 ? (uint32_t)payload[2 * i] | (uint32_t)payload[2 * i + 1] << 8
                            : get_u32(payload + 4 * i);
}

/* ---- writing -------------------------------------------------------------- */

/* Write the payload in chunks (converted to little-endian token_bytes-wide
 * ids) and return its XXH3-64 through *checksum. */
static keel_status write_payload(int fd, const char *path, const int32_t *tokens, const uint8_t *flags,
                                 uint32_t stored, uint64_t n_tokens, uint32_t token_bytes, uint64_t *checksum) {
    uint8_t *buf = keel_xmalloc((size_t)WRITE_CHUNK_TOKENS * token_bytes, "shard write buffer");
    XXH3_state_t *hash = XXH3_createState();
    KEEL_CHECK(hash != NULL, "out of memory for the XXH3 state");
    XXH3_64bits_reset(hash);
    keel_status st = KEEL_OK;
    for (uint64_t first = 0; first < n_tokens && st == KEEL_OK; first += WRITE_CHUNK_TOKENS) {
        uint64_t n = n_tokens - first < WRITE_CHUNK_TOKENS ? n_tokens - first : WRITE_CHUNK_TOKENS;
        for (uint64_t i = 0; i < n; i++) {
            uint32_t id = (uint32_t)tokens[first + i];
            if (token_bytes == 2) {
                buf[2 * i] = (uint8_t)id;
                buf[2 * i + 1] = (uint8_t)(id >> 8);
            } else {
                put_u32(buf + 4 * i, id);
            }
        }
        XXH3_64bits_update(hash, buf, n * token_bytes);
        st = keel_write_all(fd, buf, n * token_bytes, path);
    }
    /* each bitmap stored, a chunk (a multiple of 8 tokens) at a time */
    for (int b = 0; b < 2; b++)
        for (uint64_t first = 0; (stored >> b & 1) && first < n_tokens && st == KEEL_OK; first += WRITE_CHUNK_TOKENS) {
            uint64_t n = n_tokens - first < WRITE_CHUNK_TOKENS ? n_tokens - first : WRITE_CHUNK_TOKENS;
            memset(buf, 0, MASK_BYTES(n));
            for (uint64_t i = 0; i < n; i++)
                buf[i / 8] |= (uint8_t)(((flags[first + i] & TOKEN_FLAG[b]) != 0) << (i % 8));
            XXH3_64bits_update(hash, buf, MASK_BYTES(n));
            st = keel_write_all(fd, buf, MASK_BYTES(n), path);
        }
    *checksum = XXH3_64bits_digest(hash);
    XXH3_freeState(hash);
    keel_free(buf);
    return st;
}

keel_status keel_shard_write(const char *path, const int32_t *tokens, const uint8_t *flags, uint32_t stored,
                             uint64_t n_tokens, uint32_t vocab_size) {
    KEEL_CHECK(vocab_size >= 1 && vocab_size <= INT32_MAX, "vocab_size %" PRIu32, vocab_size);
    KEEL_CHECK((stored & ~KNOWN_BITMAPS) == 0 && (!stored || flags), "bitmaps %#" PRIx32 " (flags %p)", stored,
               (const void *)flags);
    for (uint64_t i = 0; i < n_tokens; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= vocab_size) {
            keel_errorf("%s: token id %" PRId32 " at position %" PRIu64
                        " is outside the vocabulary [0, %" PRIu32 "); nothing written",
                        path, tokens[i], i, vocab_size);
            return KEEL_ERR_INPUT;
        }
    }
    uint32_t token_bytes = vocab_size <= 65536 ? 2 : 4;

    keel_atomic_file f;
    keel_status st = keel_atomic_begin(&f, path);
    if (st != KEEL_OK) return st;
    /* The checksum is known only after the payload, so the header is written
     * as zeros first and filled in at the end. */
    uint8_t header[KEEL_SHARD_HEADER_BYTES] = {0};
    uint64_t checksum = 0;
    st = keel_write_all(f.fd, header, sizeof header, path);
    if (st == KEEL_OK) st = write_payload(f.fd, path, tokens, flags, stored, n_tokens, token_bytes, &checksum);
    if (st != KEEL_OK) goto fail;
    memcpy(header + OFF_MAGIC, KEEL_SHARD_MAGIC, 8);
    put_u32(header + OFF_VERSION, stored ? 2 : 1);
    put_u32(header + OFF_TOKEN_BYTES, token_bytes);
    put_u64(header + OFF_N_TOKENS, n_tokens);
    put_u32(header + OFF_VOCAB, vocab_size);
    put_u32(header + OFF_FLAGS, stored);
    put_u64(header + OFF_CHECKSUM, checksum);
    st = keel_pwrite_all(f.fd, header, sizeof header, 0, path);
    if (st != KEEL_OK) goto fail;
    return keel_atomic_commit(&f);

fail:
    keel_atomic_abort(&f);
    return st;
}

/* ---- reading -------------------------------------------------------------- */

#define PREPARE_HINT "create it with `keel data prepare`"

/* Check everything the header promises; on failure print one line and return
 * KEEL_ERR_INPUT. */
static keel_status verify(const keel_shard *s, const uint8_t *h, uint64_t file_bytes) {
    if (file_bytes < 8 || memcmp(h + OFF_MAGIC, KEEL_SHARD_MAGIC, 8) != 0) {
        keel_errorf("%s: not a keel token shard (bad magic); " PREPARE_HINT, s->path);
        return KEEL_ERR_INPUT;
    }
    if (file_bytes < KEEL_SHARD_HEADER_BYTES) {
        keel_errorf("%s: truncated token shard: %" PRIu64 " bytes, shorter than the %d-byte "
                    "header; re-create it with `keel data prepare`",
                    s->path, file_bytes, KEEL_SHARD_HEADER_BYTES);
        return KEEL_ERR_INPUT;
    }
    if (s->version < 1 || s->version > KEEL_SHARD_VERSION) {
        keel_errorf("%s: token shard version %" PRIu32 " is not supported (this keel reads "
                    "versions 1 to %d); re-create it with `keel data prepare`",
                    s->path, s->version, KEEL_SHARD_VERSION);
        return KEEL_ERR_INPUT;
    }
    uint32_t known = s->version == 1 ? 0 : KNOWN_BITMAPS;
    if (s->flags & ~known) {
        keel_errorf("%s: damaged token shard header (flags %#" PRIx32 " in a version %" PRIu32
                    " shard); re-create it with `keel data prepare`",
                    s->path, s->flags, s->version);
        return KEEL_ERR_INPUT;
    }
    if (s->token_bytes != 2 && s->token_bytes != 4) {
        keel_errorf("%s: damaged token shard header (token_bytes %" PRIu32 ", expected 2 or 4)",
                    s->path, s->token_bytes);
        return KEEL_ERR_INPUT;
    }
    if (s->vocab_size == 0 || s->vocab_size > INT32_MAX) {
        keel_errorf("%s: damaged token shard header (vocab_size %" PRIu32 ")", s->path,
                    s->vocab_size);
        return KEEL_ERR_INPUT;
    }
    /* bytes per 8 tokens: ids, and a byte of each bitmap */
    int bitmaps = popcount2(s->flags);
    uint64_t per8 = 8 * (uint64_t)s->token_bytes + (uint64_t)bitmaps;
    uint64_t max_tokens = (UINT64_MAX - KEEL_SHARD_HEADER_BYTES) / per8 * 8;
    uint64_t payload = s->n_tokens * s->token_bytes + (uint64_t)bitmaps * MASK_BYTES(s->n_tokens);
    uint64_t expected = s->n_tokens <= max_tokens ? KEEL_SHARD_HEADER_BYTES + payload : UINT64_MAX;
    if (file_bytes != expected) {
        keel_errorf("%s: %s token shard: the header promises %" PRIu64 " tokens%s = %" PRIu64
                    " bytes but the file has %" PRIu64 " bytes; re-create it with "
                    "`keel data prepare`",
                    s->path, file_bytes < expected ? "truncated" : "oversized", s->n_tokens,
                    bitmaps ? " and their flags" : "", expected, file_bytes);
        return KEEL_ERR_INPUT;
    }
    uint64_t stored = get_u64(h + OFF_CHECKSUM);
    uint64_t actual = XXH3_64bits(s->payload, (size_t)payload);
    if (stored != actual) {
        keel_errorf("%s: token shard checksum mismatch (header %016" PRIx64 ", data %016" PRIx64
                    "): the file is damaged; re-create it with `keel data prepare`",
                    s->path, stored, actual);
        return KEEL_ERR_INPUT;
    }
    for (uint64_t i = 0; i < s->n_tokens; i++) {
        uint32_t id = token_at(s->payload, s->token_bytes, i);
        if (id >= s->vocab_size) {
            keel_errorf("%s: token id %" PRIu32 " at position %" PRIu64 " is not below the "
                        "shard's vocab_size %" PRIu32 "; the file is damaged",
                        s->path, id, i, s->vocab_size);
            return KEEL_ERR_INPUT;
        }
    }
    for (int b = 0; b < 2; b++)
        if (s->bitmap[b] && s->n_tokens % 8 && s->bitmap[b][s->n_tokens / 8] >> (s->n_tokens % 8)) {
            keel_errorf("%s: the %s bitmap has bits set past the last token; the file is damaged", s->path,
                        b ? "document-start" : "loss-mask");
            return KEEL_ERR_INPUT;
        }
    return KEEL_OK;
}

/* A shard over bytes[0, len) (the file's, mapped or not; not copied) once
 * verify() passes; map != NULL is the mapping the shard then owns. */
static keel_status make_shard(const uint8_t *bytes, uint64_t len, void *map, const char *name,
                              keel_shard **out) {
    /* A file shorter than the header has one of zeros past its end, so that
     * verify() can tell a foreign file (bad magic) from a truncated shard. */
    uint8_t h[KEEL_SHARD_HEADER_BYTES] = {0};
    memcpy(h, bytes, len < sizeof h ? (size_t)len : sizeof h);
    keel_shard *s = keel_xcalloc(sizeof *s, "keel_shard");
    s->path = keel_xstrdup(name);
    s->map = map;
    s->map_bytes = (size_t)len;
    s->payload = bytes + (len < KEEL_SHARD_HEADER_BYTES ? len : KEEL_SHARD_HEADER_BYTES);
    s->token_bytes = get_u32(h + OFF_TOKEN_BYTES);
    s->n_tokens = get_u64(h + OFF_N_TOKENS);
    s->vocab_size = get_u32(h + OFF_VOCAB);
    s->version = get_u32(h + OFF_VERSION);
    s->flags = get_u32(h + OFF_FLAGS);
    /* where the bitmaps would start if the sizes check out (verify() reads them only then) */
    if ((s->token_bytes == 2 || s->token_bytes == 4) && s->n_tokens <= (uint64_t)len / s->token_bytes) {
        const uint8_t *at = s->payload + s->n_tokens * s->token_bytes;
        for (int b = 0; b < 2; b++)
            if (s->flags >> b & 1) s->bitmap[b] = at, at += MASK_BYTES(s->n_tokens);
    }
    keel_status st = verify(s, h, len);
    if (st != KEEL_OK) {
        keel_shard_close(s);
        return st;
    }
    *out = s;
    return KEEL_OK;
}

keel_status keel_shard_from_buffer(const void *bytes, size_t len, const char *name, keel_shard **out) {
    *out = NULL;
    return make_shard(bytes, len, NULL, name, out);
}

keel_status keel_shard_open(const char *path, keel_shard **out) {
    *out = NULL;
    int fd;
    char why[160];
    keel_status st = keel_open_read(path, false, &fd, why, sizeof why);
    if (st != KEEL_OK) {
        keel_errorf("cannot open token shard %s: %s; " PREPARE_HINT, path, why);
        return KEEL_ERR_INPUT;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        keel_errorf("cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return KEEL_ERR_IO;
    }
    uint64_t file_bytes = (uint64_t)sb.st_size;
    if (file_bytes < KEEL_SHARD_HEADER_BYTES) {
        /* Too short to map a header: what is there is read instead. */
        uint8_t head[KEEL_SHARD_HEADER_BYTES];
        bool whole = keel_pread_all(fd, head, (size_t)file_bytes, 0, NULL) == KEEL_OK;
        close(fd);
        keel_shard *s;
        st = make_shard(head, whole ? file_bytes : 0, NULL, path, &s);
        KEEL_CHECK(st != KEEL_OK, "%s: a shard shorter than its header verified", path);
        return st;
    }
    void *map = mmap(NULL, (size_t)file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd);
    if (map == MAP_FAILED) {
        keel_errorf("cannot mmap %s: %s", path, strerror(saved));
        return KEEL_ERR_IO;
    }
    return make_shard(map, file_bytes, map, path, out);
}

void keel_shard_close(keel_shard *s) {
    if (!s) return;
    if (s->map) munmap(s->map, s->map_bytes);
    keel_free(s->path);
    keel_free(s);
}

uint64_t keel_shard_n_tokens(const keel_shard *s) { return s->n_tokens; }
uint32_t keel_shard_vocab_size(const keel_shard *s) { return s->vocab_size; }
uint32_t keel_shard_stored(const keel_shard *s) { return s->flags; }

void keel_shard_read(const keel_shard *s, uint64_t first, uint64_t n, int32_t *out) {
    KEEL_CHECK(first <= s->n_tokens && n <= s->n_tokens - first,
               "read [%" PRIu64 ", +%" PRIu64 ") past the end of %s (%" PRIu64 " tokens)", first,
               n, s->path, s->n_tokens);
    for (uint64_t i = 0; i < n; i++)
        out[i] = (int32_t)token_at(s->payload, s->token_bytes, first + i);
}

void keel_shard_read_flags(const keel_shard *s, uint64_t first, uint64_t n, uint8_t *out) {
    KEEL_CHECK(first <= s->n_tokens && n <= s->n_tokens - first,
               "flags read [%" PRIu64 ", +%" PRIu64 ") past the end of %s (%" PRIu64 " tokens)", first,
               n, s->path, s->n_tokens);
    const uint8_t *train = s->bitmap[0], *start = s->bitmap[1];
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = first + i;
        out[i] = (uint8_t)((train ? (train[p / 8] >> (p % 8) & 1) : 1) * KEEL_TOKEN_TRAIN |
                           (start ? (start[p / 8] >> (p % 8) & 1) : 0) * KEEL_TOKEN_DOC_START);
    }
}

bool keel_shard_name_parse(const char *name, const char *split, uint64_t *index) {
    size_t split_len = strlen(split);
    if (strncmp(name, split, split_len) != 0 || name[split_len] != '-') return false;
    const char *p = name + split_len + 1;
    uint64_t value = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (value > (UINT64_MAX - 9) / 10) return false;
        value = value * 10 + (uint64_t)(*p - '0');
    }
    if (digits < 5 || strcmp(p, ".bin") != 0) return false;
    /* Only the canonical spelling: train-000001.bin is not train-00001.bin. */
    if (digits > 5 && name[split_len + 1] == '0') return false;
    *index = value;
    return true;
}
