/* data/parquet.h: one string column of an Apache Parquet file as the rows of
 * `keel data prepare`, read by keel's own reader (Debian has no Parquet
 * library): the footer and the Thrift compact metadata, the column's chunk in
 * each row group, data pages v1 and v2 and dictionary pages, PLAIN,
 * dictionary, DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY values,
 * uncompressed, SNAPPY, GZIP or ZSTD pages. Internal to the data module
 * (textblocks.c reads .parquet inputs through it; fuzzed by
 * tests/fuzz/fuzz_parquet.c).
 *
 *     parquet_reader *r;
 *     char why[512];
 *     if (parquet_open_file(path, "text", &r, why, sizeof why) != KEEL_OK) report(path, why);
 *     parquet_run run;
 *     bool end;
 *     while ((st = parquet_next(r, &run, &end, why, sizeof why)) == KEEL_OK && !end)
 *         for (uint64_t i = 0; i < run.count; i++) use(run.text, run.len); // NULL: a null row
 *     parquet_close(r);
 *
 * Memory is bounded by the largest page (a page of more than
 * PARQUET_MAX_PAGE_BYTES is refused), the column's dictionary and the
 * footer (at most PARQUET_MAX_FOOTER_BYTES), never by the file: pages are
 * read (pread) and decompressed one at a time. Every length and offset in
 * the file is range-checked against the file, the column chunk and the page
 * before it is used; a page must not claim more bytes than its codec could
 * make of its compressed size (PARQUET_MAX_RATIO_*), so a small file cannot
 * make the reader allocate much. Runs of equal rows (nulls, a dictionary
 * entry repeated, empty strings) come out as one run with a count, so rows
 * that cost the file no bytes cost the reader no time per row. */
#ifndef KEEL_DATA_PARQUET_H
#define KEEL_DATA_PARQUET_H

#include "keel/core.h"

/* A page that decompresses to more than this is refused. */
#define PARQUET_MAX_PAGE_BYTES (1u << 30)
/* A footer (FileMetaData) of more than this is refused. */
#define PARQUET_MAX_FOOTER_BYTES (256u << 20)
/* The most bytes a codec can make of one compressed byte: Snappy's longest
 * copy (64 bytes for 3), deflate's 1032:1, zstd's RLE block (128 KiB for 4
 * bytes); a page claiming more is corrupt. */
#define PARQUET_MAX_RATIO_SNAPPY 22u
#define PARQUET_MAX_RATIO_GZIP 1032u
#define PARQUET_MAX_RATIO_ZSTD 32768u

typedef struct parquet_reader parquet_reader;

/* Rows first_row .. first_row + count - 1 (numbered from 1 in the file) all
 * hold text[0, len), or are null (text NULL). */
typedef struct {
    const char *text;
    size_t len;
    uint64_t count; /* >= 1 */
    uint64_t first_row;
} parquet_run;

/* Open the Parquet file at `path` (a regular file: Parquet is read from its
 * end) and find the top-level column `column`: a BYTE_ARRAY of logical type
 * STRING (converted UTF8), or of none (binary, read as text), optional or
 * required. Every row group's chunk of it is checked here (offsets inside the
 * file, a codec keel reads, not encrypted, not in another file). On failure
 * *out is NULL and `why` is what follows "input PATH " in an error line: "is
 * not a Parquet file ...", "is truncated ...", "is corrupt: ...", "has no
 * column ... (its columns: ...)", "has column ... of type ..., not a string",
 * "uses the LZ4 codec ...", each ending with the fix; the status is
 * KEEL_ERR_INPUT, or KEEL_ERR_IO for a failed read ("cannot be read: ...").
 * The caller owns *out (parquet_close). */
keel_status parquet_open_file(const char *path, const char *column, parquet_reader **out,
                              char *why, size_t why_n);
/* The same over bytes[0, len) in memory (not copied: they must outlive *out).
 * For the fuzz harness and tests. */
keel_status parquet_open_memory(const void *bytes, size_t len, const char *column,
                                parquet_reader **out, char *why, size_t why_n);
/* The next run of rows in *run, or *end at the end of the column (every row
 * group read). run->text stays valid until the next call. A page that cannot
 * be read is KEEL_ERR_INPUT with `why` as for parquet_open_file ("is corrupt:
 * row group 2 of 3, column "text", page at byte 1234: ..."; "uses the
 * BYTE_STREAM_SPLIT encoding ..."), a failed read KEEL_ERR_IO; after an error
 * the reader stays failed. */
keel_status parquet_next(parquet_reader *r, parquet_run *run, bool *end, char *why, size_t why_n);
/* The furthest byte of the file read so far (the footer not counted): how
 * far the reading has come through the file's size. */
uint64_t parquet_raw_bytes(const parquet_reader *r);
void parquet_close(parquet_reader *r);

#endif
