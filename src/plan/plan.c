/* plan/plan.c: one plan's memory and step time, and the search for the
 * fastest plan that fits.
 *
 * Memory is fsdp's (keel_fsdp_memory_plan_run): what the code allocates.
 * Time: each unit's forward and backward at the device's FLOP rate x MFU;
 * each collective by an alpha-beta ring model — (n-1) hops of latency, and
 * (n-1)/n of the buffer (twice for an all-reduce) through the slower of a
 * rank's link inside the node and its node's share of the network; then the
 * step is replayed in the order the FSDP runtime (fsdp/runtime.c) issues
 * and waits: one comm engine runs collectives in issue order; forward waits
 * for unit u's gather and starts u+1's (prefetch); backward waits for u's
 * gather, for the reduce-scatter two units back (two gradient buffers), starts
 * u-1's gather, computes, starts u's reduce-scatter; the step waits for the
 * last reduce-scatters, then all-reduces the gradient shard across replicas
 * (NO_SHARD, HYBRID_SHARD), then the loss and the gradient norm. What the
 * compute thread waits is exposed; the rest is hidden behind compute, where
 * it still costs overlap_cost of its time (the cpu's comm thread runs on the
 * cores compute uses; a GPU's NCCL kernels hold some of its SMs). */
#include <math.h>
#include <string.h>

#include "keel/plan.h"

/* Bytes per shard parameter per step of the passes beside AdamW: zeroing the
 * gradient shard and its norm (8); per micro-batch adding each unit's
 * reduce-scatter result into the shard (12), and in bf16 rounding the master
 * slice for both gathers (12). */
#define SHARD_PASS_BYTES 8.0
#define DRAIN_BYTES 12.0
#define ROUND_BYTES 12.0

typedef struct {
    int n;               /* ranks in the group */
    int per_node;        /* of them on one node */
    int groups_per_node; /* groups like it sharing a node's network */
} group;

/* Seconds of a ring all-gather / reduce-scatter (or all-reduce) of a buffer
 * of `bytes` (the whole buffer, not a shard) over g; a group of one copies. */
static double ring_s(const keel_device *d, double mem_bw, const group *g, double bytes, bool allreduce) {
    if (g->n == 1) return 2 * bytes / mem_bw;
    double passes = allreduce ? 2 : 1, f = passes * (g->n - 1) / g->n;
    int nodes = g->n / g->per_node;
    double intra = g->per_node > 1 ? f * bytes / d->intra_bw : 0;
    double inter = nodes > 1 ? g->groups_per_node * f * bytes / d->net_bw : 0;
    int inter_hops = nodes - 1, intra_hops = g->n - 1 - inter_hops;
    return passes * (intra_hops * d->intra_latency_s + inter_hops * d->net_latency_s) + fmax(intra, inter);
}

/* Per-unit seconds of one micro-batch. */
typedef struct {
    int n;
    double *fwd, *bwd, *gather, *reduce;
    double *bwd_gather; /* backward's gathers: with matrix units and checkpointing also the recomputation's */
} unit_costs;

/* The comm engine and the compute thread. */
typedef struct {
    double t, comm_free, comm_busy;
    double waits[KEEL_WAITS];
} timeline;

static double issue(timeline *tl, double seconds) {
    double start = fmax(tl->t, tl->comm_free);
    tl->comm_free = start + seconds;
    tl->comm_busy += seconds;
    return tl->comm_free;
}

static void await(timeline *tl, double done, keel_plan_wait why) {
    if (done <= tl->t) return;
    tl->waits[why] += done - tl->t;
    tl->t = done;
}

/* Micro-batches after the first few repeat the last one's pattern: the
 * rest of a long accumulation is that pattern `more` times over. */
#define REPLAYED_MICRO_BATCHES 4
static void steady_state(timeline *tl, const timeline *before, double rs[2], int64_t more) {
    if (more <= 0) return;
    double k = (double)more, dt = tl->t - before->t;
    for (int w = 0; w < KEEL_WAITS; w++) tl->waits[w] += k * (tl->waits[w] - before->waits[w]);
    tl->comm_busy += k * (tl->comm_busy - before->comm_busy);
    tl->t += k * dt;
    tl->comm_free += k * dt;
    rs[0] += k * dt;
    rs[1] += k * dt;
}

