/* data/parquet_values.c: the rows of a decompressed Parquet data page as runs
 * of equal rows: levels, PLAIN, dictionary and delta-encoded byte arrays (see
 * parquet_values.h). */
#include "data/parquet_values.h"

#include <string.h>

#include "data/parquet_thrift.h"

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ULEB128 from *p (before end), at most 10 bytes. */
static bool uleb(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        if (shift == 63 && b > 1) return false;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* `width` bits (0..64) at bit `pos` of p, least significant first; the
 * caller has checked that they are inside p's bytes. */
static uint64_t bits_at(const uint8_t *p, uint64_t pos, unsigned width) {
    const uint8_t *b = p + pos / 8;
    unsigned shift = (unsigned)(pos % 8), got = 0;
    uint64_t v = 0;
    while (got < width) {
        v |= (uint64_t)(*b++ >> shift) << got;
        got += 8 - shift;
        shift = 0;
    }
    return width < 64 ? v & ((1ull << width) - 1) : v;
}

/* ---- RLE/bit-packed hybrid ------------------------------------------------- */

static void rle_init(pq_rle *d, const uint8_t *p, const uint8_t *end, unsigned bit_width) {
    *d = (pq_rle){.p = p, .end = end, .bit_width = bit_width};
}

/* Read run headers until a run with values: false when the bytes end first.
 * Each header takes a byte at least, so this ends. */
static bool rle_fill(pq_rle *d) {
    while (d->rle_left == 0 && d->packed_left == 0) {
        uint64_t h;
        if (!uleb(&d->p, d->end, &h)) return false;
        uint64_t avail = (uint64_t)(d->end - d->p), w = d->bit_width;
        if (h & 1) {
            /* groups of 8 values, w bytes a group; the last run may be cut
             * short of its padding, so only the values whose bits are there
             * can be read */
            uint64_t groups = h >> 1;
            uint64_t bytes = w == 0 ? 0 : groups <= avail / w ? groups * w : avail;
            d->packed = d->p;
            d->packed_pos = 0;
            d->packed_left = w == 0 ? min_u64(groups, UINT64_MAX / 16) * 8 : bytes * 8 / w;
            if (w && groups <= UINT64_MAX / 8) d->packed_left = min_u64(d->packed_left, groups * 8);
            d->p += bytes;
        } else {
            uint64_t n = (w + 7) / 8;
            if (n > avail) return false;
            d->rle_value = 0;
            for (uint64_t i = 0; i < n; i++) d->rle_value |= (uint32_t)d->p[i] << (8 * i);
            d->p += n;
            d->rle_left = h >> 1;
        }
    }
    return true;
}

/* The next value and how many values from here are equal to it (at least 1). */
static bool rle_peek(pq_rle *d, uint32_t *v, uint64_t *same) {
    if (!rle_fill(d)) return false;
    if (d->rle_left) {
        *v = d->rle_value;
        *same = d->rle_left;
    } else {
        *v = (uint32_t)bits_at(d->packed, d->packed_pos * d->bit_width, d->bit_width);
        *same = d->bit_width == 0 ? d->packed_left : 1;
    }
    return true;
}

/* Step over n values (n <= the last peek's `same`). */
static void rle_skip(pq_rle *d, uint64_t n) {
    if (d->rle_left) {
        d->rle_left -= n;
    } else {
        d->packed_pos += n;
        d->packed_left -= n;
    }
}

/* ---- DELTA_BINARY_PACKED ----------------------------------------------------- */

/* The header: block size, miniblocks per block, value count (at most
 * max_values), first value. */
static bool delta_init(pq_delta *d, const uint8_t *p, const uint8_t *end, uint64_t max_values) {
    *d = (pq_delta){.end = end};
    uint64_t block, n_mini, count, first;
    if (!uleb(&p, end, &block) || !uleb(&p, end, &n_mini) || !uleb(&p, end, &count) ||
        !uleb(&p, end, &first))
        return false;
    /* the format's rules: a block of a multiple of 128 values, miniblocks of a
     * multiple of 32 (so a miniblock's bits fill whole bytes) */
    if (block == 0 || block % 128 || block > (1u << 30) || n_mini == 0 || block % n_mini ||
        (block / n_mini) % 32 || count > max_values)
        return false;
    d->p = p;
    d->per_mini = block / n_mini;
    d->n_mini = n_mini;
    d->left = count;
    d->first_pending = count > 0;
    d->last = (first >> 1) ^ (~(first & 1) + 1); /* zigzag, wrapping */
    return true;
}

/* The next miniblock with values: false when the bytes end first. */
static bool delta_next_mini(pq_delta *d) {
    if (!d->widths || d->mini_i == d->n_mini) {
        uint64_t zz;
        if (!uleb(&d->p, d->end, &zz) || d->n_mini > (uint64_t)(d->end - d->p)) return false;
        d->min_delta = (zz >> 1) ^ (~(zz & 1) + 1);
        d->widths = d->p;
        d->p += d->n_mini;
        d->mini_i = 0;
    }
    unsigned w = d->widths[d->mini_i++];
    if (w > 64) return false;
    uint64_t bytes = d->per_mini / 8 * w; /* per_mini is a multiple of 32 */
    if (bytes > (uint64_t)(d->end - d->p)) return false;
    d->mini = d->p;
    d->mini_width = w;
    d->mini_pos = 0;
    d->mini_left = min_u64(d->per_mini, d->left);
    d->p += bytes;
    return true;
}

/* The next value and how many values from here are equal to it (a miniblock
 * of width 0 and a zero minimum delta: all of its values). */
static bool delta_peek(pq_delta *d, uint64_t *v, uint64_t *same) {
    if (d->left == 0) return false;
    if (d->first_pending) {
        *v = d->next = d->last;
        *same = 1;
        return true;
    }
    while (d->mini_left == 0)
        if (!delta_next_mini(d)) return false;
    /* unsigned: the deltas wrap around as the format's int64 arithmetic does */
    d->next = d->last + d->min_delta + bits_at(d->mini, d->mini_pos * d->mini_width, d->mini_width);
    *v = d->next;
    *same = d->mini_width == 0 && d->min_delta == 0 ? d->mini_left : 1;
    return true;
}

/* Take n values (n <= the last peek's `same`). */
static void delta_skip(pq_delta *d, uint64_t n) {
    d->left -= n;
    d->last = d->next;
    if (d->first_pending) {
        d->first_pending = false;
        return;
    }
    d->mini_pos += n;
    d->mini_left -= n;
}

/* Where the encoded values end (what follows them starts): every miniblock
 * with values is there whole. Each block's header takes 1 + n_mini bytes, so
 * this walks at most as many miniblocks as there are bytes. */
static const uint8_t *delta_end(const pq_delta *d0) {
    pq_delta d = *d0;
    if (d.first_pending) d.left--;
    while (d.left > 0) {
        if (!delta_next_mini(&d)) return NULL;
        d.left -= d.mini_left;
    }
    return d.p;
}

/* A length from a delta stream: an int32 >= 0. */
static bool delta_length(pq_delta *d, uint64_t *len, uint64_t *same) {
    return delta_peek(d, len, same) && *len <= INT32_MAX;
}

/* ---- a page -------------------------------------------------------------------- */

/* The definition levels: v1 has a 4-byte length before them, v2 gives it in
 * its header (with the repetition levels', which a top-level column that is
 * not repeated has none of, before them). *values is where the values start. */
static const char *start_levels(pq_page *pg, const pq_page_layout *l, const uint8_t **values) {
    const uint8_t *p = l->data;
    if (l->v2) {
        if (l->rep_bytes > l->len || l->def_bytes > l->len - l->rep_bytes)
            return "its levels' lengths run past the page";
        p += l->rep_bytes;
        if (l->max_def) rle_init(&pg->def, p, p + l->def_bytes, 1);
        *values = p + l->def_bytes;
        return NULL;
    }
    if (l->max_def) {
        if (l->len < 4) return "it ends before its definition levels' length";
        uint32_t n = le32(p);
        if (n > l->len - 4) return "its definition levels run past the page";
        rle_init(&pg->def, p + 4, p + 4 + n, 1);
        p += 4 + n;
    }
    *values = p;
    return NULL;
}

const char *pq_page_start(pq_page *pg, const pq_page_layout *l) {
    pg->left = l->num_values;
    pg->max_def = l->max_def;
    pg->encoding = l->encoding;
    pg->value_len = 0;
    const uint8_t *values, *end = l->data + l->len;
    const char *bad = start_levels(pg, l, &values);
    if (bad) return bad;
    pg->p = values;
    pg->end = end;
    switch (l->encoding) {
    case PQ_PLAIN: return NULL;
    case PQ_PLAIN_DICTIONARY:
    case PQ_RLE_DICTIONARY:
        if (!l->dict) return "it is dictionary-encoded but its column chunk has no dictionary page";
        if (values == end) return "it ends before its dictionary indices' bit width";
        if (*values > 32) return "its dictionary indices' bit width is over 32";
        pg->dict = l->dict;
        pg->dict_at = l->dict_at;
        pg->dict_n = l->dict_n;
        rle_init(&pg->indices, values + 1, end, *values);
        return NULL;
    case PQ_DELTA_LENGTH_BYTE_ARRAY:
        if (!delta_init(&pg->lengths, values, end, l->num_values))
            return "its DELTA_LENGTH_BYTE_ARRAY lengths' header is malformed";
        if (!(pg->p = delta_end(&pg->lengths))) return "its DELTA_LENGTH_BYTE_ARRAY lengths run past the page";
        return NULL;
    case PQ_DELTA_BYTE_ARRAY: {
        if (!delta_init(&pg->prefixes, values, end, l->num_values))
            return "its DELTA_BYTE_ARRAY prefix lengths' header is malformed";
        const uint8_t *suffixes = delta_end(&pg->prefixes);
        if (!suffixes) return "its DELTA_BYTE_ARRAY prefix lengths run past the page";
        if (!delta_init(&pg->lengths, suffixes, end, l->num_values))
            return "its DELTA_BYTE_ARRAY suffix lengths' header is malformed";
        if (!(pg->p = delta_end(&pg->lengths))) return "its DELTA_BYTE_ARRAY suffix lengths run past the page";
        return NULL;
    }
    default: return "its values' encoding is not one keel reads";
    }
}

/* The next value (the row is not null) and how many rows from here, at most
 * max_rows, hold the same value; they are taken. */
static const char *take_value(pq_page *pg, uint64_t max_rows, pq_row_run *run) {
    uint64_t same = 1, len, same2;
    switch (pg->encoding) {
    case PQ_PLAIN:
        if (pg->end - pg->p < 4) return "its PLAIN values run past the page";
        len = le32(pg->p);
        if (len > (uint64_t)(pg->end - pg->p) - 4) return "a PLAIN value runs past the page";
        *run = (pq_row_run){.text = pg->p + 4, .len = (size_t)len, .rows = 1};
        pg->p += 4 + len;
        return NULL;
    case PQ_PLAIN_DICTIONARY:
    case PQ_RLE_DICTIONARY: {
        uint32_t i;
        if (!rle_peek(&pg->indices, &i, &same)) return "its dictionary indices run past the page";
        if (i >= pg->dict_n) return "a dictionary index is past the dictionary's end";
        same = min_u64(same, max_rows);
        rle_skip(&pg->indices, same);
        const uint8_t *entry = pg->dict + pg->dict_at[i];
        *run = (pq_row_run){.text = entry + 4, .len = le32(entry), .rows = same};
        return NULL;
    }
    case PQ_DELTA_LENGTH_BYTE_ARRAY:
        if (!delta_length(&pg->lengths, &len, &same)) return "its DELTA_LENGTH_BYTE_ARRAY lengths end early or are negative";
        if (len > (uint64_t)(pg->end - pg->p)) return "a DELTA_LENGTH_BYTE_ARRAY value runs past the page";
        same = len == 0 ? min_u64(same, max_rows) : 1; /* only empty values cost no bytes */
        delta_skip(&pg->lengths, same);
        *run = (pq_row_run){.text = pg->p, .len = (size_t)len, .rows = same};
        pg->p += len;
        return NULL;
    case PQ_DELTA_BYTE_ARRAY: {
        uint64_t prefix;
        if (!delta_length(&pg->prefixes, &prefix, &same)) return "its DELTA_BYTE_ARRAY prefix lengths end early or are negative";
        if (!delta_length(&pg->lengths, &len, &same2)) return "its DELTA_BYTE_ARRAY suffix lengths end early or are negative";
        if (prefix > pg->value_len) return "a DELTA_BYTE_ARRAY prefix is longer than the value before it";
        if (len > (uint64_t)(pg->end - pg->p)) return "a DELTA_BYTE_ARRAY suffix runs past the page";
        /* each value is the last one's prefix and its suffix: with no suffix,
         * rows of one prefix length are all the same value */
        same = len == 0 ? min_u64(min_u64(same, same2), max_rows) : 1;
        delta_skip(&pg->prefixes, same);
        delta_skip(&pg->lengths, same);
        size_t need = (size_t)prefix + (size_t)len;
        if (need > pg->value_cap) {
            pg->value_cap = need > 2 * pg->value_cap ? need : 2 * pg->value_cap;
            pg->value = keel_xrealloc(pg->value, pg->value_cap, "parquet value");
        }
        if (len) memcpy(pg->value + prefix, pg->p, (size_t)len);
        pg->value_len = need;
        pg->p += len;
        /* a present value is never NULL (NULL is a null row), even when empty */
        *run = (pq_row_run){.text = pg->value ? pg->value : (const uint8_t *)"", .len = need, .rows = same};
        return NULL;
    }
    default: return "its values' encoding is not one keel reads";
    }
}

const char *pq_page_next(pq_page *pg, pq_row_run *run) {
    uint64_t max_rows = pg->left;
    if (pg->max_def) {
        uint32_t level;
        uint64_t same;
        if (!rle_peek(&pg->def, &level, &same)) return "its definition levels end before its rows";
        if (level > 1) return "a definition level is over 1 (the column's most)";
        max_rows = min_u64(max_rows, same);
        if (level == 0) { /* null rows */
            rle_skip(&pg->def, max_rows);
            pg->left -= max_rows;
            *run = (pq_row_run){.text = NULL, .len = 0, .rows = max_rows};
            return NULL;
        }
    }
    const char *bad = take_value(pg, max_rows, run);
    if (bad) return bad;
    if (pg->max_def) rle_skip(&pg->def, run->rows);
    pg->left -= run->rows;
    return NULL;
}

void pq_page_free(pq_page *pg) {
    keel_free(pg->value);
    *pg = (pq_page){0};
}

const char *pq_dictionary_parse(const uint8_t *data, size_t len, uint64_t n, uint32_t *at) {
    if (len > UINT32_MAX) return "its dictionary page is over 4 GiB";
    const uint8_t *p = data, *end = data + len;
    for (uint64_t i = 0; i < n; i++) {
        if (end - p < 4) return "its dictionary page ends before its entries do";
        uint32_t entry_len = le32(p);
        if (entry_len > (size_t)(end - p) - 4) return "a dictionary entry runs past its page";
        at[i] = (uint32_t)(p - data);
        p += 4 + entry_len;
    }
    return NULL;
}
