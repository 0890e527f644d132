/* JSON numbers as integers (core/json.c, keel_json_int): every parser's one
 * conversion refuses what is not an integer in range before converting —
 * fractions, NaN/inf, values past 2^53 (a double no longer says which
 * integer the file wrote), 1e19 and 1e300 (undefined as int64) — and gives
 * the exact value otherwise, the ends of the range included. */
#include <cjson/cJSON.h>

#include "keel/core.h"

#include "../testlib.h"

/* keel_json_int of the JSON text, in [lo, hi]; *ok whether it converted. */
static int64_t parse(const char *text, int64_t lo, int64_t hi, bool *ok) {
    cJSON *v = cJSON_Parse(text);
    int64_t out = -12345;
    *ok = keel_json_int(v, lo, hi, &out);
    cJSON_Delete(v);
    return out;
}

int main(void) {
    bool ok;
    static const struct {
        const char *text;
        int64_t lo, hi;
        bool ok;
        int64_t want;
    } cases[] = {
        {"0", 0, 10, true, 0},
        {"10", 0, 10, true, 10},
        {"11", 0, 10, false, 0},
        {"-1", 0, 10, false, 0},
        {"-1", -1, 0, true, -1},
        {"2.5", 0, 10, false, 0},
        {"1e3", 0, 1000, true, 1000},
        {"\"5\"", 0, 10, false, 0},
        {"true", 0, 10, false, 0},
        {"null", 0, 10, false, 0},
        {"9007199254740992", 0, INT64_MAX, true, 9007199254740992},  /* 2^53 */
        {"9007199254740994", 0, INT64_MAX, false, 0},                /* past 2^53 */
        {"9223372036854775807", 0, INT64_MAX, false, 0},             /* INT64_MAX rounds to 2^63 */
        {"9223372036854775808", 0, INT64_MAX, false, 0},             /* 2^63 */
        {"1e19", 0, INT64_MAX, false, 0},
        {"1e300", 0, INT64_MAX, false, 0},
        {"-1e300", INT64_MIN, INT64_MAX, false, 0},
        {"1e400", 0, INT64_MAX, false, 0}, /* inf */
        {"-9007199254740992", INT64_MIN, 0, true, -9007199254740992},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t got = parse(cases[i].text, cases[i].lo, cases[i].hi, &ok);
        EXPECT(ok == cases[i].ok && (!ok ? got == -12345 : got == cases[i].want), "%s in [%lld, %lld]: %s %lld",
               cases[i].text, (long long)cases[i].lo, (long long)cases[i].hi, ok ? "converted" : "refused",
               (long long)got);
    }
    EXPECT(!keel_json_int(NULL, 0, 10, &(int64_t){0}), "no value: refused");
    return test_summary("test_json_int_range");
}