/* One micro-batch's forward and backward, as fsdp/runtime.c's hooks run it.
 * done[u] is when unit u's gather ends (-1: not started); rs[2] the two
 * gradient buffers' reduce-scatters. */
static void micro_batch(timeline *tl, const unit_costs *c, bool prefetch, bool keep_gathered, bool tied,
                        double *done, double rs[2], int *next_buffer) {
    int n = c->n;
    for (int u = 0; u < n; u++) done[u] = -1;
    for (int u = 0; u < n; u++) {
        if (done[u] < 0) done[u] = issue(tl, c->gather[u]);
        await(tl, done[u], u == 0 ? KEEL_WAIT_FIRST_GATHER : KEEL_WAIT_STEADY);
        if (prefetch && u + 1 < n) done[u + 1] = issue(tl, c->gather[u + 1]);
        tl->t += c->fwd[u];
    }
    /* the head stays gathered into backward; SHARD_GRAD_OP keeps every unit,
     * tied embeddings keep unit 0 */
    for (int u = 0; u < n; u++) done[u] = keep_gathered || u == n - 1 || (tied && u == 0) ? 0 : -1;
    for (int u = n - 1; u >= 0; u--) {
        if (done[u] < 0) done[u] = issue(tl, c->bwd_gather[u]);
        await(tl, done[u], KEEL_WAIT_STEADY);
        int b = *next_buffer;
        *next_buffer ^= 1;
        await(tl, rs[b], KEEL_WAIT_STEADY);
        if (prefetch && u > 0 && done[u - 1] < 0) done[u - 1] = issue(tl, c->bwd_gather[u - 1]);
        tl->t += c->bwd[u];
        rs[b] = issue(tl, c->reduce[u]);
    }
}

/* The groups of a strategy: the shard group and the replicas of a shard. */
static void groups(const keel_cluster *cl, int shard_ranks, group *shard, group *replica) {
    int G = cl->per_node, W = cl->nodes * G;
    shard->n = shard_ranks;
    shard->per_node = shard_ranks < G ? shard_ranks : G;
    shard->groups_per_node = G / shard->per_node;
    replica->n = W / shard_ranks;
    replica->per_node = shard_ranks >= G ? 1 : G / shard_ranks;
    replica->groups_per_node = G / replica->per_node;
}

static void memory(const keel_config *cfg, const keel_cluster *cl, keel_plan_entry *e) {
    int W = cl->nodes * cl->per_node;
    keel_config c = *cfg; /* a GPU's ranks run the CUDA backend, whatever the config's device */
    if (cl->device.kind != KEEL_DEVICE_CPU) c.device = KEEL_BACKEND_CUDA;
    keel_fsdp_memory_plan_run(&c, W, true, cl->nodes, &e->memory);
    if (cl->device.runtime_bytes >= 0) e->memory.runtime = (int64_t)cl->device.runtime_bytes;
    if (cl->device.kind != KEEL_DEVICE_CPU) e->memory.snapshot = 0; /* in the host's memory, not the GPU's */
    e->peak_bytes = keel_fsdp_memory_total(&e->memory);
    keel_fsdp_memory m;
    c.fsdp.activation_checkpointing = KEEL_CHECKPOINT_ALL;
    keel_fsdp_memory_plan_run(&c, W, true, cl->nodes, &m);
    e->activations_with = m.activations;
    c.fsdp.activation_checkpointing = 0;
    keel_fsdp_memory_plan_run(&c, W, true, cl->nodes, &m);
    e->activations_without = m.activations;
    const keel_device *d = &cl->device;
    e->budget_bytes = (int64_t)(d->kind == KEEL_DEVICE_CPU ? d->memory_bytes / cl->per_node : d->memory_bytes);
    e->fits = e->peak_bytes <= e->budget_bytes;
}

/* The adapters' layout under train.lora (false: none, or a rank that does not
 * fit, which the run refuses before it starts: planned without). */
