/* fsdp/runtime.c: FULL_SHARD — gather before use, prefetch the next unit,
 * free after use, reduce-scatter each unit's gradients as soon as they exist. */
#include <string.h>

#include "keel/fsdp.h"
#include "keel/kernels.h"

#define MAX_SLOTS 4    /* current + prefetched unit, + unit 0 pinned when tied */
#define GRAD_BUFFERS 3 /* one reduce-scattering while the next unit computes, + unit 0 when tied */

typedef struct {
    int unit;            /* unit whose gradient is in the buffer, -1 if free */
    keel_comm_req *req;  /* its reduce-scatter, NULL once added into the shard */
} grad_buffer;

struct keel_fsdp {
    keel_model *model;
    keel_comm *group;
    keel_fsdp_plan plan;
    const keel_model_layout *lay;
    int rank;
    bool tied;
    float *master;              /* (shard_total) fp32 master shard */
    float *grads;               /* (shard_total) fp32 gradient shard */
    float *slots[MAX_SLOTS];    /* (max_padded) gathered unit parameters */
    int slot_unit[MAX_SLOTS];   /* unit in each slot, -1 if free */
    int *unit_slot;             /* (n_units) slot of each unit, -1 if not gathered */
    keel_comm_req **gather_req; /* (n_units) outstanding gather of each unit */
    float *gbuf[GRAD_BUFFERS];  /* (max_padded) full unit gradients */
    float *rs_out[GRAD_BUFFERS];/* (max shard) reduce-scatter results */
    grad_buffer gstate[GRAD_BUFFERS];
    int next_gbuf;
    double gather_wait_s, reduce_wait_s;
};

static int pinned_unit(const keel_fsdp *f) { return f->tied ? 0 : -1; }

static int64_t max_shard(const keel_fsdp_plan *plan) {
    int64_t m = 0;
    for (int u = 0; u < plan->n_units; u++)
        if (plan->units[u].shard > m) m = plan->units[u].shard;
    return m;
}

static void start_gather(keel_fsdp *f, int u) {
    if (f->unit_slot[u] >= 0) return;
    int s = 0;
    while (s < MAX_SLOTS && f->slot_unit[s] >= 0) s++;
    KEEL_CHECK(s < MAX_SLOTS, "no free slot to gather unit %d", u);
    f->slot_unit[s] = u;
    f->unit_slot[u] = s;
    const keel_fsdp_unit *x = &f->plan.units[u];
    keel_comm_iallgather(f->group, f->master + x->shard_offset, f->slots[s], (size_t)x->shard,
                         KEEL_COMM_F32, &f->gather_req[u]);
}

static float *ready(keel_fsdp *f, int u) {
    start_gather(f, u);
    if (f->gather_req[u]) {
        double t0 = keel_now_s();
        keel_comm_wait(f->gather_req[u]);
        f->gather_req[u] = NULL;
        f->gather_wait_s += keel_now_s() - t0;
    }
    return f->slots[f->unit_slot[u]];
}

static void release(keel_fsdp *f, int u) {
    int s = f->unit_slot[u];
    if (s < 0 || u == pinned_unit(f)) return;
    KEEL_CHECK(!f->gather_req[u], "releasing unit %d with its gather outstanding", u);
    f->slot_unit[s] = -1;
    f->unit_slot[u] = -1;
}

/* Finish buffer b's reduce-scatter and add it into this rank's gradient shard. */
static void drain(keel_fsdp *f, int b) {
    grad_buffer *g = &f->gstate[b];
    if (g->unit < 0) return;
    if (g->req) {
        double t0 = keel_now_s();
        keel_comm_wait(g->req);
        f->reduce_wait_s += keel_now_s() - t0;
        g->req = NULL;
    }
    const keel_fsdp_unit *x = &f->plan.units[g->unit];
    float *dst = f->grads + x->shard_offset;
    for (int64_t i = 0; i < x->shard; i++) dst[i] += f->rs_out[b][i];
    g->unit = -1;
}

