/* test_parquet_hostile: Parquet files built byte by byte (a small Thrift
 * compact writer below) that no writer makes, through keel's reader
 * (src/data/parquet.c): each bound docs/data.md promises holds, as one
 * refusal naming what is wrong — overlapping column chunks, a page over
 * 1 GiB, a page claiming more than its codec can make, Thrift nested 100000
 * deep, a list claiming 2^31 elements, a dictionary claiming 2^30 entries
 * in 8 bytes, a chunk outside the file, a footer longer than the file, a
 * page header cut by its chunk's end, delta lengths claiming more values than
 * the page — and 2^31 - 1 null rows stored in a few bytes come out as one
 * run. The same builder makes a valid file first, read back row by row, so a
 * refusal is the reader's and not the builder's mistake. pyarrow's files are
 * tests/data/data_prepare_parquet.sh; random bytes tests/fuzz/fuzz_parquet.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/parquet.h"

#include "../testlib.h"

/* ---- a byte buffer and the Thrift compact protocol ----------------------------- */

typedef struct {
    uint8_t *b;
    size_t n, cap;
    int last[64]; /* the last field id of each open struct */
    int depth;
} buf;

static void put(buf *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 64;
        w->b = realloc(w->b, w->cap);
        if (!w->b) abort();
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void byte(buf *w, uint8_t x) { put(w, &x, 1); }
static void uvar(buf *w, uint64_t v) {
    do {
        byte(w, (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
        v >>= 7;
    } while (v);
}
static void zz(buf *w, int64_t v) { uvar(w, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63)); }
static void le32(buf *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(w, b, 4);
}

enum { T_I32 = 5, T_I64 = 6, T_BINARY = 8, T_LIST = 9, T_STRUCT = 12 };

static void field(buf *w, int id, int type) {
    int delta = id - w->last[w->depth];
    if (delta > 0 && delta <= 15) {
        byte(w, (uint8_t)(delta << 4 | type));
    } else {
        byte(w, (uint8_t)type);
        zz(w, id);
    }
    w->last[w->depth] = id;
}
static void i32f(buf *w, int id, int32_t v) { field(w, id, T_I32), zz(w, v); }
static void i64f(buf *w, int id, int64_t v) { field(w, id, T_I64), zz(w, v); }
static void strf(buf *w, int id, const char *s) { field(w, id, T_BINARY), uvar(w, strlen(s)), put(w, s, strlen(s)); }
static void open_struct(buf *w) { w->last[++w->depth] = 0; }
static void struct_f(buf *w, int id) { field(w, id, T_STRUCT), open_struct(w); }
static void end(buf *w) { byte(w, 0), w->depth--; }
static void list_f(buf *w, int id, int elem, uint64_t n) {
    field(w, id, T_LIST);
    if (n < 15) byte(w, (uint8_t)(n << 4 | (uint64_t)elem));
    else byte(w, (uint8_t)(0xf0 | elem)), uvar(w, n);
}

/* ---- Parquet pieces ------------------------------------------------------------ */

enum { PLAIN = 0, RLE = 3, DELTA_LENGTH_BYTE_ARRAY = 6 };
enum { DATA_PAGE = 0, DICTIONARY_PAGE = 2 };
enum { UNCOMPRESSED = 0, SNAPPY = 1 };

typedef struct {
    int32_t type, uncompressed, compressed, num_values, encoding;
    const void *body;
    size_t body_len;
} page_spec;

/* A page header and its body (compressed = body_len, uncompressed as said). */
static void add_page(buf *f, const page_spec *p) {
    open_struct(f);
    i32f(f, 1, p->type);
    i32f(f, 2, p->uncompressed);
    i32f(f, 3, p->compressed);
    if (p->type == DICTIONARY_PAGE) {
        struct_f(f, 7);
        i32f(f, 1, p->num_values);
        i32f(f, 2, PLAIN);
    } else {
        struct_f(f, 5);
        i32f(f, 1, p->num_values);
        i32f(f, 2, p->encoding);
        i32f(f, 3, RLE);
        i32f(f, 4, RLE);
    }
    end(f);
    end(f);
    put(f, p->body, p->body_len);
}

typedef struct {
    int64_t offset, size, rows;
    int32_t codec;
} group_spec;

/* The footer: a schema of one optional string column "text", the groups'
 * chunks of it, `extra` bytes (a field of FileMetaData) before its end. */
static void add_footer(buf *f, const group_spec *g, size_t n, const buf *extra) {
    size_t start = f->n;
    open_struct(f);
    i32f(f, 1, 1);
    list_f(f, 2, T_STRUCT, 2);
    open_struct(f), strf(f, 4, "schema"), i32f(f, 5, 1), end(f);
    open_struct(f), i32f(f, 1, 6), i32f(f, 3, 1), strf(f, 4, "text"), i32f(f, 6, 0), end(f);
    int64_t rows = 0;
    for (size_t i = 0; i < n; i++) rows += g[i].rows;
    i64f(f, 3, rows);
    list_f(f, 4, T_STRUCT, n);
    for (size_t i = 0; i < n; i++) {
        open_struct(f);
        list_f(f, 1, T_STRUCT, 1);
        open_struct(f);
        i64f(f, 2, g[i].offset);
        struct_f(f, 3);
        i32f(f, 1, 6);
        list_f(f, 2, T_I32, 1), zz(f, PLAIN);
        list_f(f, 3, T_BINARY, 1), uvar(f, 4), put(f, "text", 4);
        i32f(f, 4, g[i].codec);
        i64f(f, 5, g[i].rows);
        i64f(f, 6, g[i].size);
        i64f(f, 7, g[i].size);
        i64f(f, 9, g[i].offset);
        end(f); /* ColumnMetaData */
        end(f); /* ColumnChunk */
        i64f(f, 2, g[i].size);
        i64f(f, 3, g[i].rows);
        end(f); /* RowGroup */
    }
    if (extra) put(f, extra->b, extra->n);
    end(f);
    le32(f, (uint32_t)(f->n - start));
    put(f, "PAR1", 4);
}

/* A file of one row group whose chunk is the given pages. */
static buf one_group(const page_spec *pages, size_t n_pages, int64_t rows, int32_t codec) {
    buf f = {0};
    put(&f, "PAR1", 4);
    for (size_t i = 0; i < n_pages; i++) add_page(&f, &pages[i]);
    group_spec g = {.offset = 4, .size = (int64_t)f.n - 4, .rows = rows, .codec = codec};
    add_footer(&f, &g, 1, NULL);
    return f;
}

/* ---- reading ------------------------------------------------------------------- */

/* A run as read, its text copied (the reader's is gone once it is closed). */
typedef struct {
    bool null;
    char text[16];
    size_t len;
    uint64_t count, first_row;
} row_run;

/* Open and read every row; the error's why (or "" when the file reads whole)
 * into why, the runs into runs[] (at most max). */
static int read_all(const buf *f, char *why, size_t why_n, row_run *runs, int max, int *n_runs) {
    parquet_reader *r;
    why[0] = '\0';
    *n_runs = 0;
    keel_status st = parquet_open_memory(f->b, f->n, "text", &r, why, why_n);
    if (st != KEEL_OK) return st;
    for (;;) {
        parquet_run run;
        bool done;
        st = parquet_next(r, &run, &done, why, why_n);
        if (st != KEEL_OK || done) break;
        if (*n_runs < max) {
            row_run *rr = &runs[*n_runs];
            *rr = (row_run){.null = !run.text, .len = run.len, .count = run.count, .first_row = run.first_row};
            if (run.text) memcpy(rr->text, run.text, run.len < 16 ? run.len : 16);
        }
        ++*n_runs;
    }
    if (st != KEEL_OK) { /* it stays failed */
        parquet_run run;
        bool done;
        char again[512];
        if (parquet_next(r, &run, &done, again, sizeof again) != st) st = KEEL_ERR_IO;
    }
    parquet_close(r);
    return st;
}

static void expect_refusal(const char *name, const buf *f, const char *want) {
    char why[1024];
    row_run runs[4];
    int n;
    int st = read_all(f, why, sizeof why, runs, 4, &n);
    EXPECT(st == KEEL_ERR_INPUT && strstr(why, want) && !strchr(why, '\n'),
           "%s: refused, '%s' (want '%s')", name, why, want);
}

/* The definition levels of a v1 page: their length, then RLE/bit-packed runs. */
static void levels(buf *b, const uint8_t *runs, size_t n) {
    le32(b, (uint32_t)n);
    put(b, runs, n);
}

int main(void) {
    /* a valid file: "a", null, "bc" — levels bit-packed 1 0 1, values PLAIN */
    buf body = {0};
    levels(&body, (const uint8_t[]){0x03, 0x05}, 2);
    le32(&body, 1), put(&body, "a", 1), le32(&body, 2), put(&body, "bc", 2);
    page_spec page = {.type = DATA_PAGE, .uncompressed = (int32_t)body.n, .compressed = (int32_t)body.n,
                      .num_values = 3, .encoding = PLAIN, .body = body.b, .body_len = body.n};
    buf valid = one_group(&page, 1, 3, UNCOMPRESSED);
    char why[1024];
    row_run runs[8];
    int n;
    int st = read_all(&valid, why, sizeof why, runs, 8, &n);
    EXPECT(st == KEEL_OK && n == 3 && runs[0].len == 1 && !memcmp(runs[0].text, "a", 1) && runs[1].null &&
               runs[1].first_row == 2 && runs[2].len == 2 && !memcmp(runs[2].text, "bc", 2) &&
               runs[2].first_row == 3,
           "a hand-built file reads back as a, null, bc (%d runs; %s)", n, why);

    /* 2^31 - 1 null rows in one RLE run: one run out, at once */
    buf nulls = {0};
    levels(&nulls, (const uint8_t[]){0xfe, 0xff, 0xff, 0xff, 0x0f, 0x00}, 6);
    page = (page_spec){.type = DATA_PAGE, .uncompressed = (int32_t)nulls.n, .compressed = (int32_t)nulls.n,
                       .num_values = INT32_MAX, .encoding = PLAIN, .body = nulls.b, .body_len = nulls.n};
    buf many = one_group(&page, 1, INT32_MAX, UNCOMPRESSED);
    double t0 = keel_now_s();
    st = read_all(&many, why, sizeof why, runs, 8, &n);
    EXPECT(st == KEEL_OK && n == 1 && runs[0].null && runs[0].count == INT32_MAX && keel_now_s() - t0 < 1.0,
           "2^31 - 1 null rows in 6 bytes are one run (%d runs, %.3f s; %s)", n, keel_now_s() - t0, why);

    /* two row groups pointing at the same chunk */
    buf overlap = {0};
    put(&overlap, "PAR1", 4);
    add_page(&overlap, &(page_spec){.type = DATA_PAGE, .uncompressed = (int32_t)body.n,
                                    .compressed = (int32_t)body.n, .num_values = 3, .encoding = PLAIN,
                                    .body = body.b, .body_len = body.n});
    int64_t size = (int64_t)overlap.n - 4;
    group_spec twice[2] = {{4, size, 3, UNCOMPRESSED}, {4, size, 3, UNCOMPRESSED}};
    add_footer(&overlap, twice, 2, NULL);
    expect_refusal("overlapping chunks", &overlap, "row group 2 of 2, column \"text\": its column chunk overlaps row group 1's");

    /* a page over 1 GiB, and one claiming more than Snappy makes of its bytes */
    page = (page_spec){.type = DATA_PAGE, .uncompressed = 1536 << 20, .compressed = 10, .num_values = 3,
                       .encoding = PLAIN, .body = "0123456789", .body_len = 10};
    buf huge = one_group(&page, 1, 3, SNAPPY);
    expect_refusal("a page of 1.5 GiB", &huge, "over keel's limit of 1 GiB a page");
    page.uncompressed = 10000;
    buf ratio = one_group(&page, 1, 3, SNAPPY);
    expect_refusal("a page claiming 1000:1 of Snappy", &ratio, "it claims 10000 bytes decompressed from 10, more than SNAPPY makes");

    /* a dictionary page claiming 2^30 entries in 8 bytes */
    page = (page_spec){.type = DICTIONARY_PAGE, .uncompressed = 8, .compressed = 8, .num_values = 1 << 30,
                       .body = "\1\0\0\0x\0\0\0", .body_len = 8};
    buf dict = one_group(&page, 1, 3, UNCOMPRESSED);
    expect_refusal("a dictionary of 2^30 entries in 8 bytes", &dict, "its dictionary page claims 1073741824 entries in 8 bytes");

    /* delta lengths claiming more values than the page has rows */
    buf delta = {0};
    levels(&delta, (const uint8_t[]){0x06, 0x01}, 2); /* 3 rows present */
    byte(&delta, 0x80), byte(&delta, 0x01), byte(&delta, 4), uvar(&delta, 1000), zz(&delta, 1);
    page = (page_spec){.type = DATA_PAGE, .uncompressed = (int32_t)delta.n, .compressed = (int32_t)delta.n,
                       .num_values = 3, .encoding = DELTA_LENGTH_BYTE_ARRAY, .body = delta.b, .body_len = delta.n};
    buf lengths = one_group(&page, 1, 3, UNCOMPRESSED);
    expect_refusal("delta lengths for 1000 values in a page of 3", &lengths, "DELTA_LENGTH_BYTE_ARRAY lengths' header is malformed");

    /* a chunk past the file's data, a page header cut by its chunk's end */
    buf outside = {0};
    put(&outside, "PAR1", 4);
    add_footer(&outside, &(group_spec){1 << 20, 100, 3, UNCOMPRESSED}, 1, NULL);
    expect_refusal("a chunk outside the file", &outside, "lies outside the file's data");
    buf cut = {0};
    put(&cut, "PAR1", 4);
    add_page(&cut, &(page_spec){.type = DATA_PAGE, .uncompressed = (int32_t)body.n, .compressed = (int32_t)body.n,
                                .num_values = 3, .encoding = PLAIN, .body = body.b, .body_len = body.n});
    add_footer(&cut, &(group_spec){4, 6, 3, UNCOMPRESSED}, 1, NULL);
    expect_refusal("a page header past its chunk", &cut, "its page header runs past the column chunk");

    /* the footer: nested 100000 deep, a list of 2^31 elements, longer than the file */
    buf deep = {0};
    field(&deep, 20, T_STRUCT);
    for (int i = 0; i < 100000; i++) byte(&deep, 0x1c); /* field 1, a struct, in each */
    for (int i = 0; i < 100001; i++) byte(&deep, 0);
    buf nested = {0};
    put(&nested, "PAR1", 4);
    nested.last[0] = 0;
    add_footer(&nested, NULL, 0, &deep);
    expect_refusal("Thrift nested 100000 deep", &nested, "is corrupt: its footer's metadata is malformed at byte");
    buf list = {0};
    field(&list, 20, T_LIST), byte(&list, 0xfc), uvar(&list, 1u << 31);
    buf long_list = {0};
    put(&long_list, "PAR1", 4);
    add_footer(&long_list, NULL, 0, &list);
    expect_refusal("a list of 2^31 structs in a few bytes", &long_list, "its footer's metadata is malformed");
    buf footer = {0};
    put(&footer, "PAR1xxxx", 8), le32(&footer, 1000), put(&footer, "PAR1", 4);
    expect_refusal("a footer longer than the file", &footer, "is truncated or corrupt: its footer claims 1000 bytes of metadata in a file of 16 bytes");

    buf *all[] = {&body, &valid, &nulls, &many, &overlap, &huge, &ratio, &dict, &delta, &lengths, &outside,
                  &cut, &deep, &nested, &list, &long_list, &footer};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]->b);
    return test_summary("test_parquet_hostile");
}
