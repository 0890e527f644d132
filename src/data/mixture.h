/* data/mixture.h: the order in which a mixture of datasets (data.sources)
 * is drawn — which source, and which of its samples, each global position
 * takes. Pure arithmetic on (weights, seed, position); dataset.c opens the
 * sources and reads the samples.
 *
 * Positions come in blocks of KEEL_MIXTURE_BLOCK. Every block holds the same
 * number of positions of each source, n_i: the block's size apportioned to
 * the weights by largest remainder (ties to the earlier source), so over any
 * whole block the shares are the weights' to within 1/KEEL_MIXTURE_BLOCK.
 * Within block b the slots are shuffled by xoshiro256** seeded from
 * (seed, b). Position g = b*BLOCK + o is source s = slot(b, o) and that
 * source's sample number b*n_s + (slots of s before o in block b), read in the
 * source's own shuffled order (its epochs are its own: a small source is
 * repeated, a large one not exhausted). Nothing depends on the world size,
 * and any position is found from g alone, so a resume continues exactly. */
#ifndef KEEL_DATA_MIXTURE_H
#define KEEL_DATA_MIXTURE_H

#include <stdint.h>

#include "keel/core.h"

#define KEEL_MIXTURE_BLOCK 8192

typedef struct keel_mixture keel_mixture;

/* weights[n] >= 0 with a positive sum; a positive weight whose share rounds
 * to no slot of a block is refused (KEEL_ERR_INPUT, one line naming
 * names[i]), as is a sum of 0. */
keel_status keel_mixture_new(const double *weights, int n, uint64_t seed, const char *const *names,
                             keel_mixture **out);
void keel_mixture_free(keel_mixture *m);
/* Source and sample number of global position g (caches g's block: not
 * thread-safe for one m). */
void keel_mixture_locate(keel_mixture *m, uint64_t g, int *source, uint64_t *sample);
/* Positions per block of source i. */
uint32_t keel_mixture_block_count(const keel_mixture *m, int i);

#endif
