/* keel plan's model on made-up clusters, where the answer is known without
 * the model: memory per rank by category equals a count written here from
 * the shape's numbers and docs/fsdp.md + docs/planning.md (each unit padded
 * to a multiple of shard ranks x 16 floats; 16 bytes per padded parameter of
 * the shard for master weights, gradients and AdamW m and v; two unit slots
 * — every unit under shard_grad_op — and two unit-gradient buffers; the
 * token batch and the GPU's attention scratch; 12 bytes per shard parameter
 * of checkpoint buffer; a GPU's 2 GiB runtime), on 8, 3 and 3 x 2 ranks,
 * every strategy, fp32 and bf16; activations are measured against real runs
 * by plan_memory_matches_runs.sh; free
 * communication costs nothing and scales perfectly; slow communication
 * bounds the step; bandwidth scales transfer time; prefetch hides gathers;
 * replicas all-reduce after backward (exposed) and only with replicas;
 * checkpointing trades activations for recompute, block by block;
 * accumulation repeats the per-micro-batch work; LoRA (rank 8 on q and v)
 * computes its count of FLOPs (4x the frozen base's matrices, no weight
 * gradients), reduce-scatters and steps the adapters alone, and under
 * shard_grad_op gathers them alone (the frozen base stays gathered from step
 * to step), so its step is the shorter; the recommendation is the
 * fastest plan that fits, checkpointing no more blocks than it must, and
 * when nothing fits it is the smallest plan, marked so. */
#include <math.h>

#include "keel/plan.h"
#include "../testlib.h"

static const char *MODEL =
    "{\"model\": {\"dim\": 256, \"n_layers\": 4, \"n_heads\": 4, \"vocab_size\": 4096, \"max_seq_len\": 128},"
    " \"train\": {\"micro_batch_size\": 4}, \"data\": {\"synthetic\": {}}}";

static keel_cluster cluster(int nodes, int per_node) {
    keel_cluster cl = {.nodes = nodes, .per_node = per_node};
    keel_plan_device("h100", &cl.device); /* a preset: nothing measured */
    cl.device.peak_flops_fp32 = 1e12;     /* slow compute, so communication can hide */
    return cl;
}

static void entry(const keel_config *cfg, keel_fsdp_strategy s, const keel_cluster *cl, keel_plan_entry *e) {
    keel_config c = *cfg;
    c.fsdp.strategy = s;
    keel_plan_entry_make(&c, cl, e);
}

/* ---- memory, counted from MODEL's numbers --------------------------------------------- */

/* MODEL's units (fsdp.unit block): the embedding V x C; each of the 4 blocks its two norms,
 * q, k, v, o (C x C each: 4 heads of 64, no grouping) and gate, up, down (F x C each, F = 704:
 * Llama's 2/3 x 4C = 682 rounded up to model.multiple_of's default 32); the final norm and
 * the untied head, C + V x C. */
enum { M_C = 256, M_L = 4, M_NH = 4, M_V = 4096, M_T = 128, M_F = 704, M_B = 4 };
#define M_UNITS (M_L + 2)

static int64_t unit_floats(int u) {
    if (u == 0) return (int64_t)M_V * M_C;
    if (u == M_UNITS - 1) return M_C + (int64_t)M_V * M_C;
    return 2 * M_C + 4 * (int64_t)M_C * M_C + 3 * (int64_t)M_C * M_F;
}

/* Each unit rounded up to a multiple of S x 16 floats (docs/fsdp.md). */
static int64_t padded(int u, int S) {
    int64_t q = 16 * (int64_t)S;
    return (unit_floats(u) + q - 1) / q * q;
}

typedef struct {
    int64_t params, grads, optimizer, gathered, checkpoint_buffer, snapshot, accumulation, workspaces, runtime;
} counted;

