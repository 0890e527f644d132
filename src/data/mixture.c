/* data/mixture.c: the draw order of a mixture of datasets (see mixture.h). */
#include "data/mixture.h"

#include <math.h>
#include <string.h>

#include "data/rng.h"

struct keel_mixture {
    int n;
    uint64_t seed;
    uint32_t *count;  /* (n) positions of each source per block */
    uint32_t *slot;   /* (BLOCK) source of each offset of block `block` */
    uint32_t *rank;   /* (BLOCK) earlier slots of the same source in the block */
    uint64_t block;   /* the block slot/rank describe; UINT64_MAX: none yet */
};

keel_status keel_mixture_new(const double *weights, int n, uint64_t seed, const char *const *names,
                             keel_mixture **out) {
    *out = NULL;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += weights[i];
    if (!(sum > 0) || !isfinite(sum)) {
        keel_errorf("data.sources: the weights sum to %g; give at least one source a positive weight", sum);
        return KEEL_ERR_INPUT;
    }
    keel_mixture *m = keel_xcalloc(sizeof *m, "data mixture");
    m->n = n;
    m->seed = seed;
    m->block = UINT64_MAX;
    m->count = keel_xcalloc(sizeof *m->count * (size_t)n, "mixture counts");
    double *rest = keel_xmalloc(sizeof *rest * (size_t)n, "mixture remainders");
    uint32_t given = 0;
    for (int i = 0; i < n; i++) {
        double share = weights[i] / sum * KEEL_MIXTURE_BLOCK;
        m->count[i] = (uint32_t)floor(share);
        rest[i] = share - floor(share);
        given += m->count[i];
    }
    /* the slots left to the largest remainders, ties to the earlier source */
    for (; given < KEEL_MIXTURE_BLOCK; given++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (weights[i] > 0 && (best < 0 || rest[i] > rest[best])) best = i;
        m->count[best]++;
        rest[best] = -1;
    }
    keel_free(rest);
    for (int i = 0; i < n; i++) {
        if (weights[i] > 0 && m->count[i] == 0) {
            keel_errorf("data.sources: %s has weight %g, %.2g of the total: less than one sequence in %d, which "
                        "keel's mixture cannot draw; raise it or drop the source",
                        names[i], weights[i], weights[i] / sum, KEEL_MIXTURE_BLOCK);
            keel_mixture_free(m);
            return KEEL_ERR_INPUT;
        }
    }
    m->slot = keel_xmalloc(sizeof *m->slot * KEEL_MIXTURE_BLOCK, "mixture slots");
    m->rank = keel_xmalloc(sizeof *m->rank * KEEL_MIXTURE_BLOCK, "mixture ranks");
    *out = m;
    return KEEL_OK;
}

void keel_mixture_free(keel_mixture *m) {
    if (!m) return;
    keel_free(m->count);
    keel_free(m->slot);
    keel_free(m->rank);
    keel_free(m);
}

uint32_t keel_mixture_block_count(const keel_mixture *m, int i) { return m->count[i]; }

/* Lay out block b: count[i] slots of each source i, shuffled, and each
 * slot's rank among its source's. */
static void lay_out(keel_mixture *m, uint64_t b) {
    uint32_t o = 0;
    for (int i = 0; i < m->n; i++)
        for (uint32_t k = 0; k < m->count[i]; k++) m->slot[o++] = (uint32_t)i;
    xoshiro256 rng;
    xoshiro_seed(&rng, hash3(m->seed, 0x6D6978ull /* "mix" */, b));
    for (uint32_t i = KEEL_MIXTURE_BLOCK - 1; i > 0; i--) {
        uint32_t j = (uint32_t)xoshiro_below(&rng, (uint64_t)i + 1);
        uint32_t t = m->slot[i];
        m->slot[i] = m->slot[j];
        m->slot[j] = t;
    }
    uint32_t *seen = keel_xcalloc(sizeof *seen * (size_t)m->n, "mixture ranks");
    for (uint32_t i = 0; i < KEEL_MIXTURE_BLOCK; i++) m->rank[i] = seen[m->slot[i]]++;
    keel_free(seen);
    m->block = b;
}

void keel_mixture_locate(keel_mixture *m, uint64_t g, int *source, uint64_t *sample) {
    uint64_t b = g / KEEL_MIXTURE_BLOCK;
    uint32_t o = (uint32_t)(g % KEEL_MIXTURE_BLOCK);
    if (m->block != b) lay_out(m, b);
    *source = (int)m->slot[o];
    *sample = b * m->count[*source] + m->rank[o];
}
