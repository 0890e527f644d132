/* tests/fuzz/fuzz_token_shard.c: token-shard files (keel_shard_from_buffer,
 * what keel_shard_open checks a mapped file with); a shard that verifies has
 * every token read back, each below its vocabulary, and its flags (the loss
 * mask's and the document starts' bits, as defaults where not stored). The first byte chooses:
 * odd, the rest is the file with its payload checksum set right first (so
 * mutations reach the size and id checks behind it); even, the rest as it is. */
#include <xxhash.h>

#include "keel/data.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fuzz_quiet();
    size_t n = size - 1;
    uint8_t *file = malloc(n ? n : 1);
    memcpy(file, data + 1, n);
    if (data[0] % 2 == 1 && n >= KEEL_SHARD_HEADER_BYTES) {
        uint64_t h = XXH3_64bits(file + KEEL_SHARD_HEADER_BYTES, n - KEEL_SHARD_HEADER_BYTES);
        for (int i = 0; i < 8; i++) file[32 + i] = (uint8_t)(h >> (8 * i));
    }
    keel_shard *s;
    keel_status st = keel_shard_from_buffer(file, n, "fuzz.bin", &s);
    fuzz_expect_error_line(st, "keel_shard_from_buffer");
    if (st == KEEL_OK) {
        uint64_t tokens = keel_shard_n_tokens(s);
        uint32_t vocab = keel_shard_vocab_size(s);
        if (tokens > n) abort();
        int32_t *out = malloc(sizeof(int32_t) * (tokens ? tokens : 1));
        keel_shard_read(s, 0, tokens, out);
        for (uint64_t i = 0; i < tokens; i++)
            if (out[i] < 0 || (uint32_t)out[i] >= vocab) abort();
        uint8_t *flags = malloc(tokens ? tokens : 1);
        keel_shard_read_flags(s, 0, tokens, flags);
        uint32_t stored = keel_shard_stored(s);
        for (uint64_t i = 0; i < tokens; i++)
            if (flags[i] > 3 || (!(stored & KEEL_SHARD_FLAG_LOSS_MASK) && !(flags[i] & KEEL_TOKEN_TRAIN)) ||
                (!(stored & KEEL_SHARD_FLAG_DOC_STARTS) && (flags[i] & KEEL_TOKEN_DOC_START)))
                abort();
        free(flags);
        free(out);
        keel_shard_close(s);
    }
    free(file);
    return 0;
}