/* A zeroed gradient buffer for unit u. */
static float *grad_buffer_for(keel_fsdp *f, int u) {
    int b;
    if (u == pinned_unit(f)) b = GRAD_BUFFERS - 1;
    else {
        b = f->next_gbuf;
        f->next_gbuf = (f->next_gbuf + 1) % (GRAD_BUFFERS - 1);
    }
    drain(f, b);
    f->gstate[b].unit = u;
    memset(f->gbuf[b], 0, sizeof(float) * (size_t)f->plan.units[u].padded);
    return f->gbuf[b];
}

static void start_reduce_scatter(keel_fsdp *f, int u) {
    for (int b = 0; b < GRAD_BUFFERS; b++)
        if (f->gstate[b].unit == u && !f->gstate[b].req) {
            keel_comm_ireduce_scatter(f->group, f->gbuf[b], f->rs_out[b],
                                      (size_t)f->plan.units[u].shard, KEEL_COMM_F32, KEEL_COMM_SUM,
                                      &f->gstate[b].req);
            return;
        }
    KEEL_CHECK(false, "unit %d has no gradient buffer to reduce-scatter", u);
}

static void before_forward(void *p, int u) {
    keel_fsdp *f = p;
    keel_model_set_unit_buffers(f->model, u, ready(f, u), NULL);
    if (f->tied && u == f->plan.n_units - 1) /* the head reads the embedding */
        keel_model_set_unit_buffers(f->model, 0, ready(f, 0), NULL);
    if (u + 1 < f->plan.n_units) start_gather(f, u + 1);
}

static void after_forward(void *p, int u) {
    keel_fsdp *f = p;
    if (u + 1 < f->plan.n_units) release(f, u); /* the head is the first unit of backward */
}

static void before_backward(void *p, int u) {
    keel_fsdp *f = p;
    float *params = ready(f, u);
    if (u == f->plan.n_units - 1 && f->tied) /* the head adds into unit 0's gradient */
        keel_model_set_unit_buffers(f->model, 0, ready(f, 0), grad_buffer_for(f, 0));
    float *grads = u == pinned_unit(f) ? f->gbuf[GRAD_BUFFERS - 1] : grad_buffer_for(f, u);
    keel_model_set_unit_buffers(f->model, u, params, grads);
    if (u > 0) start_gather(f, u - 1);
}

static void after_backward(void *p, int u) {
    keel_fsdp *f = p;
    start_reduce_scatter(f, u);
    release(f, u);
}

keel_status keel_fsdp_build(keel_model *model, keel_comm *group, keel_fsdp **out) {
    keel_fsdp *f = keel_xcalloc(sizeof *f, "fsdp");
    f->model = model;
    f->group = group;
    f->lay = keel_model_get_layout(model);
    f->rank = keel_comm_rank(group);
    f->tied = f->lay->cfg.tie_embeddings;
    keel_fsdp_plan_init(&f->plan, f->lay, keel_comm_size(group));
    f->master = keel_xcalloc(sizeof(float) * (size_t)f->plan.shard_total, "fsdp master shard");
    f->grads = keel_xcalloc(sizeof(float) * (size_t)f->plan.shard_total, "fsdp grad shard");
    for (int s = 0; s < MAX_SLOTS; s++) {
        f->slots[s] = keel_xcalloc(sizeof(float) * (size_t)f->plan.max_padded, "fsdp unit slot");
        f->slot_unit[s] = -1;
    }
    for (int b = 0; b < GRAD_BUFFERS; b++) {
        f->gbuf[b] = keel_xcalloc(sizeof(float) * (size_t)f->plan.max_padded, "fsdp unit grads");
        f->rs_out[b] = keel_xcalloc(sizeof(float) * (size_t)max_shard(&f->plan), "fsdp reduce-scatter");
        f->gstate[b].unit = -1;
    }
    f->unit_slot = keel_xmalloc(sizeof(int) * (size_t)f->plan.n_units, "fsdp unit slots");
    for (int u = 0; u < f->plan.n_units; u++) f->unit_slot[u] = -1;
    f->gather_req = keel_xcalloc(sizeof(keel_comm_req *) * (size_t)f->plan.n_units, "fsdp reqs");
    keel_model_hooks hooks = {f, before_forward, after_forward, before_backward, after_backward};
    keel_model_set_hooks(model, &hooks);
    *out = f;
    return KEEL_OK;
}

