/* data/instream.c: an input file as a stream of bytes, plain or decompressed
 * from gzip or zstd as it is read (see instream.h). */
#include "data/instream.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

/* Compressed bytes are read from the file in pieces of this size. */
#define RAW_BYTES (128u << 10)

struct instream {
    instream_kind kind;
    int fd;                 /* -1: the bytes are in memory */
    const uint8_t *mem;     /* the memory stream */
    size_t mem_len, mem_pos;
    uint64_t raw_bytes;     /* of the file, read so far */
    uint8_t *raw;           /* compressed bytes read and not yet decoded: raw[raw_pos, raw_len) */
    size_t raw_pos, raw_len;
    bool raw_eof;
    keel_status failed;     /* an error already reported: every later read repeats it */
    /* gzip */
    z_stream z;
    bool z_ready;           /* inflateInit2 done */
    bool z_in_member;       /* a member started and not ended */
    bool z_out_full;        /* the last call filled the output mid-member: zlib may hold more */
    /* zstd */
    ZSTD_DStream *zd;
    bool zd_in_frame;       /* a frame started and not ended, or output still held back */
    bool zd_out_full;       /* the last call filled the output mid-frame: the decoder may hold more */
};

static instream *new_stream(instream_kind kind) {
    instream *s = keel_xcalloc(sizeof *s, "input stream");
    s->kind = kind;
    s->fd = -1;
    if (kind != INSTREAM_PLAIN) s->raw = keel_xmalloc(RAW_BYTES, "compressed input");
    return s;
}

keel_status instream_open_file(const char *path, instream_kind kind, instream **out, char *why,
                               size_t why_n) {
    *out = NULL;
    int fd;
    keel_status st = keel_open_read(path, true, &fd, why, why_n);
    if (st != KEEL_OK) return st;
    instream *s = new_stream(kind);
    s->fd = fd;
    *out = s;
    return KEEL_OK;
}

instream *instream_open_memory(const void *bytes, size_t len, instream_kind kind) {
    instream *s = new_stream(kind);
    s->mem = bytes;
    s->mem_len = len;
    return s;
}

/* Up to cap bytes of the file itself into buf; 0 at its end. */
static keel_status read_raw(instream *s, void *buf, size_t cap, size_t *got, char *why,
                            size_t why_n) {
    *got = 0;
    if (s->fd < 0) {
        size_t n = s->mem_len - s->mem_pos;
        if (n > cap) n = cap;
        if (n) memcpy(buf, s->mem + s->mem_pos, n);
        s->mem_pos += n;
        *got = n;
    } else {
        ssize_t n;
        do n = read(s->fd, buf, cap);
        while (n < 0 && errno == EINTR);
        if (n < 0) {
            snprintf(why, why_n, "%s", strerror(errno));
            return KEEL_ERR_IO;
        }
        *got = (size_t)n;
    }
    s->raw_bytes += *got;
    return KEEL_OK;
}

/* More compressed bytes into raw when all are decoded; raw_eof at the file's end. */
static keel_status refill(instream *s, char *why, size_t why_n) {
    if (s->raw_pos < s->raw_len || s->raw_eof) return KEEL_OK;
    size_t got;
    keel_status st = read_raw(s, s->raw, RAW_BYTES, &got, why, why_n);
    if (st != KEEL_OK) return st;
    s->raw_pos = 0;
    s->raw_len = got;
    s->raw_eof = got == 0;
    return KEEL_OK;
}

