/* data/instream.h: an input file of `keel data prepare` as a stream of bytes —
 * read as it is, or decompressed on the fly from gzip (zlib) or zstd (libzstd),
 * in pieces of the caller's size, so a file of any size needs only the
 * caller's buffer and the decoder's window. Internal to the data module
 * (textblocks.c reads its inputs through it).
 *
 *     instream *in;
 *     char why[256], buf[65536];
 *     size_t got;
 *     if (instream_open_file(path, INSTREAM_ZSTD, &in, why, sizeof why) != KEEL_OK) ...;
 *     while ((st = instream_read(in, buf, sizeof buf, &got, why, sizeof why)) == KEEL_OK && got)
 *         use(buf, got);
 *     instream_close(in);
 */
#ifndef KEEL_DATA_INSTREAM_H
#define KEEL_DATA_INSTREAM_H

#include "keel/core.h"

typedef enum {
    INSTREAM_PLAIN, /* the bytes as they are */
    INSTREAM_GZIP,  /* one or more gzip members (`cat a.gz b.gz` is one stream) */
    INSTREAM_ZSTD,  /* one or more zstd frames (skippable frames skipped) */
} instream_kind;

typedef struct instream instream;

/* Open `path` for reading as keel_open_read does with pipes allowed (a
 * regular file or a pipe; never a device or directory, never blocking on a
 * FIFO). On failure *out is NULL, `why` says it in words (strerror or "is a
 * directory, ...") and the status is KEEL_ERR_INPUT for a missing or wrong
 * kind of file, else KEEL_ERR_IO. The caller owns *out (instream_close). */
keel_status instream_open_file(const char *path, instream_kind kind, instream **out, char *why,
                               size_t why_n);
/* The same over bytes[0, len) in memory (not copied: they must outlive *out);
 * never fails. For the fuzz harness and tests. */
instream *instream_open_memory(const void *bytes, size_t len, instream_kind kind);
/* Up to cap bytes of the (decompressed) stream into buf; *got = 0 only at its
 * end. A compressed stream that stops before its end is KEEL_ERR_INPUT with
 * `why` starting "truncated:", one that cannot be decoded KEEL_ERR_INPUT with
 * `why` starting "corrupt:" (or "unreadable:" for a zstd frame whose window
 * is over libzstd's default limit, 128 MiB), each ending with the fix; a
 * failed read is KEEL_ERR_IO (strerror). After an error the stream stays
 * failed. */
keel_status instream_read(instream *s, void *buf, size_t cap, size_t *got, char *why,
                          size_t why_n);
/* Bytes of the file itself (compressed, as on disk) read so far. */
uint64_t instream_raw_bytes(const instream *s);
void instream_close(instream *s);

#endif
