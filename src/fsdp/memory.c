/* fsdp/memory.c: what one rank holds for a config on W ranks, by category,
 * before anything is allocated — persistent state per strategy, the
 * runtime's unit buffers, activations (DESIGN §3). */
#include "keel/fsdp.h"

void keel_fsdp_memory_plan(const keel_config *cfg, int world_size, keel_fsdp_memory *out) {
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    bool bf16 = cfg->fsdp.mixed_precision == KEEL_DTYPE_BF16;
    keel_model_options opts = {.checkpoint_activations = cfg->fsdp.activation_checkpointing, .bf16 = bf16};
    keel_fsdp_memory m = {.activations = keel_model_activation_bytes(&lay, cfg->train.micro_batch_size, &opts)};
    if (world_size == 1) { /* one process: the whole model, no FSDP */
        m.params = m.grads = 4 * lay.n_params;
        m.gathered = bf16 ? 2 * lay.n_params : 0; /* the bf16 copy */
    } else {
        keel_fsdp_strategy strategy = cfg->fsdp.strategy;
        int K = cfg->fsdp.shard_group_size ? cfg->fsdp.shard_group_size : 2;
        int shard_ranks = strategy == KEEL_FSDP_NO_SHARD       ? 1
                          : strategy == KEEL_FSDP_HYBRID_SHARD ? K
                                                               : world_size;
        keel_fsdp_plan plan;
        keel_fsdp_plan_init(&plan, &lay, shard_ranks);
        m.params = m.grads = 4 * plan.shard_total;
        m.gathered = keel_fsdp_transient_bytes(&plan, strategy, bf16, cfg->fsdp.reduce_dtype == KEEL_DTYPE_BF16);
        keel_fsdp_plan_free(&plan);
    }
    m.optimizer = 2 * m.params; /* AdamW m and v */
    keel_model_layout_free(&lay);
    *out = m;
}

int64_t keel_fsdp_memory_total(const keel_fsdp_memory *m) {
    return m->params + m->grads + m->optimizer + m->gathered + m->activations;
}
