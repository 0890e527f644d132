/* data/parquet_thrift.h: the parts of a Parquet file's metadata that keel's
 * reader uses, read from the Thrift compact protocol: the footer's schema and
 * one column's chunk in each row group (FileMetaData), and a page's header
 * (PageHeader). Every other field is skipped by its wire type, nesting at most
 * PQ_THRIFT_MAX_DEPTH deep. Internal to the data module (parquet.c).
 *
 *     pq_schema_elem *schema;
 *     size_t n;
 *     if (!pq_read_schema(footer, footer_len, &schema, &n, &encrypted, &bad_at)) corrupt(bad_at);
 */
#ifndef KEEL_DATA_PARQUET_THRIFT_H
#define KEEL_DATA_PARQUET_THRIFT_H

#include "keel/core.h"

/* Structs inside structs deeper than this are malformed (Parquet's own go
 * about 6 deep): bounds the skipping's recursion. */
#define PQ_THRIFT_MAX_DEPTH 32

/* Parquet's enums, as numbered in parquet.thrift. */
enum { PQ_BYTE_ARRAY = 6 };
enum { PQ_REQUIRED = 0, PQ_OPTIONAL = 1, PQ_REPEATED = 2 };
enum { PQ_CONVERTED_UTF8 = 0 };
enum { PQ_LOGICAL_STRING = 1 };
enum { PQ_DATA_PAGE = 0, PQ_INDEX_PAGE = 1, PQ_DICTIONARY_PAGE = 2, PQ_DATA_PAGE_V2 = 3 };
enum { PQ_PLAIN = 0, PQ_PLAIN_DICTIONARY = 2, PQ_RLE = 3, PQ_BIT_PACKED = 4,
       PQ_DELTA_LENGTH_BYTE_ARRAY = 6, PQ_DELTA_BYTE_ARRAY = 7, PQ_RLE_DICTIONARY = 8 };
enum { PQ_UNCOMPRESSED = 0, PQ_SNAPPY = 1, PQ_GZIP = 2, PQ_ZSTD = 6 };

/* One node of the schema (a depth-first list: the root, then each field and
 * its children). */
typedef struct {
    int32_t type, repetition, converted, logical; /* -1: not set; logical: the union's member */
    int32_t num_children;                         /* 0: a leaf (a column) */
    const char *name;                             /* into the footer's bytes, not NUL-ended */
    size_t name_len;
} pq_schema_elem;

/* One row group's chunk of the column keel reads. */
typedef struct {
    int64_t num_rows;
    int64_t n_columns;    /* chunks in the row group */
    bool found;           /* it has a chunk at the column's index, with its metadata */
    bool other_file;      /* the chunk is in another file (ColumnChunk.file_path) */
    bool encrypted;       /* the chunk's metadata is encrypted */
    int32_t type, codec;
    int64_t num_values, compressed_bytes, data_offset;
    int64_t dict_offset; /* -1: not set */
} pq_chunk_meta;

/* The schema of the FileMetaData in meta[0, len) into *elems (n_elems, a new
 * array: keel_free; names point into meta). *encrypted when the footer says
 * the file is encrypted (encryption_algorithm). False when it is malformed,
 * with *bad_at the byte where reading stopped. */
bool pq_read_schema(const uint8_t *meta, size_t len, pq_schema_elem **elems, size_t *n_elems,
                    bool *encrypted, size_t *bad_at);
/* Each row group of the same FileMetaData, with its chunk of leaf column
 * `leaf` (0-based, in schema order), into *groups (n_groups, a new array:
 * keel_free). False as above. */
bool pq_read_row_groups(const uint8_t *meta, size_t len, size_t leaf, pq_chunk_meta **groups,
                        size_t *n_groups, size_t *bad_at);

typedef struct {
    int32_t type, uncompressed_bytes, compressed_bytes;
    bool has_v1, has_dict, has_v2;       /* which page header was there */
    int32_t num_values, encoding;        /* of whichever it was */
    int32_t def_encoding, rep_encoding;  /* v1 */
    int32_t def_bytes, rep_bytes;        /* v2: the levels' lengths before the values */
    bool is_compressed;                  /* v2: the values are compressed (the default) */
} pq_page_header;

typedef enum { PQ_HEADER_OK, PQ_HEADER_SHORT, PQ_HEADER_BAD } pq_header_result;
/* A PageHeader at the start of p[0, len) into *h, its length in *header_len.
 * PQ_HEADER_SHORT: p ends inside it (more bytes may complete it);
 * PQ_HEADER_BAD: malformed (or a required field missing). */
pq_header_result pq_read_page_header(const uint8_t *p, size_t len, pq_page_header *h,
                                     size_t *header_len);

#endif
