/* plan/calibrate.c: the efficiency keel reaches on this machine, measured —
 * its own forward + backward of a one-block slice of the config's model,
 * the block's time taken apart from the rest (the head, the loss, the
 * embedding) through the model's unit hooks — and AdamW's rate and a
 * streaming pass's bandwidth. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "keel/kernels.h"
#include "keel/plan.h"

#define SLICE_BUDGET_S 0.5  /* a slice's estimated fwd + bwd; smaller batches, then shorter sequences beyond it */
/* The slice's vocabulary at most: the head of Llama 3 at 70B width (128256 x
 * 8192, with its gradient) alone would take 8 GB; the head's time (a GEMM
 * and the loss, linear in the vocabulary) is scaled up from this. */
#define SLICE_VOCAB_MAX 32000
#define SLICE_REPS 4        /* the first warms up; the median of the rest counts (the machine may be shared) */
/* AdamW's four arrays, 256 MB in all: with 64 MB three plans on a quiet
 * machine read 329-615 M parameters/s, with 256 MB 586-638. */
#define ADAMW_FLOATS ((int64_t)16 << 20)

static double slice_flops(const keel_model_config *mc, int layers, int B, int T) {
    keel_model_config c = *mc;
    c.n_layers = layers;
    c.max_seq_len = T;
    keel_model_layout lay;
    keel_model_layout_init(&lay, &c);
    double flops = keel_model_flops_per_token(&lay) * B * T;
    keel_model_layout_free(&lay);
    return flops;
}

/* The block's (unit 1) forward and backward, timed from the model's hooks. */
typedef struct {
    double started, block_s;
} block_clock;
static void block_begin(void *p, int unit, int next) {
    (void)next;
    if (unit == 1) ((block_clock *)p)->started = keel_now_s();
}
static void block_end(void *p, int unit, int next) {
    (void)next;
    block_clock *c = p;
    if (unit == 1) c->block_s += keel_now_s() - c->started;
}

typedef struct {
    double total_s, block_s; /* medians: forward + backward, and the block's part */
    double wall_s, cpu_s;    /* over the timed reps: how much of the cores the process got */
} slice_times;

/* Forward + backward of the config's model cut to one block and a vocabulary
 * of V, sequences of T, micro-batches of B. */
static void time_slice(const keel_config *cfg, int V, int B, int T, bool bf16, slice_times *out) {
    keel_model_config mc = cfg->model;
    mc.n_layers = 1;
    mc.vocab_size = V;
    mc.max_seq_len = T;
    keel_model_options o = {.own_params = true, .bf16 = bf16};
    keel_model *m;
    keel_model_build_with(&mc, B, &o, &m);
    keel_model_init_weights(m, 1);
    block_clock clock = {0};
    keel_model_hooks hooks = {&clock, block_begin, block_end, block_begin, block_end};
    keel_model_set_hooks(m, &hooks);
    int32_t *tokens = keel_xmalloc(sizeof(int32_t) * (size_t)B * (T + 1), "calibration tokens");
    for (int64_t i = 0; i < (int64_t)B * (T + 1); i++) tokens[i] = (int32_t)((i * 7919) % mc.vocab_size);
    double total[SLICE_REPS], block[SLICE_REPS];
    *out = (slice_times){0};
    for (int rep = 0; rep < SLICE_REPS; rep++) {
        clock.block_s = 0;
        double t0 = keel_now_s(), c0 = keel_cpu_s();
        keel_model_forward(m, tokens, NULL, B, 1.0f / (float)(B * T));
        keel_model_backward(m);
        total[rep] = keel_now_s() - t0;
        block[rep] = clock.block_s;
        if (rep > 0) out->wall_s += total[rep], out->cpu_s += keel_cpu_s() - c0;
    }
    keel_free(tokens);
    keel_model_free(m);
    out->total_s = keel_median(total + 1, SLICE_REPS - 1);
    out->block_s = keel_median(block + 1, SLICE_REPS - 1);
}

/* Parameters/s keel's AdamW updates on all threads, and bytes/s a plain
 * streaming pass (the gradient norm's) reads. */
