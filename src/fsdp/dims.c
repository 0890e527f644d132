/* fsdp/dims.c: the parallel dimensions of a run — shard ranks and replicas
 * from the strategy, the shard group size and the world size — resolved
 * once (keel/fsdp.h). */
#include <stdio.h>

#include "keel/fsdp.h"

keel_status keel_parallel_dims_resolve(keel_fsdp_strategy strategy, int shard_group_size, int world_size,
                                       keel_parallel_dims *out, char *why, size_t why_n) {
    KEEL_CHECK(world_size >= 1, "world_size %d", world_size);
    int shard = world_size;
    switch (strategy) {
    case KEEL_FSDP_FULL_SHARD:
    case KEEL_FSDP_SHARD_GRAD_OP: shard = world_size; break;
    case KEEL_FSDP_NO_SHARD: shard = 1; break;
    case KEEL_FSDP_HYBRID_SHARD:
        shard = world_size == 1 ? 1 : shard_group_size ? shard_group_size : 2;
        if (shard > world_size || world_size % shard != 0) {
            snprintf(why, why_n, "fsdp.shard_group_size %d does not divide --nproc %d (the run's ranks); pick a divisor",
                     shard, world_size);
            return KEEL_ERR_INPUT;
        }
        break;
    }
    *out = (keel_parallel_dims){.world_size = world_size, .shard_ranks = shard, .replicas = world_size / shard};
    return KEEL_OK;
}