static bool lora_layout(const keel_config *cfg, const keel_model_layout *lay, keel_model_layout *lora) {
    char why[256];
    return cfg->train.lora.on && keel_lora_layout_init(lora, lay, &cfg->train.lora, why, sizeof why) == KEEL_OK;
}

static void step_time(const keel_config *cfg, const keel_cluster *cl, keel_plan_entry *e) {
    const keel_device *d = &cl->device;
    bool cpu = d->kind == KEEL_DEVICE_CPU, bf16 = cfg->fsdp.mixed_precision == KEEL_DTYPE_BF16;
    bool sgo = e->strategy == KEEL_FSDP_SHARD_GRAD_OP;
    int W = cl->nodes * cl->per_node, B = e->micro_batch, accum = e->grad_accum;
    double rate = (bf16 ? d->peak_flops_bf16 : d->peak_flops_fp32) / (cpu ? cl->per_node : 1) * d->mfu;
    double mem_bw = d->mem_bw / (cpu ? cl->per_node : 1);
    double adamw_rate = d->adamw_params_per_s / (cpu ? cl->per_node : 1);
    keel_model_layout lay, lora;
    keel_model_layout_init_units(&lay, &cfg->model, cfg->fsdp.unit);
    bool lora_on = lora_layout(cfg, &lay, &lora);
    /* the trained set (the model, or the adapters) and with LoRA the frozen base */
    keel_fsdp_plan plan, base;
    keel_fsdp_plan_init(&plan, lora_on ? &lora : &lay, e->shard_group);
    if (lora_on) keel_fsdp_plan_init(&base, &lay, e->shard_group);
    group shard, replica, world = {W, cl->per_node < W ? cl->per_node : W, 1};
    groups(cl, e->shard_group, &shard, &replica);
    int n = lay.n_units;
    double *mem = keel_xcalloc(sizeof(double) * 6 * (size_t)n, "plan unit costs");
    unit_costs c = {n, mem, mem + n, mem + 2 * n, mem + 3 * n, mem + 4 * n};
    double *done = mem + 5 * n, tokens = (double)B * lay.T;
    keel_model_unit_flops(&lay, lora_on ? &lora : NULL, c.fwd, c.bwd);
    double elem = bf16 ? 2 : 4, grad_elem = cfg->fsdp.reduce_dtype == KEEL_DTYPE_BF16 ? 2 : 4;
    e->compute_s = e->recompute_s = 0;
    int recomputed = keel_model_recomputed_blocks(&lay, e->checkpoint_blocks);
    for (int u = 0; u < n; u++) {
        c.fwd[u] *= tokens / rate;
        c.bwd[u] *= tokens / rate;
        e->compute_s += accum * (c.fwd[u] + c.bwd[u]);
        bool block = u >= 1 && u < n - 1, recompute = block && (u - 1) / lay.units_per_block < recomputed;
        if (recompute) { /* the first checkpointed blocks recompute their forward */
            c.bwd[u] += c.fwd[u];
            e->recompute_s += accum * c.fwd[u];
        }
        /* a block of several units gathers each again for its recomputation
         * (all but its last, kept for backward: counted for every one) */
        double regather = recompute && lay.units_per_block > 1 && !sgo ? 2 : 1;
        if (lora_on) { /* the adapters in fp32 after their base; under shard_grad_op the base stays gathered */
            double a = plan.units[u].padded ? ring_s(d, mem_bw, &shard, 4.0 * (double)plan.units[u].padded, false) : 0;
            c.gather[u] = a + (sgo ? 0 : ring_s(d, mem_bw, &shard, elem * (double)base.units[u].padded, false));
        } else {
            c.gather[u] = ring_s(d, mem_bw, &shard, elem * (double)plan.units[u].padded, false);
        }
        c.bwd_gather[u] = regather * c.gather[u];
        /* a shard group of one (no_shard) reduce-scatters in place: nothing moves; a unit without adapters has nothing */
        c.reduce[u] = shard.n == 1 || !plan.units[u].padded
                          ? 0
                          : ring_s(d, mem_bw, &shard, grad_elem * (double)plan.units[u].padded, false);
    }
    timeline tl = {0}, before = {0};
    double rs[2] = {0, 0};
    int next_buffer = 0, replayed = accum < REPLAYED_MICRO_BATCHES ? accum : REPLAYED_MICRO_BATCHES;
    for (int m = 0; m < replayed; m++) {
        before = tl;
        micro_batch(&tl, &c, cfg->fsdp.prefetch, sgo, lay.cfg.tie_embeddings, done, rs, &next_buffer);
    }
    steady_state(&tl, &before, rs, accum - replayed);
    await(&tl, fmax(rs[0], rs[1]), KEEL_WAIT_LAST_REDUCE);
    if (replica.n > 1)
        await(&tl, issue(&tl, ring_s(d, mem_bw, &replica, grad_elem * (double)plan.shard_total, true)),
              KEEL_WAIT_REPLICAS);
    if (W > 1) await(&tl, issue(&tl, 2 * ring_s(d, mem_bw, &world, 8, true)), KEEL_WAIT_SCALARS);
    /* the trained set's passes; bf16 rounds the gathered set's master slices (the base's under LoRA, fp32 adapters) */
    double rounded = !bf16 ? 0 : !lora_on ? (double)plan.shard_total : sgo ? 0 : (double)base.shard_total;
    e->optimizer_s = (double)plan.shard_total * (1 / adamw_rate + (SHARD_PASS_BYTES + accum * DRAIN_BYTES) / mem_bw) +
                     rounded * accum * ROUND_BYTES / mem_bw;
    e->comm_s = tl.comm_busy;
    e->exposed_s = 0;
    for (int w = 0; w < KEEL_WAITS; w++) e->exposed_s += e->waits_s[w] = tl.waits[w];
    e->hidden_s = fmax(0, e->comm_s - e->exposed_s);
    e->overlap_s = d->overlap_cost * e->hidden_s;
    e->step_s = tl.t + e->optimizer_s + e->overlap_s;
    double rank_tokens = tokens * accum;
    e->tokens_per_s = W * rank_tokens / e->step_s;
    e->mfu = keel_model_train_flops_per_token(&lay, lora_on ? &lora : NULL) * rank_tokens / e->step_s / (rate / d->mfu);
    e->scaling_efficiency = (e->compute_s + e->recompute_s + e->optimizer_s) / e->step_s;
    keel_free(mem);
    keel_fsdp_plan_free(&plan);
    if (lora_on) {
        keel_fsdp_plan_free(&base);
        keel_model_layout_free(&lora);
    }
    keel_model_layout_free(&lay);
}

