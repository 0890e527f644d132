/* fsdp/memory.c: what one rank holds for a config on W ranks, by category,
 * before anything is allocated — persistent state per strategy, the
 * runtime's unit buffers, activations, the checkpoint buffer, the in-memory
 * snapshot, workspaces and the process's fixed cost (DESIGN §3). The one source of these numbers:
 * `keel train --dry-run`, the memory check before a run, `keel health` and
 * `keel plan` all read them from here. */
#include "keel/fsdp.h"

/* The fixed cost of a process beyond everything below: the binary and its
 * libraries (OpenBLAS with its buffers, oneDNN, cJSON, glibc), the thread
 * pool's stacks, kernel scratch (bf16 GEMM panels and attention tiles, a few
 * MB per thread), the synthetic data table — and for a rank, OpenMPI (its
 * shared-memory segments, the comm thread, the ring all-reduce's two 1 MiB
 * segments). Measured as peak RSS minus the categories of real runs of a
 * Release build (bench/plan.sh: tiny and small, 1-4 ranks; see docs/planning.md,
 * "Validated on this machine"). Sanitizer builds cost more (ASan's shadow and
 * allocator): tests/plan measures that in their own build. Token shards of
 * data.path are mapped files: the pages a run has read count in its RSS but
 * are page cache the kernel can drop, and are not counted here. */
#define RUNTIME_PROCESS_BYTES ((int64_t)14 << 20)
#define RUNTIME_RANK_BYTES ((int64_t)23 << 20)

/* The async checkpoint's host buffer (train/saving.c): parameters,
 * AdamW m and v of the rank's shard buffer, on a rank that writes a file —
 * one process always packs into it; under FSDP only with checkpoint.async.
 * Rank 0 always writes, so this is the largest rank's. */
static int64_t checkpoint_buffer_bytes(const keel_config *cfg, bool distributed, int64_t shard_floats) {
    const keel_checkpoint_config *c = &cfg->checkpoint;
    bool enabled = c->every_steps > 0 || c->every_seconds > 0;
    if (!enabled || (distributed && !c->async)) return 0;
    return 3 * 4 * shard_floats;
}

/* The CUDA backend's attention scratch, kept between calls and sized by the
 * largest (src/cuda/attention.cu, attention_tc.cu): the backward's
 * rowsum(dO * O), (B, NH, T) floats, and under bf16 at head sizes 64 and 128
 * the tensor-core kernels' bf16 copies of q, k, v and dO. */
static int64_t cuda_attention_scratch(const keel_model_layout *lay, int B, bool bf16) {
    int64_t bt = (int64_t)B * lay->T, bytes = 4 * bt * lay->NH;
    if (bf16 && (lay->HS == 64 || lay->HS == 128)) bytes += 2 * bt * 2 * (int64_t)(lay->NH + lay->NKV) * lay->HS;
    return bytes;
}

/* The largest unit's floats: with LoRA the final weights merge the adapters
 * into a host copy of one unit at a time (train/gather.c). */
static int64_t largest_unit(const keel_model_layout *lay) {
    int64_t most = 0;
    for (int u = 0; u < lay->n_units; u++) most = lay->unit_size[u] > most ? lay->unit_size[u] : most;
    return most;
}

/* One process: the whole model, no FSDP; with LoRA (lora set) a frozen base
 * without gradients, and the adapters with theirs. */
static void one_process(const keel_model_layout *lay, const keel_model_layout *lora, bool bf16, keel_fsdp_memory *m) {
    m->params = m->grads = 4 * lay->n_params;
    m->gathered = bf16 ? 2 * lay->n_params : 0; /* the bf16 copy */
    if (lora) {
        m->params += 4 * lora->n_params;
        m->grads = 4 * lora->n_params;
        m->gathered += 4 * largest_unit(lay);
    }
    m->runtime = RUNTIME_PROCESS_BYTES;
}

/* A rank under FSDP: shards of the shard group's plan, the runtime's unit
 * buffers (the final weights are gathered through one of them, train.c) and
 * NO_SHARD/HYBRID's bf16 copy of the gradient shard for its all-reduce across
 * replicas (runtime.c, keel_fsdp_finish_grads). Returns the shard's floats. */