/* One GPU rank of a W-rank cluster of `per_node` ranks a node. */
static counted count_memory(keel_fsdp_strategy s, int W, int per_node, bool bf16, bool checkpointing) {
    int S = s == KEEL_FSDP_NO_SHARD ? 1 : s == KEEL_FSDP_HYBRID_SHARD ? per_node : W; /* ranks sharing a unit */
    int64_t shard = 0, max_padded = 0, all_padded = 0;
    for (int u = 0; u < M_UNITS; u++) {
        shard += padded(u, S) / S;
        all_padded += padded(u, S);
        if (padded(u, S) > max_padded) max_padded = padded(u, S);
    }
    counted c = {.params = 4 * shard, .grads = 4 * shard, .optimizer = 8 * shard};
    /* compute copies: two unit slots (every unit under shard_grad_op), in bf16 (each
     * rank's slice is rounded into its place: no send buffer), none when a rank holds whole
     * units in fp32 (it computes from its master), and two fp32 unit-gradient buffers */
    int64_t slots = s == KEEL_FSDP_SHARD_GRAD_OP ? all_padded : 2 * max_padded;
    if (S == 1 && !bf16) slots = 0;
    c.gathered = (bf16 ? 2 : 4) * slots + 4 * 2 * max_padded;
    c.checkpoint_buffer = checkpointing ? 12 * shard : 0;
    /* the micro-batch's tokens (B x (T + 1) int32) and the GPU attention's rowsum, (B, NH, T) floats
     * (HS = 64: bf16 also keeps q, k, v and dO in bf16 for the tensor cores) */
    int64_t bt = (int64_t)M_B * M_T;
    c.workspaces = 4 * (int64_t)M_B * (M_T + 1) + 4 * bt * M_NH + (bf16 ? 2 * bt * 2 * (2 * M_NH) * (M_C / M_NH) : 0);
    c.runtime = (int64_t)2 << 30; /* a GPU rank's fixed cost; the snapshot lives in host memory: 0 */
    return c;
}

static void check_memory_counted(const keel_config *cfg) {
    static const int shapes[][2] = {{2, 4}, {1, 3}, {3, 2}}; /* nodes x ranks: 8 (no padding), 3 (padding), 3 x 2 */
    const keel_model_config *mc = &cfg->model;
    EXPECT(mc->dim == M_C && mc->n_layers == M_L && mc->n_heads == M_NH && mc->vocab_size == M_V &&
               mc->max_seq_len == M_T && mc->multiple_of == 32 && !mc->tie_embeddings &&
               cfg->train.micro_batch_size == M_B,
           "MODEL is the shape counted here");
    int bad = 0, checked = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
        for (int s = 0; s < 4; s++)
            for (int variant = 0; variant < 3; variant++) {
                keel_cluster cl = cluster(shapes[k][0], shapes[k][1]);
                keel_config c = *cfg;
                bool bf16 = variant == 1, checkpointing = variant == 2;
                if (bf16) c.fsdp.mixed_precision = KEEL_DTYPE_BF16;
                if (checkpointing) c.checkpoint.every_steps = 10; /* async by default: a buffer on every writer */
                keel_plan_entry e;
                entry(&c, (keel_fsdp_strategy)s, &cl, &e);
                int W = shapes[k][0] * shapes[k][1];
                counted want = count_memory((keel_fsdp_strategy)s, W, shapes[k][1], bf16, checkpointing);
                const keel_fsdp_memory *m = &e.memory;
                bool ok = m->params == want.params && m->grads == want.grads && m->optimizer == want.optimizer &&
                          m->gathered == want.gathered && m->checkpoint_buffer == want.checkpoint_buffer &&
                          m->snapshot == 0 && m->accumulation == 0 && m->workspaces == want.workspaces &&
                          m->runtime == want.runtime;
                checked++;
                if (!ok && bad++ < 8)
                    EXPECT(false,
                           "%s on %d x %d ranks%s%s: params %lld grads %lld optimizer %lld gathered %lld checkpoint "
                           "buffer %lld snapshot %lld accumulation %lld workspaces %lld runtime %lld, counted %lld "
                           "%lld %lld %lld %lld 0 0 %lld %lld",
                           keel_strategy_name((keel_fsdp_strategy)s), shapes[k][0], shapes[k][1], bf16 ? ", bf16" : "",
                           checkpointing ? ", checkpointing" : "", (long long)m->params, (long long)m->grads,
                           (long long)m->optimizer, (long long)m->gathered, (long long)m->checkpoint_buffer,
                           (long long)m->snapshot, (long long)m->accumulation, (long long)m->workspaces,
                           (long long)m->runtime, (long long)want.params, (long long)want.grads,
                           (long long)want.optimizer, (long long)want.gathered, (long long)want.checkpoint_buffer,
                           (long long)want.workspaces, (long long)want.runtime);
            }
    EXPECT(bad == 0, "memory per rank by category equals the count from the shape in %d of %d plans (4 strategies, "
           "8 / 3 / 3 x 2 ranks, fp32, bf16, a checkpoint buffer)", checked - bad, checked);
    /* the count itself, by hand once: full_shard on 3 ranks pads the embedding and the head to 48 floats */
    int64_t three = count_memory(KEEL_FSDP_FULL_SHARD, 3, 3, false, false).params;
    EXPECT(padded(0, 3) == 1048608 && padded(M_UNITS - 1, 3) == 1048848 && padded(1, 3) == 803328 &&
               three == 4 * (1048608 + 4 * 803328 + 1048848) / 3,
           "3 ranks: embedding 1048576 -> 1048608, head 1048832 -> 1048848 floats, blocks 803328 unpadded");
}