void keel_fsdp_free(keel_fsdp *f) {
    if (!f) return;
    keel_fsdp_finish_grads(f);
    keel_fsdp_invalidate(f);
    keel_model_set_hooks(f->model, NULL);
    for (int s = 0; s < MAX_SLOTS; s++) keel_free(f->slots[s]);
    for (int b = 0; b < GRAD_BUFFERS; b++) keel_free(f->gbuf[b]), keel_free(f->rs_out[b]);
    keel_free(f->master);
    keel_free(f->grads);
    keel_free(f->unit_slot);
    keel_free(f->gather_req);
    keel_fsdp_plan_free(&f->plan);
    keel_free(f);
}

const keel_fsdp_plan *keel_fsdp_get_plan(const keel_fsdp *f) { return &f->plan; }
float *keel_fsdp_master(keel_fsdp *f) { return f->master; }
float *keel_fsdp_grads(keel_fsdp *f) { return f->grads; }

void keel_fsdp_load_full(keel_fsdp *f, const float *full) {
    memset(f->master, 0, sizeof(float) * (size_t)f->plan.shard_total);
    for (int u = 0; u < f->plan.n_units; u++) {
        int64_t begin, len;
        keel_fsdp_shard_range(&f->plan, u, f->rank, &begin, &len);
        memcpy(f->master + f->plan.units[u].shard_offset, full + begin, sizeof(float) * (size_t)len);
    }
    keel_fsdp_invalidate(f);
}

void keel_fsdp_invalidate(keel_fsdp *f) {
    for (int u = 0; u < f->plan.n_units; u++)
        if (f->gather_req[u]) {
            keel_comm_wait(f->gather_req[u]);
            f->gather_req[u] = NULL;
        }
    for (int s = 0; s < MAX_SLOTS; s++) f->slot_unit[s] = -1;
    for (int u = 0; u < f->plan.n_units; u++) f->unit_slot[u] = -1;
}

keel_status keel_fsdp_gather_full(keel_fsdp *f, float *full) {
    float *tmp = keel_xmalloc(sizeof(float) * (size_t)f->plan.max_padded, "fsdp gather");
    keel_status st = KEEL_OK;
    for (int u = 0; u < f->plan.n_units && st == KEEL_OK; u++) {
        const keel_fsdp_unit *x = &f->plan.units[u];
        st = keel_comm_allgather(f->group, f->master + x->shard_offset, tmp, (size_t)x->shard,
                                 KEEL_COMM_F32);
        memcpy(full + x->offset, tmp, sizeof(float) * (size_t)x->logical);
    }
    keel_free(tmp);
    return st;
}

void keel_fsdp_zero_grads(keel_fsdp *f) {
    memset(f->grads, 0, sizeof(float) * (size_t)f->plan.shard_total);
}

keel_status keel_fsdp_finish_grads(keel_fsdp *f) {
    for (int b = 0; b < GRAD_BUFFERS; b++) drain(f, b);
    return KEEL_OK;
}

keel_status keel_fsdp_grad_sumsq(keel_fsdp *f, double *sumsq) {
    *sumsq = keel_sumsq(f->grads, f->plan.shard_total);
    return keel_comm_allreduce_scalar(f->group, sumsq, KEEL_COMM_SUM);
}

int64_t keel_fsdp_transient_bytes(const keel_fsdp_plan *plan) {
    return 4 * (MAX_SLOTS * plan->max_padded + GRAD_BUFFERS * (plan->max_padded + max_shard(plan)));
}

void keel_fsdp_get_stats(const keel_fsdp *f, keel_fsdp_stats *out) {
    *out = (keel_fsdp_stats){
        .master_bytes = 4 * f->plan.shard_total,
        .grad_bytes = 4 * f->plan.shard_total,
        .gathered_bytes = 4 * MAX_SLOTS * f->plan.max_padded,
        .unit_grad_bytes = 4 * GRAD_BUFFERS * (f->plan.max_padded + max_shard(&f->plan)),
        .gather_wait_s = f->gather_wait_s,
        .reduce_wait_s = f->reduce_wait_s,
    };
}
