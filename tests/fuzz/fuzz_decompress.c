/* tests/fuzz/fuzz_decompress.c: bytes through the .gz and .zst readers of
 * `keel data prepare` (src/data/instream.c). The first byte's low two bits
 * pick the mode — 0: the rest is a gzip file, 1: a zstd file, each read to its
 * end or to an error, which must say "truncated:", "corrupt:" or
 * "unreadable:"; 2 (gzip) and 3 (zstd): the rest is compressed here, read
 * back (it must come back as it was) and read again cut short at a point the
 * second byte picks (it must fail, "truncated:"). Its next two bits pick the
 * size of the reads (1, 7, 4096 or 65536 bytes). In modes 0 and 1 output past
 * 8 MiB (a small file that inflates to a lot) is not read. */
#include <zlib.h>
#include <zstd.h>

#include "data/instream.h"

#include "fuzz.h"

#define MAX_OUT (8u << 20)

/* Read s to its end in pieces of `piece` bytes into out[0, out_cap) — or,
 * with out NULL, into nothing, at most MAX_OUT bytes; the length in *n. */
static keel_status read_all(instream *s, size_t piece, uint8_t *out, size_t out_cap, size_t *n,
                            char *why, size_t why_n) {
    static uint8_t scratch[65536];
    size_t limit = out ? out_cap : MAX_OUT;
    *n = 0;
    while (*n < limit) {
        size_t got, cap = limit - *n < piece ? limit - *n : piece;
        keel_status st = instream_read(s, out ? out + *n : scratch, cap, &got, why, why_n);
        if (st != KEEL_OK) return st;
        if (got > cap) abort();
        if (got == 0) return KEEL_OK;
        *n += got;
    }
    return KEEL_OK;
}

static void expect_failure(keel_status st, const char *why, const char *want) {
    if (st == KEEL_OK) return;
    if (st != KEEL_ERR_INPUT || !why[0]) abort();
    if (want && strncmp(why, want, strlen(want)) != 0) abort();
    if (!want && strncmp(why, "truncated:", 10) && strncmp(why, "corrupt:", 8) &&
        strncmp(why, "unreadable:", 11))
        abort();
    keel_errorf("input f.zst is %s", why);
    fuzz_expect_error_line(st, "instream_read");
}

static uint8_t *pack(const uint8_t *data, size_t size, bool zstd, size_t *n) {
    size_t cap = zstd ? ZSTD_compressBound(size) : compressBound((uLong)size) + 32;
    uint8_t *out = malloc(cap);
    if (!out) abort();
    if (zstd) {
        *n = ZSTD_compress(out, cap, data, size, 1);
        if (ZSTD_isError(*n)) abort();
        return out;
    }
    z_stream z = {0};
    if (deflateInit2(&z, 1, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
    z.next_in = (Bytef *)data;
    z.avail_in = (uInt)size;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END) abort();
    *n = z.total_out;
    deflateEnd(&z);
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 20)) return 0;
    fuzz_quiet();
    int mode = data[0] & 3;
    static const size_t pieces[] = {1, 7, 4096, 65536};
    size_t piece = pieces[(data[0] >> 2) & 3];
    instream_kind kind = mode % 2 ? INSTREAM_ZSTD : INSTREAM_GZIP;
    char why[512];
    size_t n;
    if (mode < 2) {
        why[0] = '\0';
        instream *s = instream_open_memory(data + 1, size - 1, kind);
        expect_failure(read_all(s, piece, NULL, 0, &n, why, sizeof why), why, NULL);
        instream_close(s);
        return 0;
    }
    if (size < 2) return 0;
    const uint8_t *text = data + 2;
    size_t text_len = size - 2, packed_len;
    uint8_t *packed = pack(text, text_len, kind == INSTREAM_ZSTD, &packed_len);
    uint8_t *back = malloc(text_len + 1); /* one more: a stream that gives more is caught */
    if (!back) abort();
    instream *s = instream_open_memory(packed, packed_len, kind);
    if (read_all(s, piece, back, text_len + 1, &n, why, sizeof why) != KEEL_OK) abort();
    if (n != text_len || (n && memcmp(back, text, n))) abort();
    instream_close(s);
    size_t cut = data[1] * packed_len / 256; /* < packed_len */
    why[0] = '\0';
    s = instream_open_memory(packed, cut, kind);
    keel_status st = read_all(s, piece, back, text_len + 1, &n, why, sizeof why);
    if (st == KEEL_OK) abort(); /* a stream cut short must not read as whole */
    expect_failure(st, why, "truncated:");
    instream_close(s);
    free(back);
    free(packed);
    return 0;
}