static void check_memory(const keel_config *cfg) {
    keel_cluster cl = cluster(2, 4);
    keel_plan_entry e;
    entry(cfg, KEEL_FSDP_FULL_SHARD, &cl, &e);
    keel_config gpu = *cfg; /* the cluster's ranks are GPUs: the CUDA backend's memory */
    gpu.device = KEEL_BACKEND_CUDA;
    keel_fsdp_memory m, host;
    keel_fsdp_memory_plan_run(&gpu, 8, true, 1, &m);
    keel_fsdp_memory_plan_run(cfg, 8, true, 1, &host);
    int64_t B = cfg->train.micro_batch_size, T = cfg->model.max_seq_len, NH = cfg->model.n_heads;
    EXPECT(m.workspaces - host.workspaces >= 4 * B * T * NH,
           "a GPU rank's workspaces hold the attention's scratch (%lld more bytes than the CPU's)",
           (long long)(m.workspaces - host.workspaces));
    keel_fsdp_memory_item items[KEEL_FSDP_MEMORY_CATEGORIES];
    keel_fsdp_memory_items(&e.memory, items);
    int64_t sum = 0;
    for (int i = 0; i < KEEL_FSDP_MEMORY_CATEGORIES; i++) sum += items[i].bytes;
    counted want = count_memory(KEEL_FSDP_FULL_SHARD, 8, 4, false, false);
    EXPECT(e.memory.params == want.params && e.memory.gathered == want.gathered &&
               e.memory.workspaces == want.workspaces && e.memory.activations > 0,
           "the plan's categories are the count from the shape (params %lld of %lld, gathered %lld of %lld, "
           "workspaces %lld of %lld)",
           (long long)e.memory.params, (long long)want.params, (long long)e.memory.gathered, (long long)want.gathered,
           (long long)e.memory.workspaces, (long long)want.workspaces);
    EXPECT(sum == e.peak_bytes, "peak_bytes is the sum of the categories (%lld)", (long long)sum);
    EXPECT(e.memory.runtime == (int64_t)cl.device.runtime_bytes, "a GPU rank's fixed cost is the device's");
    keel_plan_entry ns;
    entry(cfg, KEEL_FSDP_NO_SHARD, &cl, &ns);
    EXPECT(ns.memory.params > 7 * e.memory.params && ns.shard_group == 1 && ns.replicas == 8,
           "no_shard holds all parameters (%lld vs %lld sharded 8 ways)", (long long)ns.memory.params,
           (long long)e.memory.params);
}

static void check_free_and_slow_comm(const keel_config *cfg) {
    keel_cluster cl = cluster(2, 4);
    cl.device.intra_bw = cl.device.net_bw = 1e30;
    cl.device.intra_latency_s = cl.device.net_latency_s = 0;
    keel_plan_entry e;
    entry(cfg, KEEL_FSDP_FULL_SHARD, &cl, &e);
    EXPECT(e.exposed_s < 1e-12 && e.scaling_efficiency > 0.999999,
           "free communication: nothing exposed (%g s), scaling efficiency %.6f", e.exposed_s, e.scaling_efficiency);
    EXPECT(fabs(e.step_s - (e.compute_s + e.optimizer_s)) < 1e-9 * e.step_s,
           "free communication: step = compute + optimizer");

    cl = cluster(2, 4);
    cl.device.intra_bw = cl.device.net_bw = 1e6; /* 1 MB/s */
    entry(cfg, KEEL_FSDP_FULL_SHARD, &cl, &e);
    EXPECT(e.step_s >= e.comm_s && e.exposed_s >= e.comm_s - e.compute_s - 1e-9 && e.scaling_efficiency < 0.1,
           "communication 1000x compute: the step is at least all of it (step %.2f s, comm %.2f s, efficiency %.3f)",
           e.step_s, e.comm_s, e.scaling_efficiency);
    EXPECT(e.waits_s[KEEL_WAIT_STEADY] > 0.5 * e.exposed_s, "and most of the wait is compute outrunning it");
}

