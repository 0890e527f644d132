/* data/parquet_values.h: the rows of one decompressed Parquet data page of a
 * BYTE_ARRAY column, as runs of equal rows — definition levels
 * (RLE/bit-packed hybrid) for nulls, and values PLAIN, dictionary indices
 * (RLE/bit-packed hybrid), DELTA_LENGTH_BYTE_ARRAY or DELTA_BYTE_ARRAY (their
 * lengths DELTA_BINARY_PACKED). Every read is checked against the page's
 * bytes; a run's length comes from the encoding (an RLE run, a delta
 * miniblock of equal lengths), so rows the page stores in no bytes are not
 * walked one by one. Internal to the data module (parquet.c).
 *
 *     pq_page pg = {0};
 *     const char *bad = pq_page_start(&pg, &layout);
 *     while (!bad && pq_page_left(&pg)) bad = pq_page_next(&pg, &row_run);
 *     pq_page_free(&pg);
 */
#ifndef KEEL_DATA_PARQUET_VALUES_H
#define KEEL_DATA_PARQUET_VALUES_H

#include "keel/core.h"

/* The RLE/bit-packed hybrid: runs of one value, or of values bit-packed in
 * groups of 8. */
typedef struct {
    const uint8_t *p, *end;
    unsigned bit_width;      /* 0..32 */
    uint64_t rle_left;       /* values left in the RLE run */
    uint32_t rle_value;
    const uint8_t *packed;   /* the bit-packed run's bytes */
    uint64_t packed_pos, packed_left;
} pq_rle;

/* DELTA_BINARY_PACKED: a first value, then blocks of miniblocks of deltas. */
typedef struct {
    const uint8_t *p, *end;
    uint64_t per_mini, n_mini; /* values per miniblock, miniblocks per block */
    uint64_t left;             /* values not yet taken, the first one included */
    bool first_pending;
    uint64_t last;             /* the last value taken (the first one, before) */
    uint64_t min_delta;
    const uint8_t *widths;     /* the block's miniblock bit widths; NULL before the first block */
    uint64_t mini_i;           /* the next miniblock of the block */
    const uint8_t *mini;       /* the current miniblock's bytes */
    unsigned mini_width;
    uint64_t mini_pos, mini_left;
    uint64_t next;             /* the value pq_delta_peek found */
} pq_delta;

/* What a page is: its bytes once decompressed and what its header says. */
typedef struct {
    const uint8_t *data;
    size_t len;
    uint64_t num_values;   /* rows, nulls included */
    int max_def;           /* 1: optional (definition levels), 0: required */
    bool v2;               /* data page v2: levels' lengths given, no length prefix */
    size_t def_bytes, rep_bytes; /* v2 */
    int encoding;          /* of the values: PQ_PLAIN, a dictionary or a delta encoding */
    const uint8_t *dict;   /* for dictionary pages: the dictionary page's bytes, */
    const uint32_t *dict_at; /* where each entry (its 4-byte length) starts in them */
    uint64_t dict_n;
} pq_page_layout;

/* One page being read. Zero-initialise; pq_page_free at the end (the buffer
 * of DELTA_BYTE_ARRAY values is kept from page to page). */
typedef struct {
    uint64_t left; /* rows not yet taken */
    int max_def;
    pq_rle def;
    int encoding;
    const uint8_t *p, *end; /* PLAIN: the values; delta encodings: the bytes */
    const uint8_t *dict;
    const uint32_t *dict_at;
    uint64_t dict_n;
    pq_rle indices;
    pq_delta lengths, prefixes;
    uint8_t *value; /* DELTA_BYTE_ARRAY: the current value */
    size_t value_len, value_cap;
} pq_page;

/* rows rows in a row, all null (text NULL) or all text[0, len). */
typedef struct {
    const uint8_t *text;
    size_t len;
    uint64_t rows;
} pq_row_run;

/* Start reading a page. NULL, or what is wrong with it (a phrase for an
 * error line: "its definition levels run past the page"). */
const char *pq_page_start(pq_page *pg, const pq_page_layout *l);
static inline uint64_t pq_page_left(const pq_page *pg) { return pg->left; }
/* The next run of equal rows (at least one, at most pq_page_left); its text
 * is valid until the next call. NULL, or what is wrong. */
const char *pq_page_next(pq_page *pg, pq_row_run *run);
void pq_page_free(pq_page *pg);

/* Where each of the n entries of a PLAIN dictionary page data[0, len)
 * starts, into at[0, n) (the caller's array: n <= len / 4, as each entry
 * takes 4 bytes at least, so it is no bigger than the page). NULL, or what
 * is wrong. */
const char *pq_dictionary_parse(const uint8_t *data, size_t len, uint64_t n, uint32_t *at);

#endif