/* gzip: members one after another until the file ends between two of them. */
static keel_status read_gzip(instream *s, uint8_t *buf, size_t cap, size_t *got, char *why,
                             size_t why_n) {
    if (!s->z_ready) {
        /* 16 + MAX_WBITS: gzip only — a file named .gz that is not gzip is corrupt, not text */
        if (inflateInit2(&s->z, 16 + MAX_WBITS) != Z_OK) {
            snprintf(why, why_n, "zlib could not start: out of memory");
            return KEEL_ERR_IO;
        }
        s->z_ready = true;
    }
    for (;;) {
        /* inflate may hold output back after filling the buffer: ask it first */
        if (!s->z_out_full) {
            keel_status st = refill(s, why, why_n);
            if (st != KEEL_OK) return st;
            if (s->raw_pos == s->raw_len) { /* the end of the file */
                if (s->z_in_member || s->raw_bytes == 0) {
                    snprintf(why, why_n, "truncated: its gzip data ends %s; copy or download it again",
                             s->raw_bytes == 0 ? "before it starts (an empty file)" : "mid-stream");
                    return KEEL_ERR_INPUT;
                }
                return KEEL_OK;
            }
        }
        if (!s->z_in_member) {
            inflateReset(&s->z);
            s->z_in_member = true;
        }
        s->z.next_in = s->raw + s->raw_pos;
        s->z.avail_in = (uInt)(s->raw_len - s->raw_pos);
        s->z.next_out = buf;
        s->z.avail_out = (uInt)(cap > UINT32_MAX ? UINT32_MAX : cap);
        int ret = inflate(&s->z, Z_NO_FLUSH);
        s->raw_pos = s->raw_len - s->z.avail_in;
        *got = (size_t)(s->z.next_out - buf);
        if (ret == Z_DATA_ERROR || ret == Z_NEED_DICT) {
            snprintf(why, why_n, "corrupt: gzip data error (%s); copy or download it again",
                     s->z.msg ? s->z.msg : "invalid data");
            return KEEL_ERR_INPUT;
        }
        if (ret == Z_MEM_ERROR) {
            snprintf(why, why_n, "zlib ran out of memory");
            return KEEL_ERR_IO;
        }
        /* Z_OK, Z_STREAM_END, or Z_BUF_ERROR: no progress without more input */
        if (ret == Z_STREAM_END) s->z_in_member = false;
        s->z_out_full = ret != Z_STREAM_END && s->z.avail_out == 0;
        if (*got > 0) return KEEL_OK;
    }
}

/* zstd: frames one after another until the file ends between two of them. */
static keel_status read_zstd(instream *s, uint8_t *buf, size_t cap, size_t *got, char *why,
                             size_t why_n) {
    if (!s->zd) {
        /* libzstd's default window limit (128 MiB) bounds the memory a frame may ask for */
        s->zd = ZSTD_createDStream();
        if (!s->zd || ZSTD_isError(ZSTD_initDStream(s->zd))) {
            snprintf(why, why_n, "zstd could not start: out of memory");
            return KEEL_ERR_IO;
        }
    }
    for (;;) {
        /* the decoder may hold output back after filling the buffer: ask it first */
        if (!s->zd_out_full) {
            keel_status st = refill(s, why, why_n);
            if (st != KEEL_OK) return st;
            if (s->raw_pos == s->raw_len) { /* the end of the file */
                if (s->zd_in_frame || s->raw_bytes == 0) {
                    snprintf(why, why_n, "truncated: its zstd data ends %s; copy or download it again",
                             s->raw_bytes == 0 ? "before it starts (an empty file)" : "mid-frame");
                    return KEEL_ERR_INPUT;
                }
                return KEEL_OK;
            }
        }
        ZSTD_inBuffer in = {s->raw, s->raw_len, s->raw_pos};
        ZSTD_outBuffer out = {buf, cap, 0};
        size_t ret = ZSTD_decompressStream(s->zd, &out, &in);
        if (ZSTD_isError(ret)) {
            if (ZSTD_getErrorCode(ret) == ZSTD_error_frameParameter_windowTooLarge)
                snprintf(why, why_n, "unreadable: a zstd frame asks for a window over 128 MiB (made "
                         "with zstd --long=28 or more?); recompress it with zstd --long=27 or less");
            else
                snprintf(why, why_n, "corrupt: zstd data error (%s); copy or download it again",
                         ZSTD_getErrorName(ret));
            return KEEL_ERR_INPUT;
        }
        s->raw_pos = in.pos;
        /* 0: a frame ended and all of it is out (then a call without input would
         * only ask for the next frame's header: the end of the file may come) */
        s->zd_in_frame = ret != 0;
        s->zd_out_full = ret != 0 && out.pos == out.size;
        *got = out.pos;
        if (*got > 0) return KEEL_OK;
    }
}

keel_status instream_read(instream *s, void *buf, size_t cap, size_t *got, char *why,
                          size_t why_n) {
    *got = 0;
    if (s->failed != KEEL_OK) {
        snprintf(why, why_n, "read after an error");
        return s->failed;
    }
    if (cap == 0) return KEEL_OK;
    keel_status st;
    switch (s->kind) {
    case INSTREAM_GZIP: st = read_gzip(s, buf, cap, got, why, why_n); break;
    case INSTREAM_ZSTD: st = read_zstd(s, buf, cap, got, why, why_n); break;
    default: st = read_raw(s, buf, cap, got, why, why_n); break;
    }
    if (st != KEEL_OK) {
        s->failed = st;
        *got = 0;
    }
    return st;
}

uint64_t instream_raw_bytes(const instream *s) { return s->raw_bytes; }

void instream_close(instream *s) {
    if (!s) return;
    if (s->z_ready) inflateEnd(&s->z);
    ZSTD_freeDStream(s->zd);
    if (s->fd >= 0) close(s->fd);
    keel_free(s->raw);
    keel_free(s);
}
