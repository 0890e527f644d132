/* tests/fuzz/fuzz_etcd.c: an answer of etcd's v3 JSON API
 * (keel_etcd_parse_reply: what keel agent and the Gloo store read from the
 * network) and base64 both ways. An answer keel accepts holds what the API
 * promises: every key a NUL-free string, every value NUL-ended after its
 * bytes; one it refuses says why. Base64 of any bytes decodes to them. Anything
 * else is a finding (abort). */
#include "keel/etcd.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    keel_etcd_reply r;
    char why[256] = "";
    if (keel_etcd_parse_reply((const char *)data, size, &r, why, sizeof why) == KEEL_OK) {
        if (r.n_kvs < 0 || (r.n_kvs > 0 && !r.kvs)) abort();
        for (int i = 0; i < r.n_kvs; i++) {
            if (!r.kvs[i].key || !r.kvs[i].value || r.kvs[i].value[r.kvs[i].value_len] != 0) abort();
            (void)strlen(r.kvs[i].key);
        }
        keel_etcd_reply_free(&r);
    } else if (!why[0] || strchr(why, '\n')) {
        abort();
    }
    /* the input's bytes through base64 and back */
    char *text = malloc(4 * ((size + 2) / 3) + 1);
    unsigned char *back = malloc(size + 3);
    keel_base64_encode(data, size, text);
    size_t n = 0;
    if (strlen(text) != 4 * ((size + 2) / 3) || !keel_base64_decode(text, strlen(text), back, &n) || n != size ||
        (size && memcmp(back, data, size)))
        abort();
    /* and the input as base64 text: decoding never writes past 3/4 of it */
    unsigned char *out = malloc(size / 4 * 3 + 1);
    n = 0;
    if (keel_base64_decode((const char *)data, size, out, &n) && n > size / 4 * 3) abort();
    free(out);
    free(back);
    free(text);
    return 0;
}
