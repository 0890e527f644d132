/* data/parquet.c: one string column of a Parquet file read row group by row
 * group, page by page: the footer, the column, its chunks, page headers,
 * decompression (see parquet.h). */
#include "data/parquet.h"

#include <errno.h>
#include <snappy-c.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "data/parquet_thrift.h"
#include "data/parquet_values.h"

/* Bytes read ahead from the file at a time (within a column chunk): many
 * small pages cost one read. */
#define WINDOW_BYTES (1u << 20)
/* A page header is read from a first piece of this size, more if it needs
 * more (statistics can be long), up to PAGE_HEADER_MAX_BYTES. */
#define PAGE_HEADER_FIRST_BYTES (64u << 10)
#define PAGE_HEADER_MAX_BYTES (16u << 20)
/* Bytes a compressed page may claim beyond its codec's ratio (frame headers). */
#define RATIO_SLACK_BYTES 64u

#define FIX_DAMAGED "copy or write the file again"

struct parquet_reader {
    int fd; /* -1: the file is in memory */
    const uint8_t *mem;
    uint64_t size;     /* of the file */
    uint64_t data_end; /* the footer starts here: column chunks lie in [4, data_end) */
    char *column;
    int max_def; /* 1: optional, 0: required */
    pq_chunk_meta *groups;
    size_t n_groups, group; /* group: the row group being read (or next) */
    bool in_chunk;
    uint64_t pos, chunk_end;   /* the next page's offset and its chunk's end */
    uint64_t chunk_rows_left;  /* rows of the chunk not in a page read yet */
    uint64_t page_at;          /* the offset of the page being read, for messages */
    bool chunk_has_data;       /* a data page of the chunk has been read */
    uint8_t *win; /* file bytes [win_off, win_off + win_len) */
    uint64_t win_off;
    size_t win_len, win_cap;
    uint8_t *page; /* a decompressed page */
    size_t page_cap;
    pq_page pg;
    uint8_t *dict_data; /* the chunk's dictionary page, decompressed */
    size_t dict_cap;
    uint32_t *dict_at; /* where each of its entries starts */
    uint64_t dict_n, dict_entries_cap;
    bool have_dict;
    uint64_t row;      /* rows handed out */
    uint64_t furthest; /* the furthest byte read */
    z_stream z;
    bool z_ready;
    ZSTD_DCtx *zd;
    keel_status failed;
};

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static const char *codec_name(int32_t codec) {
    static const char *const names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
    return codec >= 0 && codec < 8 ? names[codec] : "an unknown codec";
}