static void check_bandwidth_and_prefetch(const keel_config *cfg) {
    keel_cluster cl = cluster(1, 8);
    cl.device.intra_latency_s = 0;
    keel_plan_entry a, b;
    entry(cfg, KEEL_FSDP_FULL_SHARD, &cl, &a);
    cl.device.intra_bw *= 2;
    entry(cfg, KEEL_FSDP_FULL_SHARD, &cl, &b);
    double ratio = b.waits_s[KEEL_WAIT_FIRST_GATHER] / a.waits_s[KEEL_WAIT_FIRST_GATHER];
    EXPECT(fabs(ratio - 0.5) < 1e-9 && fabs(b.comm_s / a.comm_s - 0.5) < 1e-9,
           "twice the bandwidth, no latency: the first gather and all transfers take half (%.6f)", ratio);
    keel_config c = *cfg;
    c.fsdp.prefetch = false;
    keel_plan_entry off;
    entry(&c, KEEL_FSDP_FULL_SHARD, &cl, &off);
    EXPECT(off.exposed_s > 2 * b.exposed_s && fabs(off.comm_s - b.comm_s) < 1e-12,
           "without prefetch every gather is waited for (exposed %.3g s vs %.3g s with)", off.exposed_s, b.exposed_s);
    keel_plan_entry sgo;
    entry(cfg, KEEL_FSDP_SHARD_GRAD_OP, &cl, &sgo);
    EXPECT(sgo.comm_s < b.comm_s && sgo.memory.gathered > b.memory.gathered,
           "shard_grad_op gathers less (%.3g < %.3g s) and holds more (%lld > %lld bytes)", sgo.comm_s, b.comm_s,
           (long long)sgo.memory.gathered, (long long)b.memory.gathered);
}

static void check_replicas(const keel_config *cfg) {
    keel_cluster cl = cluster(4, 2);
    keel_plan_entry fs, ns, hy;
    entry(cfg, KEEL_FSDP_FULL_SHARD, &cl, &fs);
    entry(cfg, KEEL_FSDP_NO_SHARD, &cl, &ns);
    entry(cfg, KEEL_FSDP_HYBRID_SHARD, &cl, &hy);
    EXPECT(fs.waits_s[KEEL_WAIT_REPLICAS] == 0 && ns.waits_s[KEEL_WAIT_REPLICAS] > 0 &&
               hy.waits_s[KEEL_WAIT_REPLICAS] > 0,
           "replicas all-reduce after backward: no_shard %.3g s, hybrid %.3g s, full_shard none",
           ns.waits_s[KEEL_WAIT_REPLICAS], hy.waits_s[KEEL_WAIT_REPLICAS]);
    EXPECT(hy.shard_group == 2 && hy.replicas == 4, "hybrid_shard's shard group is a node (%d x %d)", hy.shard_group,
           hy.replicas);
    cl = cluster(1, 8);
    entry(cfg, KEEL_FSDP_HYBRID_SHARD, &cl, &hy);
    EXPECT(hy.replicas == 1 && hy.waits_s[KEEL_WAIT_REPLICAS] == 0, "one node: hybrid has no replicas to reduce");
}

