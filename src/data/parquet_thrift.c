/* data/parquet_thrift.c: Parquet's FileMetaData and PageHeader read from the
 * Thrift compact protocol, only the fields keel uses (see parquet_thrift.h). */
#include "data/parquet_thrift.h"

#include <string.h>

/* The compact protocol's wire types. */
enum { T_STOP = 0, T_TRUE = 1, T_FALSE = 2, T_I8 = 3, T_I16 = 4, T_I32 = 5, T_I64 = 6,
       T_DOUBLE = 7, T_BINARY = 8, T_LIST = 9, T_SET = 10, T_MAP = 11, T_STRUCT = 12,
       T_UUID = 13 };

/* A reader over bytes; once `bad` is set every read fails. */
typedef struct {
    const uint8_t *start, *p, *end;
    int depth;
    bool bad;
    bool short_; /* bad because the bytes ran out */
} tc;

static bool fail(tc *c) {
    c->bad = true;
    return false;
}

static bool ran_out(tc *c) {
    c->short_ = true;
    return fail(c);
}

static bool take(tc *c, uint64_t n, const uint8_t **at) {
    if (c->bad) return false;
    if (n > (uint64_t)(c->end - c->p)) return ran_out(c);
    if (at) *at = c->p;
    c->p += n;
    return true;
}