static const char *encoding_name(int32_t e) {
    static const char *const names[] = {"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED",
                                        "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
                                        "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
    return e >= 0 && e < 10 ? names[e] : "an unknown encoding";
}

static const char *type_name(int32_t type) {
    static const char *const names[] = {"BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE",
                                        "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
    return type >= 0 && type < 8 ? names[type] : "of an unknown type";
}

static const char *logical_name(int32_t logical) {
    static const char *const names[] = {NULL, "STRING", "MAP", "LIST", "ENUM", "DECIMAL", "DATE", "TIME",
                                        "TIMESTAMP", NULL, "INTEGER", "NULL", "JSON", "BSON", "UUID",
                                        "FLOAT16", "VARIANT", "GEOMETRY", "GEOGRAPHY"};
    return logical >= 0 && logical < 19 && names[logical] ? names[logical] : "an unknown logical type";
}

static const char *converted_name(int32_t converted) {
    static const char *const names[] = {"UTF8", "MAP", "MAP_KEY_VALUE", "LIST", "ENUM", "DECIMAL",
                                        "DATE", "TIME_MILLIS", "TIME_MICROS", "TIMESTAMP_MILLIS",
                                        "TIMESTAMP_MICROS", "UINT_8", "UINT_16", "UINT_32", "UINT_64",
                                        "INT_8", "INT_16", "INT_32", "INT_64", "JSON", "BSON", "INTERVAL"};
    return converted >= 0 && converted < 22 ? names[converted] : "an unknown converted type";
}

/* ---- messages ------------------------------------------------------------------ */

/* "is corrupt: row group 2 of 3, column "text", page at byte 1234: DETAIL; copy
 * or write the file again" (KEEL_ERR_INPUT). */
static keel_status corrupt(const parquet_reader *r, char *why, size_t why_n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static keel_status corrupt(const parquet_reader *r, char *why, size_t why_n, const char *fmt, ...) {
    char detail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    char page[48] = "";
    if (r->in_chunk && r->page_at) snprintf(page, sizeof page, ", page at byte %llu", (unsigned long long)r->page_at);
    snprintf(why, why_n, "is corrupt: row group %zu of %zu, column \"%s\"%s: %s; " FIX_DAMAGED,
             r->group + 1, r->n_groups, r->column, page, detail);
    return KEEL_ERR_INPUT;
}

/* ---- reading the file ---------------------------------------------------------- */

/* bytes [off, off + n) of the file (inside it: checked by the caller) into dst. */
static keel_status read_at(parquet_reader *r, uint64_t off, void *dst, size_t n, char *why,
                           size_t why_n) {
    if (n == 0) return KEEL_OK;
    if (r->fd < 0) {
        memcpy(dst, r->mem + off, n);
        return KEEL_OK;
    }
    keel_status st = keel_pread_all(r->fd, dst, n, (int64_t)off, NULL);
    if (st == KEEL_ERR_INPUT)
        snprintf(why, why_n, "is truncated: it ended at byte %llu while being read (was it changed "
                 "while keel read it?); " FIX_DAMAGED, (unsigned long long)off);
    else if (st != KEEL_OK)
        snprintf(why, why_n, "cannot be read: %s", strerror(errno));
    return st;
}

/* Make the window hold [off, off + n) (inside the current chunk) and point *out
 * at it; reads at least WINDOW_BYTES ahead, never past the chunk. */
static keel_status window(parquet_reader *r, uint64_t off, size_t n, const uint8_t **out, char *why,
                          size_t why_n) {
    static const uint8_t none[1];
    if (n == 0) { /* an empty page: no bytes to hold, and no pointer arithmetic on an empty window */
        *out = none;
        return KEEL_OK;
    }
    if (off >= r->win_off && off + n <= r->win_off + r->win_len) {
        *out = r->win + (off - r->win_off);
        return KEEL_OK;
    }
    size_t want = (size_t)min_u64(r->chunk_end - off, n > WINDOW_BYTES ? n : WINDOW_BYTES);
    size_t keep = 0;
    if (off >= r->win_off && off < r->win_off + r->win_len) { /* the bytes already read stay */
        keep = (size_t)(r->win_off + r->win_len - off);
        memmove(r->win, r->win + (off - r->win_off), keep);
    }
    if (want > r->win_cap) {
        r->win = keel_xrealloc(r->win, want, "parquet read window");
        r->win_cap = want;
    }
    r->win_off = off;
    r->win_len = 0;
    keel_status st = read_at(r, off + keep, r->win + keep, want - keep, why, why_n);
    if (st != KEEL_OK) return st;
    r->win_len = want;
    if (off + want > r->furthest) r->furthest = off + want;
    *out = r->win;
    return KEEL_OK;
}

/* ---- decompression --------------------------------------------------------------- */

/* src[0, n) decompressed with codec into exactly dst[0, dst_n). NULL, or what is wrong. */
static const char *decompress(parquet_reader *r, int32_t codec, const uint8_t *src, size_t n,
                              uint8_t *dst, size_t dst_n) {
    if (codec == PQ_SNAPPY) {
        size_t got;
        if (snappy_uncompressed_length((const char *)src, n, &got) != SNAPPY_OK)
            return "its Snappy data is malformed";
        if (got != dst_n) return "its Snappy data holds another size than its header says";
        if (snappy_uncompress((const char *)src, n, (char *)dst, &got) != SNAPPY_OK || got != dst_n)
            return "its Snappy data is corrupt";
        return NULL;
    }
    if (codec == PQ_ZSTD) {
        if (!r->zd && !(r->zd = ZSTD_createDCtx())) return "zstd could not start (out of memory)";
        size_t got = ZSTD_decompressDCtx(r->zd, dst, dst_n, src, n);
        if (ZSTD_isError(got)) return "its zstd data is corrupt or longer than its header says";
        return got == dst_n ? NULL : "its zstd data is shorter than its header says";
    }
    /* GZIP: gzip members (or a zlib stream: 32 + MAX_WBITS takes either) */
    if (!r->z_ready) {
        if (inflateInit2(&r->z, 32 + MAX_WBITS) != Z_OK) return "zlib could not start (out of memory)";
        r->z_ready = true;
    } else {
        inflateReset(&r->z);
    }
    r->z.next_in = (Bytef *)src;
    r->z.avail_in = (uInt)n;
    r->z.next_out = dst;
    r->z.avail_out = (uInt)dst_n;
    for (;;) {
        int ret = inflate(&r->z, Z_FINISH);
        if (ret == Z_STREAM_END) {
            if (r->z.avail_out == 0 || r->z.avail_in == 0) break;
            inflateReset(&r->z); /* another member follows */
            continue;
        }
        if (ret == Z_OK) continue; /* progress was made */
        if (r->z.avail_out == 0) return "its gzip data is longer than its header says";
        return ret == Z_BUF_ERROR ? "its gzip data is truncated" : "its gzip data is corrupt";
    }
    return r->z.avail_out == 0 ? NULL : "its gzip data is shorter than its header says";
}

/* The most bytes `codec` can make of n compressed ones. */
static uint64_t max_decompressed(int32_t codec, uint64_t n) {
    uint64_t ratio = codec == PQ_SNAPPY ? PARQUET_MAX_RATIO_SNAPPY
                     : codec == PQ_GZIP ? PARQUET_MAX_RATIO_GZIP
                                        : PARQUET_MAX_RATIO_ZSTD;
    return n * ratio + RATIO_SLACK_BYTES;
}

/* A page's bytes as its encodings read them: `raw` itself where it is stored
 * uncompressed, else decompressed into r->page. A v2 page's levels (`levels`
 * bytes) are stored uncompressed before its values. */
static keel_status page_bytes(parquet_reader *r, const pq_page_header *h, const uint8_t *raw,
                              size_t levels, const uint8_t **out, size_t *out_len, char *why,
                              size_t why_n) {
    int32_t codec = r->groups[r->group].codec;
    size_t stored = (size_t)h->compressed_bytes, full = (size_t)h->uncompressed_bytes;
    if (full > PARQUET_MAX_PAGE_BYTES) {
        snprintf(why, why_n, "has a page of %zu bytes (column \"%s\", row group %zu, page at byte "
                 "%llu), over keel's limit of 1 GiB a page; rewrite it with smaller pages "
                 "(pyarrow: data_page_size)", full, r->column, r->group + 1,
                 (unsigned long long)r->page_at);
        return KEEL_ERR_INPUT;
    }
    if (levels > stored || levels > full)
        return corrupt(r, why, why_n, "its levels (%zu bytes) are longer than the page", levels);
    bool compressed = codec != PQ_UNCOMPRESSED && !(h->has_v2 && !h->is_compressed);
    if (!compressed) {
        if (stored != full)
            return corrupt(r, why, why_n, "it is stored uncompressed in %zu bytes, its header says %zu",
                           stored, full);
        *out = raw;
        *out_len = stored;
        return KEEL_OK;
    }
    if (full - levels > max_decompressed(codec, stored - levels))
        return corrupt(r, why, why_n, "it claims %zu bytes decompressed from %zu, more than %s makes",
                       full, stored, codec_name(codec));
    if (full + 1 > r->page_cap) {
        r->page_cap = full + 1;
        keel_free(r->page);
        r->page = keel_xmalloc(r->page_cap, "parquet page");
    }
    memcpy(r->page, raw, levels);
    const char *bad = decompress(r, codec, raw + levels, stored - levels, r->page + levels, full - levels);
    if (bad) return corrupt(r, why, why_n, "%s", bad);
    *out = r->page;
    *out_len = full;
    return KEEL_OK;
}

/* ---- pages ---------------------------------------------------------------------- */

/* The header of the page at r->pos: read from a first piece, more if it is
 * longer. */
static keel_status read_page_header(parquet_reader *r, pq_page_header *h, size_t *header_len,
                                    char *why, size_t why_n) {
    uint64_t avail = r->chunk_end - r->pos;
    size_t n = (size_t)min_u64(avail, PAGE_HEADER_FIRST_BYTES);
    for (;;) {
        const uint8_t *p;
        keel_status st = window(r, r->pos, n, &p, why, why_n);
        if (st != KEEL_OK) return st;
        pq_header_result res = pq_read_page_header(p, n, h, header_len);
        if (res == PQ_HEADER_OK) return KEEL_OK;
        if (res == PQ_HEADER_BAD) return corrupt(r, why, why_n, "its page header is malformed");
        if (n == avail) return corrupt(r, why, why_n, "its page header runs past the column chunk");
        if (n >= PAGE_HEADER_MAX_BYTES)
            return corrupt(r, why, why_n, "its page header is longer than %u MiB", PAGE_HEADER_MAX_BYTES >> 20);
        n = (size_t)min_u64(avail, (uint64_t)n * 8 > PAGE_HEADER_MAX_BYTES ? PAGE_HEADER_MAX_BYTES : n * 8);
    }
}

/* A chunk's dictionary page: kept (decompressed) until the chunk ends. */
static keel_status load_dictionary(parquet_reader *r, const pq_page_header *h, const uint8_t *raw,
                                   char *why, size_t why_n) {
    if (!h->has_dict) return corrupt(r, why, why_n, "a dictionary page without its header");
    if (r->have_dict || r->chunk_has_data)
        return corrupt(r, why, why_n, "a second dictionary page, or one after the data pages");
    if (h->encoding != PQ_PLAIN && h->encoding != PQ_PLAIN_DICTIONARY)
        return corrupt(r, why, why_n, "its dictionary page is %s, not PLAIN", encoding_name(h->encoding));
    const uint8_t *data;
    size_t len;
    keel_status st = page_bytes(r, h, raw, 0, &data, &len, why, why_n);
    if (st != KEEL_OK) return st;
    if (data == r->page) { /* keep it: the next page decompresses into the other buffer */
        uint8_t *t = r->dict_data;
        size_t cap = r->dict_cap;
        r->dict_data = r->page;
        r->dict_cap = r->page_cap;
        r->page = t;
        r->page_cap = cap;
    } else { /* in the window, which moves on */
        if (len + 1 > r->dict_cap) {
            r->dict_cap = len + 1;
            keel_free(r->dict_data);
            r->dict_data = keel_xmalloc(r->dict_cap, "parquet dictionary");
        }
        memcpy(r->dict_data, data, len);
    }
    uint64_t n = (uint64_t)h->num_values;
    if (n > len / 4) /* each entry takes 4 bytes at least: bounds the array below */
        return corrupt(r, why, why_n, "its dictionary page claims %llu entries in %zu bytes",
                       (unsigned long long)n, len);
    if (n > r->dict_entries_cap) {
        r->dict_entries_cap = n;
        keel_free(r->dict_at);
        r->dict_at = keel_xmalloc((size_t)n * sizeof *r->dict_at, "parquet dictionary");
    }
    const char *bad = pq_dictionary_parse(r->dict_data, len, n, r->dict_at);
    if (bad) return corrupt(r, why, why_n, "%s", bad);
    r->dict_n = n;
    r->have_dict = true;
    return KEEL_OK;
}

static bool encoding_read(int32_t e) {
    return e == PQ_PLAIN || e == PQ_PLAIN_DICTIONARY || e == PQ_RLE_DICTIONARY ||
           e == PQ_DELTA_LENGTH_BYTE_ARRAY || e == PQ_DELTA_BYTE_ARRAY;
}

/* A data page (v1 or v2): its rows become r->pg's. */
static keel_status start_data_page(parquet_reader *r, const pq_page_header *h, const uint8_t *raw,
                                   char *why, size_t why_n) {
    bool v2 = h->type == PQ_DATA_PAGE_V2;
    if (v2 ? !h->has_v2 : !h->has_v1) return corrupt(r, why, why_n, "a data page without its header");
    if ((uint64_t)h->num_values > r->chunk_rows_left)
        return corrupt(r, why, why_n, "its page holds %d rows, more than its column chunk has left",
                       h->num_values);
    if (!encoding_read(h->encoding)) {
        snprintf(why, why_n, "uses the %s encoding (column \"%s\", row group %zu); keel reads PLAIN, "
                 "dictionary, DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY strings: rewrite it with "
                 "pyarrow's defaults", encoding_name(h->encoding), r->column, r->group + 1);
        return KEEL_ERR_INPUT;
    }
    if (!v2 && r->max_def && h->def_encoding != PQ_RLE) {
        snprintf(why, why_n, "uses %s definition levels (column \"%s\", row group %zu); keel reads RLE "
                 "levels: rewrite it with a current writer (pyarrow)", encoding_name(h->def_encoding),
                 r->column, r->group + 1);
        return KEEL_ERR_INPUT;
    }
    size_t levels = v2 ? (size_t)h->def_bytes + (size_t)h->rep_bytes : 0;
    const uint8_t *data;
    size_t len;
    keel_status st = page_bytes(r, h, raw, levels, &data, &len, why, why_n);
    if (st != KEEL_OK) return st;
    pq_page_layout l = {.data = data, .len = len, .num_values = (uint64_t)h->num_values,
                        .max_def = r->max_def, .v2 = v2, .def_bytes = (size_t)h->def_bytes,
                        .rep_bytes = (size_t)h->rep_bytes, .encoding = h->encoding,
                        .dict = r->have_dict ? r->dict_data : NULL, .dict_at = r->dict_at,
                        .dict_n = r->dict_n};
    const char *bad = pq_page_start(&r->pg, &l);
    if (bad) return corrupt(r, why, why_n, "%s", bad);
    r->chunk_rows_left -= (uint64_t)h->num_values;
    r->chunk_has_data = true;
    return KEEL_OK;
}

/* Where a row group's chunk of the column starts: at its dictionary page when
 * it has one before the data pages. */
static int64_t chunk_start(const pq_chunk_meta *g) {
    return g->dict_offset > 0 && g->dict_offset < g->data_offset ? g->dict_offset : g->data_offset;
}

static void start_chunk(parquet_reader *r) {
    const pq_chunk_meta *g = &r->groups[r->group];
    r->pos = (uint64_t)chunk_start(g);
    r->chunk_end = r->pos + (uint64_t)g->compressed_bytes; /* checked at open */
    r->chunk_rows_left = (uint64_t)g->num_values;
    r->have_dict = r->chunk_has_data = false;
    r->dict_n = 0;
    r->page_at = 0;
    r->in_chunk = true;
}

/* The next data page with rows into r->pg, moving on through the chunks; *have
 * false at the end of the last one. */
static keel_status next_data_page(parquet_reader *r, bool *have, char *why, size_t why_n) {
    *have = false;
    for (;;) {
        if (!r->in_chunk) {
            while (r->group < r->n_groups && r->groups[r->group].num_rows == 0) r->group++;
            if (r->group == r->n_groups) return KEEL_OK;
            start_chunk(r);
        }
        if (r->chunk_rows_left == 0) { /* the chunk is read (bytes after its rows are ignored) */
            r->in_chunk = false;
            r->group++;
            continue;
        }
        if (r->pos >= r->chunk_end)
            return corrupt(r, why, why_n, "its column chunk ends %llu rows short of its %lld",
                           (unsigned long long)r->chunk_rows_left, (long long)r->groups[r->group].num_values);
        r->page_at = r->pos;
        pq_page_header h;
        size_t header_len;
        keel_status st = read_page_header(r, &h, &header_len, why, why_n);
        if (st != KEEL_OK) return st;
        uint64_t body = r->pos + header_len;
        if ((uint64_t)h.compressed_bytes > r->chunk_end - body)
            return corrupt(r, why, why_n, "its page (%d bytes) runs past the column chunk", h.compressed_bytes);
        if ((uint64_t)h.compressed_bytes > PARQUET_MAX_PAGE_BYTES)
            return corrupt(r, why, why_n, "its page is stored in %d bytes, over 1 GiB", h.compressed_bytes);
        const uint8_t *raw;
        st = window(r, body, (size_t)h.compressed_bytes, &raw, why, why_n);
        if (st != KEEL_OK) return st;
        r->pos = body + (uint64_t)h.compressed_bytes;
        if (h.type == PQ_DICTIONARY_PAGE) {
            st = load_dictionary(r, &h, raw, why, why_n);
        } else if (h.type == PQ_DATA_PAGE || h.type == PQ_DATA_PAGE_V2) {
            st = start_data_page(r, &h, raw, why, why_n);
            if (st == KEEL_OK && pq_page_left(&r->pg) > 0) {
                *have = true;
                return KEEL_OK;
            }
        } /* index pages and pages of kinds to come are skipped */
        if (st != KEEL_OK) return st;
    }
}

keel_status parquet_next(parquet_reader *r, parquet_run *run, bool *end, char *why, size_t why_n) {
    *end = false;
    if (r->failed != KEEL_OK) {
        snprintf(why, why_n, "could not be read (an error before)");
        return r->failed;
    }
    keel_status st = KEEL_OK;
    while (pq_page_left(&r->pg) == 0) {
        bool have;
        st = next_data_page(r, &have, why, why_n);
        if (st != KEEL_OK) goto fail;
        if (!have) {
            *end = true;
            return KEEL_OK;
        }
    }
    pq_row_run rr;
    const char *bad = pq_page_next(&r->pg, &rr);
    if (bad) {
        st = corrupt(r, why, why_n, "%s", bad);
        goto fail;
    }
    *run = (parquet_run){.text = (const char *)rr.text, .len = rr.len, .count = rr.rows,
                         .first_row = r->row + 1};
    r->row += rr.rows;
    return KEEL_OK;
fail:
    r->failed = st;
    return st;
}

/* ---- opening: the footer, the column, its chunks ---------------------------------- */

static bool name_is(const pq_schema_elem *e, const char *name) {
    return e->name_len == strlen(name) && memcmp(e->name, name, e->name_len) == 0;
}

/* The top-level fields' names, quoted ("id", "text", ...), those that
 * `only_strings` into out. */
static void list_columns(const pq_schema_elem *s, size_t n, bool only_strings, char *out, size_t out_n) {
    size_t used = 0, shown = 0, i = 1;
    out[0] = '\0';
    for (int32_t k = 0; k < s[0].num_children && i < n; k++) {
        const pq_schema_elem *e = &s[i];
        bool string = e->num_children == 0 && e->type == PQ_BYTE_ARRAY && e->repetition != PQ_REPEATED &&
                      (e->logical < 0 || e->logical == PQ_LOGICAL_STRING) &&
                      (e->converted < 0 || e->converted == PQ_CONVERTED_UTF8);
        if (!only_strings || string) {
            int w = shown == 6 ? snprintf(out + used, out_n - used, ", ...")
                               : snprintf(out + used, out_n - used, "%s\"%.*s\"", shown ? ", " : "",
                                          (int)(e->name_len > 40 ? 40 : e->name_len), e->name);
            if (w < 0 || (size_t)w >= out_n - used) break;
            used += (size_t)w;
            if (shown++ == 6) break;
        }
        /* the field's subtree: each node adds its children to what is left */
        uint64_t pending = 1;
        while (pending && i < n) pending += (uint64_t)s[i++].num_children - 1;
    }
}

/* What a column that is not a string is: "of type INT64", "of type BYTE_ARRAY
 * (JSON)", "that is a group of 2 fields (a struct)", "that is repeated (a list)". */
static void describe(const pq_schema_elem *e, char *out, size_t out_n) {
    if (e->num_children > 0) {
        const char *kind = e->converted == 3 || e->logical == 3   ? "a list"
                           : e->converted == 1 || e->logical == 2 ? "a map"
                                                                  : "a struct";
        snprintf(out, out_n, "that is a group of %d field%s (%s)", e->num_children,
                 e->num_children == 1 ? "" : "s", kind);
    } else if (e->repetition == PQ_REPEATED) {
        snprintf(out, out_n, "that is a repeated %s (a list)", type_name(e->type));
    } else if (e->type == PQ_BYTE_ARRAY) {
        snprintf(out, out_n, "of type BYTE_ARRAY (%s)",
                 e->logical >= 0 ? logical_name(e->logical) : converted_name(e->converted));
    } else {
        snprintf(out, out_n, "of type %s", type_name(e->type));
    }
}

/* Find the column among the schema's top-level fields: its leaf index (the
 * chunks of a row group are in leaf order) and whether it may be null. */
static keel_status find_column(parquet_reader *r, const pq_schema_elem *s, size_t n, size_t *leaf,
                               char *why, size_t why_n) {
    if (n == 0 || s[0].num_children == 0) {
        snprintf(why, why_n, "has no columns (an empty schema); write the text into a column \"%s\"", r->column);
        return KEEL_ERR_INPUT;
    }
    size_t i = 1, leaves = 0, at = 0;
    for (int32_t k = 0; k < s[0].num_children; k++) {
        if (i >= n) {
            snprintf(why, why_n, "is corrupt: its schema ends inside its fields; " FIX_DAMAGED);
            return KEEL_ERR_INPUT;
        }
        if (!at && name_is(&s[i], r->column)) {
            at = i;
            *leaf = leaves;
        }
        uint64_t pending = 1;
        while (pending) {
            if (i >= n) {
                snprintf(why, why_n, "is corrupt: its schema ends inside its fields; " FIX_DAMAGED);
                return KEEL_ERR_INPUT;
            }
            if (s[i].num_children == 0) leaves++;
            pending += (uint64_t)s[i++].num_children - 1;
        }
    }
    char names[400];
    if (!at) {
        list_columns(s, n, false, names, sizeof names);
        snprintf(why, why_n, "has no column \"%s\" (its columns: %s); name the column that holds the "
                 "text with --column", r->column, names);
        return KEEL_ERR_INPUT;
    }
    const pq_schema_elem *e = &s[at];
    bool string = e->num_children == 0 && e->type == PQ_BYTE_ARRAY && e->repetition != PQ_REPEATED &&
                  (e->logical < 0 || e->logical == PQ_LOGICAL_STRING) &&
                  (e->converted < 0 || e->converted == PQ_CONVERTED_UTF8);
    if (!string) {
        char what[96];
        describe(e, what, sizeof what);
        list_columns(s, n, true, names, sizeof names);
        snprintf(why, why_n, "has column \"%s\" %s, not a string (BYTE_ARRAY of logical type STRING or "
                 "none); name a top-level string column with --column (%s%s)%s", r->column, what,
                 names[0] ? "its string columns: " : "it has none", names,
                 e->num_children > 0 ? " or flatten the table first (pyarrow: table.flatten())" : "");
        return KEEL_ERR_INPUT;
    }
    r->max_def = e->repetition == PQ_OPTIONAL;
    return KEEL_OK;
}

/* By start, then by row group: spans are {start, end, row group}. */
static int by_start(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[2] < y[2] ? -1 : x[2] > y[2]);
}

/* No two chunks share bytes (no writer makes them so): the pages read, and
 * so the work, are bounded by the file's size. */
static keel_status check_no_overlap(parquet_reader *r, char *why, size_t why_n) {
    uint64_t (*spans)[3] = keel_xmalloc((r->n_groups ? r->n_groups : 1) * sizeof *spans, "parquet chunks");
    size_t n = 0;
    for (size_t i = 0; i < r->n_groups; i++) {
        const pq_chunk_meta *g = &r->groups[i];
        if (g->num_rows == 0) continue;
        uint64_t start = (uint64_t)chunk_start(g);
        spans[n][0] = start;
        spans[n][1] = start + (uint64_t)g->compressed_bytes;
        spans[n++][2] = i;
    }
    qsort(spans, n, sizeof *spans, by_start);
    keel_status st = KEEL_OK;
    for (size_t i = 1; i < n && st == KEEL_OK; i++) {
        if (spans[i][0] < spans[i - 1][1]) {
            r->group = (size_t)spans[i][2];
            st = corrupt(r, why, why_n, "its column chunk overlaps row group %llu's",
                         (unsigned long long)spans[i - 1][2] + 1);
        }
    }
    keel_free(spans);
    return st;
}

/* Every row group's chunk of the column: there, in this file, unencrypted, of
 * a codec keel reads, inside the file's data, as many values as rows, apart
 * from the others. */
static keel_status check_chunks(parquet_reader *r, size_t leaf, char *why, size_t why_n) {
    for (r->group = 0; r->group < r->n_groups; r->group++) {
        const pq_chunk_meta *g = &r->groups[r->group];
        size_t at = r->group + 1;
        if (g->encrypted) {
            snprintf(why, why_n, "is encrypted (column \"%s\", row group %zu); decrypt it first: keel "
                     "reads plain Parquet", r->column, at);
            return KEEL_ERR_INPUT;
        }
        if (g->other_file) {
            snprintf(why, why_n, "keeps column \"%s\" of row group %zu in another file (file_path); "
                     "keel reads self-contained Parquet files: rewrite it as one", r->column, at);
            return KEEL_ERR_INPUT;
        }
        if (g->num_rows == 0) continue;
        if (!g->found)
            return g->n_columns <= (int64_t)leaf
                       ? corrupt(r, why, why_n, "the row group has %lld column chunks, its schema more",
                                 (long long)g->n_columns)
                       : corrupt(r, why, why_n, "the column chunk has no metadata");
        if (g->type != PQ_BYTE_ARRAY)
            return corrupt(r, why, why_n, "the chunk is %s, the schema says BYTE_ARRAY", type_name(g->type));
        if (g->codec != PQ_UNCOMPRESSED && g->codec != PQ_SNAPPY && g->codec != PQ_GZIP && g->codec != PQ_ZSTD) {
            snprintf(why, why_n, "uses the %s codec (column \"%s\", row group %zu); keel reads Parquet "
                     "pages uncompressed or compressed with SNAPPY, GZIP or ZSTD: rewrite it with one of "
                     "those (pyarrow: pq.write_table(table, path, compression=\"zstd\"))",
                     codec_name(g->codec), r->column, at);
            return KEEL_ERR_INPUT;
        }
        if (g->num_values != g->num_rows)
            return corrupt(r, why, why_n, "the column chunk holds %lld values for %lld rows",
                           (long long)g->num_values, (long long)g->num_rows);
        int64_t start = chunk_start(g);
        if (start < 4 || (uint64_t)start > r->data_end || (uint64_t)g->compressed_bytes > r->data_end - (uint64_t)start)
            return corrupt(r, why, why_n, "the column chunk (%lld bytes at byte %lld) lies outside the file's "
                           "data (bytes 4 to %llu)", (long long)g->compressed_bytes, (long long)start,
                           (unsigned long long)r->data_end);
    }
    keel_status st = check_no_overlap(r, why, why_n);
    r->group = 0;
    return st;
}

/* The footer: PAR1 at both ends, the metadata's length before the last. */
static keel_status read_footer(parquet_reader *r, uint8_t **meta, size_t *meta_len, char *why, size_t why_n) {
    uint8_t head[4] = {0}, tail[8] = {0};
    keel_status st = KEEL_OK;
    if (r->size >= 4) st = read_at(r, 0, head, 4, why, why_n);
    if (st == KEEL_OK && r->size >= 8) st = read_at(r, r->size - 8, tail, 8, why, why_n);
    if (st != KEEL_OK) return st;
    bool starts = r->size >= 4 && !memcmp(head, "PAR1", 4);
    if (r->size >= 12 && !memcmp(tail + 4, "PARE", 4)) {
        snprintf(why, why_n, "is encrypted (its footer ends PARE); decrypt it first: keel reads plain Parquet");
        return KEEL_ERR_INPUT;
    }
    if (r->size < 12 || memcmp(tail + 4, "PAR1", 4)) {
        if (starts)
            snprintf(why, why_n, "is truncated: it starts as a Parquet file but does not end with one's "
                     "footer (PAR1); copy or download it again");
        else
            snprintf(why, why_n, "is not a Parquet file (it does not start or end with PAR1); name a "
                     ".parquet file, or give the file the extension of what it holds");
        return KEEL_ERR_INPUT;
    }
    uint64_t len = le32(tail);
    if (len > r->size - 12) {
        snprintf(why, why_n, "is truncated or corrupt: its footer claims %llu bytes of metadata in a file of "
                 "%llu bytes; copy or download it again", (unsigned long long)len, (unsigned long long)r->size);
        return KEEL_ERR_INPUT;
    }
    if (!starts) {
        snprintf(why, why_n, "is corrupt: it ends as a Parquet file but does not start with PAR1; " FIX_DAMAGED);
        return KEEL_ERR_INPUT;
    }
    if (len > PARQUET_MAX_FOOTER_BYTES) {
        snprintf(why, why_n, "has a footer of %llu MiB, over keel's limit of %u MiB; rewrite it with fewer "
                 "row groups", (unsigned long long)(len >> 20), PARQUET_MAX_FOOTER_BYTES >> 20);
        return KEEL_ERR_INPUT;
    }
    r->data_end = r->size - 8 - len;
    *meta_len = (size_t)len;
    *meta = keel_xmalloc(len ? len : 1, "parquet footer");
    st = read_at(r, r->data_end, *meta, (size_t)len, why, why_n);
    if (st != KEEL_OK) {
        keel_free(*meta);
        *meta = NULL;
    }
    return st;
}

static keel_status open_reader(parquet_reader *r, char *why, size_t why_n) {
    uint8_t *meta = NULL;
    size_t meta_len, bad_at, leaf = 0;
    pq_schema_elem *schema = NULL;
    size_t n_schema = 0;
    bool encrypted;
    keel_status st = read_footer(r, &meta, &meta_len, why, why_n);
    if (st != KEEL_OK) return st;
    if (!pq_read_schema(meta, meta_len, &schema, &n_schema, &encrypted, &bad_at)) {
        snprintf(why, why_n, "is corrupt: its footer's metadata is malformed at byte %zu of %zu; " FIX_DAMAGED,
                 bad_at, meta_len);
        st = KEEL_ERR_INPUT;
    } else if (encrypted) {
        snprintf(why, why_n, "is encrypted (its footer names an encryption algorithm); decrypt it first: "
                 "keel reads plain Parquet");
        st = KEEL_ERR_INPUT;
    }
    if (st == KEEL_OK) st = find_column(r, schema, n_schema, &leaf, why, why_n);
    if (st == KEEL_OK && !pq_read_row_groups(meta, meta_len, leaf, &r->groups, &r->n_groups, &bad_at)) {
        snprintf(why, why_n, "is corrupt: its footer's row groups are malformed at byte %zu of %zu; " FIX_DAMAGED,
                 bad_at, meta_len);
        st = KEEL_ERR_INPUT;
    }
    if (st == KEEL_OK) st = check_chunks(r, leaf, why, why_n);
    keel_free(schema);
    keel_free(meta);
    return st;
}

static parquet_reader *new_reader(const char *column) {
    parquet_reader *r = keel_xcalloc(sizeof *r, "parquet reader");
    r->fd = -1;
    r->column = keel_xstrdup(column);
    return r;
}

keel_status parquet_open_file(const char *path, const char *column, parquet_reader **out, char *why,
                              size_t why_n) {
    *out = NULL;
    int fd;
    char open_why[200];
    keel_status st = keel_open_read(path, false, &fd, open_why, sizeof open_why);
    if (st != KEEL_OK) {
        snprintf(why, why_n, "cannot be read: %s%s", open_why,
                 errno == EINVAL ? " (Parquet is read from its end: give a file, not a pipe)" : "");
        return st;
    }
    parquet_reader *r = new_reader(column);
    r->fd = fd;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        snprintf(why, why_n, "cannot be read: %s", strerror(errno));
        parquet_close(r);
        return KEEL_ERR_IO;
    }
    r->size = (uint64_t)sb.st_size;
    st = open_reader(r, why, why_n);
    if (st != KEEL_OK) {
        parquet_close(r);
        return st;
    }
    *out = r;
    return KEEL_OK;
}

keel_status parquet_open_memory(const void *bytes, size_t len, const char *column, parquet_reader **out,
                                char *why, size_t why_n) {
    parquet_reader *r = new_reader(column);
    r->mem = bytes;
    r->size = len;
    keel_status st = open_reader(r, why, why_n);
    if (st != KEEL_OK) {
        parquet_close(r);
        r = NULL;
    }
    *out = r;
    return st;
}

uint64_t parquet_raw_bytes(const parquet_reader *r) { return r->furthest; }

void parquet_close(parquet_reader *r) {
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    if (r->z_ready) inflateEnd(&r->z);
    ZSTD_freeDCtx(r->zd);
    pq_page_free(&r->pg);
    keel_free(r->groups);
    keel_free(r->column);
    keel_free(r->win);
    keel_free(r->page);
    keel_free(r->dict_data);
    keel_free(r->dict_at);
    keel_free(r);
}