static void shard_rates(double *adamw_params_per_s, double *stream_bw) {
    float *buf = keel_xcalloc(sizeof(float) * 4 * (size_t)ADAMW_FLOATS, "calibration AdamW");
    float *p = buf, *g = p + ADAMW_FLOATS, *m = g + ADAMW_FLOATS, *v = m + ADAMW_FLOATS;
    keel_adamw_step s = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .grad_scale = 1.0f};
    double adamw = INFINITY, stream = INFINITY;
    for (int rep = 0; rep < SLICE_REPS; rep++) {
        s.t = rep + 1;
        double t0 = keel_now_s();
        keel_adamw_update(p, g, m, v, ADAMW_FLOATS, &s);
        double t1 = keel_now_s();
        volatile double sink = keel_sumsq(buf, 4 * ADAMW_FLOATS);
        (void)sink;
        if (rep > 0) adamw = fmin(adamw, t1 - t0), stream = fmin(stream, keel_now_s() - t1);
    }
    keel_free(buf);
    *adamw_params_per_s = (double)ADAMW_FLOATS / adamw;
    *stream_bw = 16.0 * (double)ADAMW_FLOATS / stream;
}

/* The compute a node's ranks share: the efficiency a slice of the model
 * reaches with the threads one rank gets (train.c gives a rank cores /
 * ranks threads, at least one), times the ranks that run at once (ranks past
 * the cores take turns). Measured as a rank runs — 2 ranks of 1 thread get
 * more from 2 cores than 1 process of 2 threads — and on a machine as it is,
 * so that cores taken by other work show (a shared machine) as they will in
 * the run; each of per_node ranks then gets its share of it. */
static double measure_mfu(const keel_config *cfg, int per_node, keel_device *dev) {
    bool bf16 = cfg->fsdp.mixed_precision == KEEL_DTYPE_BF16;
    int want = dev->cores / per_node > 1 ? dev->cores / per_node : 1;
    int threads = keel_kernels_init(want);
    int concurrent = dev->cores / threads < per_node ? dev->cores / threads : per_node;
    if (concurrent < 1) concurrent = 1;
    double peak = keel_peak_flops(bf16);
    int B = cfg->train.micro_batch_size, T = cfg->model.max_seq_len;
    while (slice_flops(&cfg->model, 1, B, T) / (0.5 * peak) > SLICE_BUDGET_S && (B > 1 || T > 64)) {
        if (B > 1) B /= 2;
        else T /= 2;
    }
    slice_times st;
    int V = cfg->model.vocab_size < SLICE_VOCAB_MAX ? cfg->model.vocab_size : SLICE_VOCAB_MAX;
    time_slice(cfg, V, B, T, bf16, &st);
    keel_kernels_shutdown();
    double block = st.block_s, head = fmax(0, st.total_s - st.block_s) * cfg->model.vocab_size / V;
    double full_s = head + cfg->model.n_layers * block;
    double rate = concurrent * slice_flops(&cfg->model, cfg->model.n_layers, B, T) / full_s;
    dev->measured_share = st.cpu_s / st.wall_s / threads;
    snprintf(dev->detail, sizeof dev->detail, "a rank's %d thread(s), %d rank(s) at once: a block %.1f ms, "
             "the rest %.1f ms at micro-batch %d, seq %d (%.1f GF/s a node; the process got %.1f of %d cores "
             "while measuring)", threads, concurrent, 1e3 * block, 1e3 * head, B, T, rate / 1e9,
             st.cpu_s / st.wall_s, threads);
    return fmin(1.0, rate / (bf16 ? dev->peak_flops_bf16 : dev->peak_flops_fp32));
}

keel_status keel_plan_measure_cpu(const keel_config *cfg, bool mfu_given, int per_node, keel_device *dev) {
    keel_kernels_init(dev->cores);
    shard_rates(&dev->adamw_params_per_s, &dev->mem_bw);
    keel_kernels_shutdown();
    if (!mfu_given) dev->mfu = measure_mfu(cfg, per_node, dev);
    return KEEL_OK;
}