/* ULEB128, at most 10 bytes, no bits past 64. */
static bool varint(tc *c, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        const uint8_t *b;
        if (!take(c, 1, &b)) return false;
        if (shift == 63 && *b > 1) return fail(c);
        x |= (uint64_t)(*b & 0x7f) << shift;
        if (!(*b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return fail(c);
}

static bool zigzag(tc *c, int64_t *v) {
    uint64_t x;
    if (!varint(c, &x)) return false;
    *v = (int64_t)(x >> 1) ^ -(int64_t)(x & 1);
    return true;
}

static bool i32_value(tc *c, int32_t *v) {
    int64_t x;
    if (!zigzag(c, &x)) return false;
    if (x < INT32_MIN || x > INT32_MAX) return fail(c);
    *v = (int32_t)x;
    return true;
}

/* The next field of the struct being read: false at its STOP byte (or on an
 * error: c->bad). *last is the previous field's id (0 at the start). */
static bool field(tc *c, int *last, int *id, int *type) {
    const uint8_t *b;
    if (!take(c, 1, &b)) return false;
    if (*b == T_STOP) return false;
    *type = *b & 0x0f;
    int delta = *b >> 4;
    if (delta) {
        *id = *last + delta;
    } else {
        int64_t v;
        if (!zigzag(c, &v)) return false;
        if (v < INT16_MIN || v > INT16_MAX) return fail(c);
        *id = (int)v;
    }
    if (*id > INT16_MAX || *type == T_STOP || *type > T_UUID) return fail(c);
    *last = *id;
    return true;
}

/* A list or set header: n elements of wire type *elem. Every element takes a
 * byte at least, so n is at most the bytes left. */
static bool list_header(tc *c, uint64_t *n, int *elem) {
    const uint8_t *b;
    if (!take(c, 1, &b)) return false;
    *n = *b >> 4;
    *elem = *b & 0x0f;
    if (*n == 15 && !varint(c, n)) return false;
    if (*elem == T_STOP || *elem > T_UUID) return fail(c);
    if (*n > (uint64_t)(c->end - c->p)) return ran_out(c);
    return true;
}

static bool skip(tc *c, int type);

/* An element of a list, set or map: a boolean is a byte there. */
static bool skip_element(tc *c, int type) {
    return type == T_TRUE || type == T_FALSE ? take(c, 1, NULL) : skip(c, type);
}

static bool skip_struct(tc *c) {
    if (++c->depth > PQ_THRIFT_MAX_DEPTH) return fail(c);
    int last = 0, id, type;
    while (field(c, &last, &id, &type))
        if (!skip(c, type)) return false;
    c->depth--;
    return !c->bad;
}

/* A value of wire type `type` (as a field: a boolean has no bytes). */
static bool skip(tc *c, int type) {
    uint64_t n, v;
    int elem;
    switch (type) {
    case T_TRUE:
    case T_FALSE: return !c->bad;
    case T_I8: return take(c, 1, NULL);
    case T_I16:
    case T_I32:
    case T_I64: return varint(c, &v);
    case T_DOUBLE: return take(c, 8, NULL);
    case T_UUID: return take(c, 16, NULL);
    case T_BINARY: return varint(c, &n) && take(c, n, NULL);
    case T_STRUCT: return skip_struct(c);
    case T_LIST:
    case T_SET:
        if (!list_header(c, &n, &elem) || ++c->depth > PQ_THRIFT_MAX_DEPTH) return fail(c);
        for (uint64_t i = 0; i < n; i++)
            if (!skip_element(c, elem)) return false;
        c->depth--;
        return true;
    case T_MAP: {
        const uint8_t *kv;
        if (!varint(c, &n)) return false;
        if (n == 0) return true;
        if (n > (uint64_t)(c->end - c->p) / 2) return ran_out(c);
        if (!take(c, 1, &kv) || ++c->depth > PQ_THRIFT_MAX_DEPTH) return fail(c);
        for (uint64_t i = 0; i < n; i++)
            if (!skip_element(c, *kv >> 4) || !skip_element(c, *kv & 0x0f)) return false;
        c->depth--;
        return true;
    }
    default: return fail(c);
    }
}

/* Field readers: the wire type must be the field's. */
static bool read_i32(tc *c, int type, int32_t *v) { return type == T_I32 ? i32_value(c, v) : fail(c); }
static bool read_i64(tc *c, int type, int64_t *v) { return type == T_I64 ? zigzag(c, v) : fail(c); }

static bool read_binary(tc *c, int type, const char **s, size_t *len) {
    uint64_t n;
    const uint8_t *at;
    if (type != T_BINARY || !varint(c, &n) || !take(c, n, &at)) return fail(c);
    *s = (const char *)at;
    *len = (size_t)n;
    return true;
}

/* A struct field: reading it is one level deeper. */
static bool enter(tc *c, int type) { return type == T_STRUCT && ++c->depth <= PQ_THRIFT_MAX_DEPTH ? true : fail(c); }
static bool leave(tc *c) {
    c->depth--;
    return !c->bad;
}

/* ---- FileMetaData ----------------------------------------------------------- */

/* LogicalType is a union: the id of the member that is set. */
static bool read_logical(tc *c, int type, int32_t *logical) {
    if (!enter(c, type)) return false;
    int last = 0, id, t;
    while (field(c, &last, &id, &t)) {
        *logical = id;
        if (!skip(c, t)) return false;
    }
    return leave(c);
}

static bool read_schema_elem(tc *c, pq_schema_elem *e) {
    *e = (pq_schema_elem){.type = -1, .repetition = -1, .converted = -1, .logical = -1};
    if (!enter(c, T_STRUCT)) return false;
    int last = 0, id, t;
    bool ok = true;
    while (ok && field(c, &last, &id, &t)) {
        switch (id) {
        case 1: ok = read_i32(c, t, &e->type); break;
        case 3: ok = read_i32(c, t, &e->repetition); break;
        case 4: ok = read_binary(c, t, &e->name, &e->name_len); break;
        case 5: ok = read_i32(c, t, &e->num_children); break;
        case 6: ok = read_i32(c, t, &e->converted); break;
        case 10: ok = read_logical(c, t, &e->logical); break;
        default: ok = skip(c, t); break;
        }
    }
    if (e->num_children < 0) return fail(c);
    return leave(c);
}

static bool read_schema_list(tc *c, int type, pq_schema_elem **elems, size_t *n_elems) {
    uint64_t n;
    int elem;
    if (type != T_LIST || !list_header(c, &n, &elem) || elem != T_STRUCT || *elems) return fail(c);
    /* n <= the bytes left (list_header): the array is at most a few times the footer */
    *elems = keel_xcalloc((size_t)(n ? n : 1) * sizeof **elems, "parquet schema");
    *n_elems = (size_t)n;
    for (uint64_t i = 0; i < n; i++)
        if (!read_schema_elem(c, &(*elems)[i])) return false;
    return true;
}

bool pq_read_schema(const uint8_t *meta, size_t len, pq_schema_elem **elems, size_t *n_elems,
                    bool *encrypted, size_t *bad_at) {
    tc c = {.start = meta, .p = meta, .end = meta + len};
    *elems = NULL;
    *n_elems = 0;
    *encrypted = false;
    int last = 0, id, t;
    bool ok = true;
    while (ok && field(&c, &last, &id, &t)) {
        if (id == 2) ok = read_schema_list(&c, t, elems, n_elems);
        else {
            if (id == 8) *encrypted = true; /* encryption_algorithm: a plaintext footer */
            ok = skip(&c, t);
        }
    }
    if (!c.bad && !*elems) fail(&c); /* the schema is required */
    if (c.bad) {
        *bad_at = (size_t)(c.p - c.start);
        keel_free(*elems);
        *elems = NULL;
        *n_elems = 0;
        return false;
    }
    return true;
}

/* ColumnMetaData: the type, codec, value count, size and offsets. */
static bool read_column_meta(tc *c, int type, pq_chunk_meta *g) {
    if (!enter(c, type)) return false;
    int last = 0, id, t;
    bool ok = true, have_offset = false;
    while (ok && field(c, &last, &id, &t)) {
        switch (id) {
        case 1: ok = read_i32(c, t, &g->type); break;
        case 4: ok = read_i32(c, t, &g->codec); break;
        case 5: ok = read_i64(c, t, &g->num_values); break;
        case 7: ok = read_i64(c, t, &g->compressed_bytes); break;
        case 9: ok = read_i64(c, t, &g->data_offset), have_offset = true; break;
        case 11: ok = read_i64(c, t, &g->dict_offset); break;
        default: ok = skip(c, t); break;
        }
    }
    if (ok && !c->bad && (!have_offset || g->type < 0 || g->codec < 0 || g->num_values < 0 ||
                          g->compressed_bytes < 0))
        return fail(c);
    g->found = ok && !c->bad;
    return leave(c);
}

/* ColumnChunk: its metadata, or that it lives in another file or is encrypted. */
static bool read_column_chunk(tc *c, pq_chunk_meta *g) {
    if (!enter(c, T_STRUCT)) return false;
    int last = 0, id, t;
    bool ok = true;
    while (ok && field(c, &last, &id, &t)) {
        if (id == 3) {
            ok = read_column_meta(c, t, g);
        } else {
            if (id == 1) g->other_file = true;               /* file_path */
            if (id == 8 || id == 9) g->encrypted = true;    /* crypto_metadata, encrypted_column_metadata */
            ok = skip(c, t);
        }
    }
    return leave(c);
}

static bool read_columns(tc *c, int type, size_t leaf, pq_chunk_meta *g) {
    uint64_t n;
    int elem;
    if (type != T_LIST || !list_header(c, &n, &elem) || elem != T_STRUCT) return fail(c);
    g->n_columns = (int64_t)n;
    for (uint64_t i = 0; i < n; i++) {
        bool ok = i == leaf ? read_column_chunk(c, g) : skip(c, T_STRUCT);
        if (!ok) return false;
    }
    return true;
}

static bool read_row_group(tc *c, size_t leaf, pq_chunk_meta *g) {
    *g = (pq_chunk_meta){.num_rows = -1, .type = -1, .codec = -1, .num_values = -1,
                         .compressed_bytes = -1, .dict_offset = -1};
    if (!enter(c, T_STRUCT)) return false;
    int last = 0, id, t;
    bool ok = true;
    while (ok && field(c, &last, &id, &t)) {
        switch (id) {
        case 1: ok = read_columns(c, t, leaf, g); break;
        case 3: ok = read_i64(c, t, &g->num_rows); break;
        default: ok = skip(c, t); break;
        }
    }
    if (ok && !c->bad && g->num_rows < 0) return fail(c);
    return leave(c);
}

bool pq_read_row_groups(const uint8_t *meta, size_t len, size_t leaf, pq_chunk_meta **groups,
                        size_t *n_groups, size_t *bad_at) {
    tc c = {.start = meta, .p = meta, .end = meta + len};
    *groups = NULL;
    *n_groups = 0;
    int last = 0, id, t;
    bool ok = true, seen = false;
    while (ok && field(&c, &last, &id, &t)) {
        if (id != 4) {
            ok = skip(&c, t);
            continue;
        }
        uint64_t n;
        int elem;
        if (seen || t != T_LIST || !list_header(&c, &n, &elem) || elem != T_STRUCT) {
            ok = fail(&c);
            break;
        }
        seen = true;
        *groups = keel_xcalloc((size_t)(n ? n : 1) * sizeof **groups, "parquet row groups");
        *n_groups = (size_t)n;
        for (uint64_t i = 0; ok && i < n; i++) ok = read_row_group(&c, leaf, &(*groups)[i]);
    }
    if (!c.bad && !seen) fail(&c); /* row_groups is required */
    if (c.bad) {
        *bad_at = (size_t)(c.p - c.start);
        keel_free(*groups);
        *groups = NULL;
        *n_groups = 0;
        return false;
    }
    return true;
}

/* ---- PageHeader -------------------------------------------------------------- */

static bool read_bool(int type, bool *v) {
    if (type != T_TRUE && type != T_FALSE) return false;
    *v = type == T_TRUE;
    return true;
}

/* DataPageHeader (v1), DictionaryPageHeader or DataPageHeaderV2: `kind` says
 * which; the fields all three share have the same ids (1 num_values, 2 or 4
 * encoding). */
static bool read_page_kind(tc *c, int type, int kind, pq_page_header *h) {
    if (!enter(c, type)) return false;
    int last = 0, id, t;
    bool ok = true, have_n = false, have_enc = false;
    while (ok && field(c, &last, &id, &t)) {
        if (id == 1) ok = read_i32(c, t, &h->num_values), have_n = true;
        else if (kind != PQ_DATA_PAGE_V2 && id == 2) ok = read_i32(c, t, &h->encoding), have_enc = true;
        else if (kind == PQ_DATA_PAGE && id == 3) ok = read_i32(c, t, &h->def_encoding);
        else if (kind == PQ_DATA_PAGE && id == 4) ok = read_i32(c, t, &h->rep_encoding);
        else if (kind == PQ_DATA_PAGE_V2 && id == 4) ok = read_i32(c, t, &h->encoding), have_enc = true;
        else if (kind == PQ_DATA_PAGE_V2 && id == 5) ok = read_i32(c, t, &h->def_bytes);
        else if (kind == PQ_DATA_PAGE_V2 && id == 6) ok = read_i32(c, t, &h->rep_bytes);
        else if (kind == PQ_DATA_PAGE_V2 && id == 7) ok = read_bool(t, &h->is_compressed) || fail(c);
        else ok = skip(c, t);
    }
    if (ok && !c->bad && (!have_n || !have_enc || h->num_values < 0 || h->def_bytes < 0 ||
                          h->rep_bytes < 0))
        return fail(c);
    return leave(c);
}

pq_header_result pq_read_page_header(const uint8_t *p, size_t len, pq_page_header *h,
                                     size_t *header_len) {
    tc c = {.start = p, .p = p, .end = p + len};
    *h = (pq_page_header){.type = -1, .uncompressed_bytes = -1, .compressed_bytes = -1,
                          .def_encoding = PQ_RLE, .rep_encoding = PQ_RLE, .is_compressed = true};
    if (!enter(&c, T_STRUCT)) return PQ_HEADER_BAD;
    int last = 0, id, t;
    bool ok = true;
    while (ok && field(&c, &last, &id, &t)) {
        switch (id) {
        case 1: ok = read_i32(&c, t, &h->type); break;
        case 2: ok = read_i32(&c, t, &h->uncompressed_bytes); break;
        case 3: ok = read_i32(&c, t, &h->compressed_bytes); break;
        case 5: ok = read_page_kind(&c, t, PQ_DATA_PAGE, h), h->has_v1 = true; break;
        case 7: ok = read_page_kind(&c, t, PQ_DICTIONARY_PAGE, h), h->has_dict = true; break;
        case 8: ok = read_page_kind(&c, t, PQ_DATA_PAGE_V2, h), h->has_v2 = true; break;
        default: ok = skip(&c, t); break;
        }
    }
    if (c.bad) return c.short_ ? PQ_HEADER_SHORT : PQ_HEADER_BAD;
    leave(&c);
    if (h->type < 0 || h->uncompressed_bytes < 0 || h->compressed_bytes < 0 ||
        h->has_v1 + h->has_dict + h->has_v2 > 1)
        return PQ_HEADER_BAD;
    *header_len = (size_t)(c.p - p);
    return PQ_HEADER_OK;
}