static void check_checkpointing_and_accumulation(const keel_config *cfg) {
    keel_cluster cl = cluster(1, 8);
    keel_config c = *cfg;
    c.fsdp.activation_checkpointing = KEEL_CHECKPOINT_ALL;
    keel_plan_entry on, off, part;
    entry(&c, KEEL_FSDP_FULL_SHARD, &cl, &on);
    entry(cfg, KEEL_FSDP_FULL_SHARD, &cl, &off);
    int L = cfg->model.n_layers;
    EXPECT(on.checkpoint_blocks == L && on.recompute_s > 0 && on.recompute_s < on.compute_s / 3 &&
               off.recompute_s == 0,
           "checkpointing recomputes the blocks' forward but the last's (%.3g s of %.3g)", on.recompute_s,
           on.compute_s);
    EXPECT(on.memory.activations == on.activations_with && off.memory.activations == off.activations_without &&
               on.activations_with < on.activations_without && on.activations_without == off.activations_without,
           "activations with checkpointing %lld < without %lld", (long long)on.activations_with,
           (long long)on.activations_without);
    c.fsdp.activation_checkpointing = 2; /* the first two blocks: one recomputed */
    entry(&c, KEEL_FSDP_FULL_SHARD, &cl, &part);
    EXPECT(fabs(part.recompute_s * (L - 1) - on.recompute_s) < 1e-9 * on.recompute_s &&
               part.memory.activations < off.memory.activations && part.memory.activations > on.memory.activations,
           "2 of %d blocks checkpointed: 1/%d of the recomputation (%.3g s), activations between (%lld)", L, L - 1,
           part.recompute_s, (long long)part.memory.activations);
    c = *cfg;
    c.train.grad_accum_steps = 4;
    keel_plan_entry acc;
    entry(&c, KEEL_FSDP_FULL_SHARD, &cl, &acc);
    EXPECT(fabs(acc.compute_s - 4 * off.compute_s) < 1e-9 * acc.compute_s &&
               fabs(acc.comm_s - 4 * (off.comm_s - off.waits_s[KEEL_WAIT_SCALARS]) - off.waits_s[KEEL_WAIT_SCALARS]) <
                   1e-6 * acc.comm_s,
           "4 micro-batches: 4x the compute and the per-micro-batch gathers and reduce-scatters");
    c.train.grad_accum_steps = 100000; /* past the replayed micro-batches: the same per micro-batch */
    entry(&c, KEEL_FSDP_FULL_SHARD, &cl, &acc);
    double scalars = off.waits_s[KEEL_WAIT_SCALARS];
    EXPECT(fabs(acc.comm_s - scalars - 1e5 * (off.comm_s - scalars)) < 1e-6 * acc.comm_s &&
               fabs(acc.compute_s - 1e5 * off.compute_s) < 1e-9 * acc.compute_s && acc.step_s > 1e5 * off.compute_s,
           "100000 micro-batches: 1e5 x the compute and communication (step %.1f s)", acc.step_s);
}

/* LoRA on MODEL: rank 8 on q and v (C x C each), A (8, C) and B (C, 8). */
static void check_lora(const keel_config *cfg) {
    enum { R = 8 };
    keel_config c = *cfg;
    c.train.lora = (keel_lora_config){.on = true, .rank = R, .alpha = 16, .targets = 1u << KEEL_LORA_Q | 1u << KEEL_LORA_V};
    keel_cluster cl = cluster(1, 8);
    cl.device.intra_latency_s = 0;
    keel_plan_entry full, lora, lora_sgo;
    entry(cfg, KEEL_FSDP_FULL_SHARD, &cl, &full);
    entry(&c, KEEL_FSDP_FULL_SHARD, &cl, &lora);
    entry(&c, KEEL_FSDP_SHARD_GRAD_OP, &cl, &lora_sgo);
    double M = (double)M_L * (4.0 * M_C * M_C + 3.0 * M_C * M_F) + (double)M_V * M_C, attention = 12.0 * M_L * M_C * M_T;
    double adapters = M_L * 2 * (8.0 * R * M_C + 6.0 * M_C * R);
    double want = (4 * M + attention + adapters) / (6 * M + attention);
    EXPECT(fabs(lora.compute_s / full.compute_s - want) < 1e-12,
           "LoRA's compute is its FLOPs' share of a full step's: %.6f, want %.6f", lora.compute_s / full.compute_s, want);
    double shard = (double)M_L * 2 * (R * M_C + M_C * R) / 8; /* the adapters' floats a rank steps */
    EXPECT(lora.optimizer_s < full.optimizer_s / 50 && lora.comm_s < full.comm_s && lora.step_s < full.step_s,
           "LoRA steps %.0f adapter floats a rank: optimizer %.3g s (full %.3g), communication %.3g s (full %.3g), "
           "step %.3g s (full %.3g)", shard, lora.optimizer_s, full.optimizer_s, lora.comm_s, full.comm_s, lora.step_s,
           full.step_s);
    /* shard_grad_op: per block the adapters' gather and reduce-scatter (fp32, 7/8 of the unit
     * through each rank), then the loss and the norm (8 bytes, all-reduced twice each) */
    double unit = 4.0 * 2 * (R * M_C + M_C * R), bw = cl.device.intra_bw;
    double sgo_want = M_L * 2 * (7.0 / 8 * unit / bw) + 2 * (2 * 7.0 / 8 * 8 / bw);
    EXPECT(fabs(lora_sgo.comm_s - sgo_want) < 1e-9 * sgo_want && lora_sgo.comm_s < lora.comm_s / 10,
           "LoRA under shard_grad_op moves the adapters alone: %.4g s of communication, want %.4g (full_shard %.4g)",
           lora_sgo.comm_s, sgo_want, lora.comm_s);
}