void keel_plan_entry_make(const keel_config *cfg, const keel_cluster *cl, keel_plan_entry *e) {
    int W = cl->nodes * cl->per_node;
    keel_config c = *cfg;
    if (c.fsdp.strategy == KEEL_FSDP_HYBRID_SHARD) c.fsdp.shard_group_size = cl->per_node; /* a node */
    keel_parallel_dims dims;
    char why[256];
    KEEL_CHECK(keel_parallel_dims_resolve(c.fsdp.strategy, c.fsdp.shard_group_size, W, &dims, why, sizeof why) ==
                   KEEL_OK, "%s", why);
    *e = (keel_plan_entry){.strategy = c.fsdp.strategy,
                           .shard_group = dims.shard_ranks,
                           .unit = c.fsdp.unit,
                           .checkpoint_blocks = keel_config_checkpoint_blocks(&c),
                           .micro_batch = c.train.micro_batch_size,
                           .grad_accum = c.train.grad_accum_steps};
    e->replicas = dims.replicas;
    memory(&c, cl, e);
    step_time(&c, cl, e);
}

static const keel_fsdp_strategy STRATEGIES[KEEL_PLAN_STRATEGIES] = {
    KEEL_FSDP_FULL_SHARD, KEEL_FSDP_SHARD_GRAD_OP, KEEL_FSDP_NO_SHARD, KEEL_FSDP_HYBRID_SHARD};

/* a better than b: more than 1% faster, or as fast within 1% and smaller */
static bool better(const keel_plan_entry *a, const keel_plan_entry *b) {
    if (a->tokens_per_s > 1.01 * b->tokens_per_s) return true;
    if (b->tokens_per_s > 1.01 * a->tokens_per_s) return false;
    return a->peak_bytes < b->peak_bytes;
}

