/* data/rng.h: the data module's seeded random numbers — splitmix64's mixer
 * for hashing (seed, epoch, ...) tuples and xoshiro256** for shuffles — one
 * definition for the sample order (dataset.c) and the mixture (mixture.c). */
#ifndef KEEL_DATA_RNG_H
#define KEEL_DATA_RNG_H

#include <stdint.h>

#include "keel/core.h"

/* splitmix64 of x: a bijective 64-bit mixer. */
static inline uint64_t mix64(uint64_t x) { return keel_hash64(x + 0x9E3779B97F4A7C15ull); }

static inline uint64_t hash2(uint64_t a, uint64_t b) { return mix64(mix64(a) ^ b); }
static inline uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) { return mix64(hash2(a, b) ^ c); }

typedef struct {
    uint64_t s[4];
} xoshiro256;

static inline void xoshiro_seed(xoshiro256 *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = mix64(x += 0x9E3779B97F4A7C15ull);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t xoshiro_next(xoshiro256 *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, bound) without modulo bias (reject the short last bucket). */
static inline uint64_t xoshiro_below(xoshiro256 *r, uint64_t bound) {
    uint64_t threshold = (0 - bound) % bound; /* = 2^64 mod bound */
    for (;;) {
        uint64_t x = xoshiro_next(r);
        if (x >= threshold) return x % bound;
    }
}

#endif
