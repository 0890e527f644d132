/* fsdp/shards.c: padded equal shards of each unit for any group size. */
#include "keel/fsdp.h"

void keel_fsdp_plan_init(keel_fsdp_plan *plan, const keel_model_layout *lay, int shard_ranks) {
    KEEL_CHECK(shard_ranks >= 1, "shard_ranks %d", shard_ranks);
    plan->n_units = lay->n_units;
    plan->shard_ranks = shard_ranks;
    plan->units = keel_xcalloc(sizeof(keel_fsdp_unit) * (size_t)lay->n_units, "fsdp plan");
    plan->shard_total = 0;
    plan->max_padded = 0;
    plan->tied = lay->cfg.tie_embeddings;
    int64_t quantum = (int64_t)shard_ranks * KEEL_FSDP_ALIGN;
    for (int u = 0; u < lay->n_units; u++) {
        keel_fsdp_unit *x = &plan->units[u];
        x->offset = lay->unit_offset[u];
        x->logical = lay->unit_size[u];
        x->padded = (x->logical + quantum - 1) / quantum * quantum;
        x->shard = x->padded / shard_ranks;
        x->shard_offset = plan->shard_total;
        plan->shard_total += x->shard;
        if (x->padded > plan->max_padded) plan->max_padded = x->padded;
    }
}

void keel_fsdp_plan_free(keel_fsdp_plan *plan) {
    keel_free(plan->units);
    plan->units = NULL;
}

void keel_fsdp_shard_range(const keel_fsdp_plan *plan, int unit, int rank, int64_t *begin,
                           int64_t *len) {
    KEEL_CHECK(unit >= 0 && unit < plan->n_units && rank >= 0 && rank < plan->shard_ranks,
               "unit %d rank %d", unit, rank);
    const keel_fsdp_unit *x = &plan->units[unit];
    int64_t lo = (int64_t)rank * x->shard, hi = lo + x->shard;
    if (hi > x->logical) hi = x->logical;
    *begin = x->offset + lo;
    *len = hi > lo ? hi - lo : 0;
}

int keel_fsdp_param_ranges(const keel_fsdp_plan *plan, int rank, keel_param_range **out) {
    keel_param_range *r = keel_xcalloc(sizeof *r * (size_t)plan->n_units, "param ranges");
    int n = 0;
    for (int u = 0; u < plan->n_units; u++) {
        int64_t begin, len;
        keel_fsdp_shard_range(plan, u, rank, &begin, &len);
        if (len > 0) r[n++] = (keel_param_range){begin, len, plan->units[u].shard_offset};
    }
    *out = r;
    return n;
}

int64_t keel_fsdp_persistent_bytes(const keel_fsdp_plan *plan) {
    return 16 * plan->shard_total;
}