#define MAX_MICRO_BATCH 65536

/* The fastest plan that fits over strategies, checkpointing and
 * micro-batches — the config's sequences per rank and optimizer step
 * (micro_batch_size x grad_accum_steps) split into micro-batches of every
 * divisor, so the global batch stays the config's — each up to the first
 * micro-batch that does not fit even with every block checkpointed, and at
 * each the fewest checkpointed blocks that fit (recomputation only costs
 * time); block units, and matrix units only when no plan with blocks fits
 * (they cost 5x the collectives); when none fits, the smallest plan (which
 * says by how much). */
static void search_units(const keel_config *cfg, const keel_cluster *cl, keel_unit_kind unit, keel_plan *p,
                         bool *any);
static void search(const keel_config *cfg, const keel_cluster *cl, keel_plan *p) {
    bool any = false;
    search_units(cfg, cl, KEEL_UNIT_BLOCK, p, &any);
    if (!p->best.fits) search_units(cfg, cl, KEEL_UNIT_MATRIX, p, &any);
}

static void consider(keel_plan *p, const keel_plan_entry *e, bool *any) {
    bool take = !*any || (e->fits && (!p->best.fits || better(e, &p->best))) ||
                (!e->fits && !p->best.fits && e->peak_bytes < p->best.peak_bytes);
    if (take) p->best = *e, *any = true;
}

/* c with K checkpointed blocks as an entry. */
static void entry_at(keel_config *c, const keel_cluster *cl, int K, keel_plan_entry *e) {
    c->fsdp.activation_checkpointing = K;
    keel_plan_entry_make(c, cl, e);
}

static void search_units(const keel_config *cfg, const keel_cluster *cl, keel_unit_kind unit, keel_plan *p,
                         bool *any) {
    int64_t per_rank = (int64_t)cfg->train.micro_batch_size * cfg->train.grad_accum_steps;
    int L = cfg->model.n_layers;
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++)
        for (int B = 1; B <= per_rank && B <= MAX_MICRO_BATCH; B++) {
            if (per_rank % B || per_rank / B > INT32_MAX) continue;
            keel_config c = *cfg;
            c.fsdp.strategy = STRATEGIES[s];
            c.fsdp.unit = unit;
            c.train.micro_batch_size = B;
            c.train.grad_accum_steps = (int)(per_rank / B);
            keel_plan_entry e;
            entry_at(&c, cl, 0, &e);
            if (!e.fits) {
                keel_plan_entry all;
                entry_at(&c, cl, L, &all);
                if (!all.fits) { /* memory grows with the micro-batch */
                    consider(p, &all, any);
                    break;
                }
                /* memory falls as K grows: the fewest blocks that fit, in (lo, hi] */
                int lo = 0, hi = L;
                e = all;
                while (hi - lo > 1) {
                    int mid = lo + (hi - lo) / 2;
                    keel_plan_entry m;
                    entry_at(&c, cl, mid, &m);
                    if (m.fits) hi = mid, e = m;
                    else lo = mid;
                }
            }
            consider(p, &e, any);
        }
}

void keel_plan_make(const keel_config *cfg, const keel_cluster *cl, keel_plan *p) {
    *p = (keel_plan){.cfg = cfg, .cluster = *cl, .ranks = cl->nodes * cl->per_node,
                     .bf16 = cfg->fsdp.mixed_precision == KEEL_DTYPE_BF16};
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    p->n_params = lay.n_params;
    keel_model_layout lora;
    bool lora_on = lora_layout(cfg, &lay, &lora);
    p->flops_per_token = keel_model_train_flops_per_token(&lay, lora_on ? &lora : NULL);
    if (lora_on) keel_model_layout_free(&lora);
    keel_model_layout_free(&lay);
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) {
        keel_config c = *cfg;
        c.fsdp.strategy = STRATEGIES[s];
        keel_plan_entry_make(&c, cl, &p->strategies[s]);
    }
    search(cfg, cl, p);
}