/* The recommendation against every candidate it could have picked. */
static void check_recommendation(const keel_config *cfg) {
    keel_cluster cl = cluster(2, 8);
    keel_config c = *cfg;
    c.train.micro_batch_size = 8;
    keel_plan p;
    keel_plan_make(&c, &cl, &p);
    bool beaten = false;
    for (int s = 0; s < 4; s++)
        for (int ac = 0; ac <= c.model.n_layers; ac++)
            for (int B = 1; B <= 8; B *= 2) {
                keel_config x = c;
                x.fsdp.strategy = (keel_fsdp_strategy)s;
                x.fsdp.activation_checkpointing = ac;
                x.train.micro_batch_size = B;
                x.train.grad_accum_steps = 8 / B;
                keel_plan_entry e;
                keel_plan_entry_make(&x, &cl, &e);
                beaten |= e.fits && e.tokens_per_s > 1.01 * p.best.tokens_per_s;
            }
    EXPECT(p.best.fits && !beaten && p.best.micro_batch * p.best.grad_accum == 8,
           "the recommendation (%s, micro-batch %d x %d) fits, keeps the batch, and nothing that fits is faster",
           keel_strategy_name(p.best.strategy), p.best.micro_batch, p.best.grad_accum);
    cl.device.memory_bytes = 1 << 20; /* 1 MiB: nothing fits */
    keel_plan_make(&c, &cl, &p);
    bool smaller = false;
    for (int s = 0; s < 4; s++) {
        keel_config x = c;
        x.fsdp.strategy = (keel_fsdp_strategy)s;
        x.fsdp.activation_checkpointing = KEEL_CHECKPOINT_ALL;
        x.train.micro_batch_size = 1;
        x.train.grad_accum_steps = 8;
        keel_plan_entry e;
        keel_plan_entry_make(&x, &cl, &e);
        smaller |= e.peak_bytes < p.best.peak_bytes;
    }
    EXPECT(!p.best.fits && !smaller && p.best.peak_bytes > p.best.budget_bytes,
           "nothing fits in 1 MiB: the recommendation is the smallest plan, marked as not fitting (%lld bytes)",
           (long long)p.best.peak_bytes);
}

/* A rank with room for some blocks' activations but not all: the
 * recommendation checkpoints the fewest blocks that fit. */
static void check_partial_checkpointing(const keel_config *cfg) {
    keel_cluster cl = cluster(1, 2);
    keel_config c = *cfg;
    c.train.micro_batch_size = 1;
    c.fsdp.activation_checkpointing = 0;
    keel_plan_entry none, fewer;
    keel_plan_entry_make(&c, &cl, &none);
    int64_t set = none.activations_without - none.activations_with; /* L - 1 blocks' sets */
    int L = c.model.n_layers;
    cl.device.memory_bytes = (double)(none.peak_bytes - set / (L - 1) * 3 / 2); /* 1.5 sets short */
    keel_plan p;
    keel_plan_make(&c, &cl, &p);
    c.fsdp.strategy = p.best.strategy;
    c.fsdp.activation_checkpointing = p.best.checkpoint_blocks - 1;
    keel_plan_entry_make(&c, &cl, &fewer);
    EXPECT(p.best.fits && p.best.checkpoint_blocks == 3 && p.best.micro_batch == 1 && !fewer.fits,
           "1.5 blocks' activations short: the recommendation checkpoints 3 of %d blocks (%d), and 2 do not fit",
           L, p.best.checkpoint_blocks);
}

int main(void) {
    keel_config cfg;
    keel_config_defaults(&cfg);
    if (keel_config_load_string(&cfg, MODEL, "test") != KEEL_OK || keel_config_finalize(&cfg) != KEEL_OK) return 1;
    check_memory(&cfg);
    check_memory_counted(&cfg);
    check_free_and_slow_comm(&cfg);
    check_bandwidth_and_prefetch(&cfg);
    check_replicas(&cfg);
    check_checkpointing_and_accumulation(&cfg);
    check_partial_checkpointing(&cfg);
    check_lora(&cfg);
    check_recommendation(&cfg);
    keel_config_free(&cfg);
    return test_summary("test_plan_model");
}