static int64_t one_rank(const keel_config *cfg, const keel_model_layout *lay, const keel_model_layout *lora,
                        int world_size, int nodes, bool bf16, keel_fsdp_memory *m) {
    keel_fsdp_strategy strategy = cfg->fsdp.strategy;
    keel_parallel_dims dims;
    char why[256];
    /* keel health passes a node's share of the ranks, which a hybrid group may
     * exceed: a group that does not divide world_size is planned as given */
    if (keel_parallel_dims_resolve(strategy, cfg->fsdp.shard_group_size, world_size, &dims, why, sizeof why) != KEEL_OK)
        dims.shard_ranks = cfg->fsdp.shard_group_size;
    int shard_ranks = dims.shard_ranks;
    bool bf16_reduce = cfg->fsdp.reduce_dtype == KEEL_DTYPE_BF16;
    /* node windows (runtime.c): a CPU run whose shard groups each sit on one
     * machine — all ranks on one, or hybrid groups that machines' ranks divide */
    int per_node = nodes > 0 && world_size % nodes == 0 ? world_size / nodes : 0;
    bool windows = cfg->fsdp.node_windows && cfg->device != KEEL_BACKEND_CUDA &&
                   (nodes <= 1 || (per_node > 0 && per_node % shard_ranks == 0));
    keel_fsdp_plan plan;
    keel_fsdp_plan_init(&plan, lay, shard_ranks);
    m->runtime = RUNTIME_RANK_BYTES;
    if (lora) { /* the frozen base: its shard and compute copies; the adapters: a trained set in fp32 */
        keel_fsdp_plan ap;
        keel_fsdp_plan_init(&ap, lora, shard_ranks);
        ap.tied = false;
        m->params = 4 * (plan.shard_total + ap.shard_total);
        m->grads = 4 * ap.shard_total;
        m->gathered = keel_fsdp_frozen_transient_bytes(&plan, strategy, bf16) +
                      keel_fsdp_transient_bytes(&ap, strategy, false, bf16_reduce, windows) + 4 * largest_unit(lay);
        if (world_size > shard_ranks && bf16_reduce) m->workspaces += 2 * ap.shard_total;
        int64_t shard = ap.shard_total;
        keel_fsdp_plan_free(&ap);
        keel_fsdp_plan_free(&plan);
        return shard;
    }
    m->params = m->grads = 4 * plan.shard_total;
    m->gathered = keel_fsdp_transient_bytes(&plan, strategy, bf16, bf16_reduce, windows);
    if (world_size > shard_ranks && bf16_reduce) m->workspaces += 2 * plan.shard_total;
    int64_t shard = plan.shard_total;
    keel_fsdp_plan_free(&plan);
    return shard;
}

void keel_fsdp_memory_plan_run(const keel_config *cfg, int world_size, bool distributed, int nodes,
                               keel_fsdp_memory *out) {
    keel_model_layout lay;
    keel_model_layout_init_units(&lay, &cfg->model, cfg->fsdp.unit);
    bool bf16 = cfg->fsdp.mixed_precision == KEEL_DTYPE_BF16;
    int B = cfg->train.micro_batch_size;
    /* train.lora: the adapters' layout (a rank that does not fit is refused before any run: planned without) */
    keel_model_layout lora;
    char why[256];
    bool lora_on = cfg->train.lora.on && keel_lora_layout_init(&lora, &lay, &cfg->train.lora, why, sizeof why) == KEEL_OK;
    keel_model_options opts = {.checkpoint_blocks = keel_config_checkpoint_blocks(cfg), .bf16 = bf16,
                               .lora = lora_on ? &cfg->train.lora : NULL};
    keel_fsdp_memory m = {.activations = keel_model_activation_bytes(&lay, B, &opts)};
    m.workspaces = 4 * (int64_t)B * (lay.T + 1); /* the micro-batch's tokens (train.c) */
    if (cfg->device == KEEL_BACKEND_CUDA) m.workspaces += cuda_attention_scratch(&lay, B, bf16);
    int64_t shard = lora_on ? lora.n_params : lay.n_params; /* the trained set's floats on this rank */
    if (distributed) shard = one_rank(cfg, &lay, lora_on ? &lora : NULL, world_size, nodes, bf16, &m);
    else one_process(&lay, lora_on ? &lora : NULL, bf16, &m);
    m.optimizer = 2 * 4 * shard; /* AdamW m and v of the trained set */
    m.checkpoint_buffer = checkpoint_buffer_bytes(cfg, distributed, shard);
    /* a rank's in-memory snapshot (train/snapshots.c): two slots of
     * parameters, m and v in node shared memory, mapped and written by the
     * rank; over several nodes the two of the buddy's replica it keeps too */
    if (distributed && cfg->resilience.snapshot_every_steps > 0) m.snapshot = (nodes > 1 ? 2 : 1) * 2 * 3 * 4 * shard;
    /* Accumulation needs no buffer of its own: under FSDP every micro-batch
     * reduce-scatters into the gradient shard (keel_fsdp_zero_grads), and one
     * process adds into its full gradient, which it holds anyway. */
    m.accumulation = 0;
    if (lora_on) keel_model_layout_free(&lora);
    keel_model_layout_free(&lay);
    *out = m;
}

void keel_fsdp_memory_plan(const keel_config *cfg, int world_size, keel_fsdp_memory *out) {
    keel_fsdp_memory_plan_run(cfg, world_size, world_size > 1, 1, out);
}

void keel_fsdp_memory_items(const keel_fsdp_memory *m,
                            keel_fsdp_memory_item out[KEEL_FSDP_MEMORY_CATEGORIES]) {
    const keel_fsdp_memory_item items[KEEL_FSDP_MEMORY_CATEGORIES] = {
        {"params", "parameters", m->params},
        {"grads", "gradients", m->grads},
        {"optimizer", "AdamW m+v", m->optimizer},
        {"gathered", "compute copies", m->gathered},
        {"activations", "activations", m->activations},
        {"checkpoint_buffer", "checkpoint buffer", m->checkpoint_buffer},
        {"snapshot", "in-memory snapshot", m->snapshot},
        {"accumulation", "accumulation", m->accumulation},
        {"workspaces", "workspaces", m->workspaces},
        {"runtime", "runtime (fixed)", m->runtime},
    };
    for (int i = 0; i < KEEL_FSDP_MEMORY_CATEGORIES; i++) out[i] = items[i];
}

int64_t keel_fsdp_memory_total(const keel_fsdp_memory *m) {
    keel_fsdp_memory_item items[KEEL_FSDP_MEMORY_CATEGORIES];
    keel_fsdp_memory_items(m, items);
    int64_t total = 0;
    for (int i = 0; i < KEEL_FSDP_MEMORY_CATEGORIES; i++) total += items[i].bytes;
    return total;
}
