/* core/json.c: JSON numbers as integers — every parser's one range-checked
 * conversion — and the text check for a \u0000 escape. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "keel/core.h"

/* cJSON holds every number as a double: above 2^53 it no longer says which
 * integer the file wrote, and outside [-2^63, 2^63) the conversion to int64
 * is undefined (1e19, 1e300, inf), so both are refused before converting. */
#define EXACT_LIMIT 0x1p53

bool keel_json_int(const struct cJSON *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double x = v->valuedouble;
    if (!(x >= -EXACT_LIMIT && x <= EXACT_LIMIT) || x != floor(x)) return false; /* NaN fails too */
    int64_t i = (int64_t)x;
    if (i < lo || i > hi) return false;
    *out = i;
    return true;
}

bool keel_json_escaped_nul(const char *text, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (text[i] != '\\') continue;
        if (i + 5 < n && !memcmp(text + i + 1, "u0000", 5)) return true;
        i++; /* the escaped character (a "\\" is one) */
    }
    return false;
}
