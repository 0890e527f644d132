/* fsdp/runtime.c: the four strategies — gather before use, prefetch the next
 * unit, free after use (FULL_SHARD, HYBRID_SHARD) or after backward
 * (SHARD_GRAD_OP), reduce-scatter each unit's gradients as soon as they exist,
 * all-reduce gradient shards across replicas (NO_SHARD, HYBRID_SHARD).
 *
 * Every array here is the model's backend's memory, and every operation on
 * one — conversions, the shard's additions, the collectives — is a backend
 * call (keel/backend.h): the same schedule runs on the CPU over MPI and on a
 * GPU over NCCL, where a wait only orders the compute stream after the
 * collective. This file never reads or writes an array from the host. */

#include "keel/backend.h"
#include "keel/fsdp.h"

/* Unit-sized buffers: the unit being computed and the one being gathered
 * (slots), the unit whose gradient is being reduce-scattered and the one
 * being computed (gradient buffers), + one of each for the pinned unit 0
 * when embeddings are tied. Each is as large as the largest unit. */
#define GRAD_BUFFERS 3
static int buffers_needed(bool tied) { return tied ? 3 : 2; }

typedef struct {
    int unit;            /* unit whose gradient is in the buffer, -1 if free */
    keel_backend_req *req; /* its reduce-scatter, NULL once added into the shard */
} grad_buffer;

struct keel_fsdp {
    keel_model *model;
    const keel_backend *be;     /* the model's: where every array below lives */
    /* The parameter set sharded: the model's; or with LoRA its frozen base
     * (gathered, no gradients) and, chained to it, the adapters (fp32). */
    keel_fsdp_set set;
    keel_fsdp *adapters;        /* the frozen base's: the adapters' runtime, its hooks called after the base's */
    keel_fsdp_strategy strategy;
    keel_comm *group;           /* shard group: gathers and reduce-scatters */
    keel_comm *replicas;        /* ranks holding the same shard, or NULL */
    bool own_group;             /* group was split off the world (free it) */
    keel_fsdp_plan plan;
    const keel_model_layout *lay;
    int rank;                   /* in the shard group */
    bool prefetch;              /* start gathering the next unit before computing this one */
    int n_slots;                /* SHARD_GRAD_OP: one per unit; else buffers_needed() */
    float *master;              /* (shard_total) fp32 master shard */
    float *grads;               /* (shard_total) fp32 gradient shard */
    /* (n_units) unit u's part of grads holds nothing of this optimizer step
     * yet: its first reduce-scatter result is copied there, not added to a
     * zeroed shard (keel_fsdp_zero_grads writes nothing) */
    bool *grads_unset;
    /* bf16 parameters (a bf16 model): a unit's slice of the master shard is
     * rounded into this rank's place in its slot as its gather starts (the
     * gather runs in place), and the slots hold gathered bf16 units. */
    bool bf16;
    size_t elem;                /* bytes per gathered parameter: 4, or 2 in bf16 */
    void **slots;               /* (n_slots) gathered unit parameters */
    /* Ranks of the shard group on one machine, on a backend that has them
     * (cpu): the slots are a node window's (keel/comm.h), one copy on the
     * machine. A gather writes this rank's part in place and publishes it;
     * nothing is copied, and every rank reads the others' parts where they
     * lie. NULL: the slots are this rank's and the gathers collectives. */
    keel_comm_window *win;
    bool *slot_awaited;         /* (n_slots) win: every rank's part of the slot is known written */
    int *slot_unit;             /* (n_slots) unit in each slot, -1 if free */
    int *unit_slot;             /* (n_units) slot of each unit, -1 if not gathered */
    keel_backend_req **gather_req; /* (n_units) outstanding gather of each unit */
    float *gbuf[GRAD_BUFFERS];  /* (max_padded) full unit gradients */
    /* Node windows for them too (fp32 reductions): buffer b is this rank's
     * part of slot b, every rank's part max_padded floats apart, and a
     * reduce-scatter sums this rank's slice of every part where it lies. */
    keel_comm_window *gwin;
    /* reduce_dtype bf16: unit gradients are rounded to bf16 before their
     * reduce-scatter (gbuf16). Reduce-scatters run in place: this rank's
     * result is its own shard's slice of the buffer it was sent from. */
    bool reduce_bf16;
    keel_bf16 *gbuf16[GRAD_BUFFERS];
    grad_buffer gstate[GRAD_BUFFERS];
    int next_gbuf;
    float *host_unit;           /* gather_unit's copy on the host, when the backend's memory is not */
    double gather_wait_s, reduce_wait_s;
    double device_wait_s; /* the backend's comm_stall_s, summed */
};

static int pinned_unit(const keel_fsdp *f) { return f->plan.tied ? 0 : -1; }

static int64_t max_shard(const keel_fsdp_plan *plan) {
    int64_t m = 0;
    for (int u = 0; u < plan->n_units; u++)
        if (plan->units[u].shard > m) m = plan->units[u].shard;
    return m;
}

static bool frozen(const keel_fsdp *f) { return f->set == KEEL_FSDP_SET_FROZEN_BASE; }

/* A shard group of one rank (NO_SHARD, or one rank in all) holds whole units:
 * in fp32 the model computes from the master shard itself — no slots, and no
 * gather that would only copy it. */
static bool whole_units(const keel_fsdp_plan *plan, bool bf16) { return plan->shard_ranks == 1 && !bf16; }

static void start_gather(keel_fsdp *f, int u) {
    if (f->unit_slot[u] >= 0 || f->plan.units[u].padded == 0 || whole_units(&f->plan, f->bf16))
        return; /* gathered, empty (an adapter set's), or never */
    int s = 0;
    if (f->strategy == KEEL_FSDP_SHARD_GRAD_OP) s = u; /* each unit has its own */
    else
        while (s < f->n_slots && f->slot_unit[s] >= 0) s++;
    KEEL_CHECK(s < f->n_slots && f->slot_unit[s] < 0, "no free slot to gather unit %d", u);
    f->slot_unit[s] = u;
    f->unit_slot[u] = s;
    const keel_fsdp_unit *x = &f->plan.units[u];
    if (f->win) {
        void *own = (char *)f->slots[s] + f->elem * (size_t)f->rank * (size_t)x->shard;
        double t0 = keel_now_s(); /* for the slot's last unit to be released everywhere: mostly, it is */
        f->be->window_claim(f->win, s);
        f->gather_wait_s += keel_now_s() - t0;
        f->be->window_gather(f->win, s, own, f->master + x->shard_offset, x->shard, f->bf16);
        f->slot_awaited[s] = false;
        return;
    }
    if (!f->bf16) {
        f->be->iallgather(f->group, f->master + x->shard_offset, f->slots[s], (size_t)x->shard, KEEL_COMM_F32,
                          &f->gather_req[u]);
        return;
    }
    keel_bf16 *own = (keel_bf16 *)f->slots[s] + (size_t)f->rank * (size_t)x->shard;
    f->be->f32_to_bf16(own, f->master + x->shard_offset, x->shard);
    f->be->iallgather(f->group, own, f->slots[s], (size_t)x->shard, KEEL_COMM_BF16, &f->gather_req[u]);
}

static void *ready(keel_fsdp *f, int u) {
    if (f->plan.units[u].padded == 0) return NULL;
    if (whole_units(&f->plan, f->bf16)) return f->master + f->plan.units[u].shard_offset;
    start_gather(f, u);
    int s = f->unit_slot[u];
    if (f->gather_req[u] || (f->win && !f->slot_awaited[s])) {
        double t0 = keel_now_s();
        if (f->win) {
            f->be->window_wait(f->win, s);
            f->slot_awaited[s] = true;
        } else {
            f->be->wait(f->gather_req[u]);
            f->gather_req[u] = NULL;
        }
        f->gather_wait_s += keel_now_s() - t0;
    }
    return f->slots[s];
}

/* Unit u's slot is free: every unit, the pinned one too (invalidate). */
static void free_slot(keel_fsdp *f, int u) {
    int s = f->unit_slot[u];
    if (s < 0) return;
    if (f->gather_req[u]) {
        f->be->wait(f->gather_req[u]);
        f->gather_req[u] = NULL;
    }
    if (f->win) f->be->window_release(f->win, s); /* the others may write their next unit's parts */
    f->slot_unit[s] = -1;
    f->unit_slot[u] = -1;
}

static void release(keel_fsdp *f, int u) {
    if (u == pinned_unit(f)) return;
    KEEL_CHECK(f->unit_slot[u] < 0 || !f->gather_req[u], "releasing unit %d with its gather outstanding", u);
    free_slot(f, u);
}

/* Finish buffer b's reduce-scatter and add it into this rank's gradient shard. */
static void drain(keel_fsdp *f, int b) {
    grad_buffer *g = &f->gstate[b];
    if (g->unit < 0) return;
    if (g->req) {
        double t0 = keel_now_s();
        f->be->wait(g->req);
        f->reduce_wait_s += keel_now_s() - t0;
        g->req = NULL;
    }
    const keel_fsdp_unit *x = &f->plan.units[g->unit];
    float *dst = f->grads + x->shard_offset;
    int64_t own = (int64_t)f->rank * x->shard;
    bool first = f->grads_unset[g->unit];
    if (f->reduce_bf16) (first ? f->be->bf16_to_f32 : f->be->accumulate_bf16)(dst, f->gbuf16[b] + own, x->shard);
    else if (first) f->be->copy(dst, f->gbuf[b] + own, sizeof(float) * (size_t)x->shard);
    else f->be->accumulate(dst, f->gbuf[b] + own, x->shard);
    f->grads_unset[g->unit] = false;
    g->unit = -1;
}

/* A free reduce-scatter slot: its previous result is added into the shard first. */
static int claim_slot(keel_fsdp *f, int u) {
    int b;
    if (u == pinned_unit(f)) b = GRAD_BUFFERS - 1;
    else {
        b = f->next_gbuf;
        f->next_gbuf = (f->next_gbuf + 1) % (GRAD_BUFFERS - 1);
    }
    drain(f, b);
    f->gstate[b].unit = u;
    return b;
}

/* Where unit u's backward writes its gradient: a zeroed unit buffer (none
 * for a frozen set or an empty unit). */
static float *grad_buffer_for(keel_fsdp *f, int u) {
    if (frozen(f) || f->plan.units[u].padded == 0) return NULL;
    size_t bytes = sizeof(float) * (size_t)f->plan.units[u].padded;
    int b = claim_slot(f, u);
    if (f->gwin) { /* every rank has summed its slice of this buffer's last unit: mostly, they have */
        double t0 = keel_now_s();
        f->be->window_claim(f->gwin, b);
        f->reduce_wait_s += keel_now_s() - t0;
    }
    f->be->zero(f->gbuf[b], bytes);
    return f->gbuf[b];
}

/* Reduce-scatter unit u's full gradient in gradient buffer b, in place. */
static void reduce_scatter(keel_fsdp *f, int u, int b) {
    size_t shard = (size_t)f->plan.units[u].shard, own = (size_t)f->rank * shard;
    if (f->gwin) {
        f->be->window_reduce_scatter(f->gwin, b, (size_t)f->plan.max_padded, shard, KEEL_COMM_F32, &f->gstate[b].req);
        return;
    }
    if (f->reduce_bf16) {
        f->be->f32_to_bf16(f->gbuf16[b], f->gbuf[b], f->plan.units[u].padded);
        f->be->ireduce_scatter(f->group, f->gbuf16[b], f->gbuf16[b] + own, shard, KEEL_COMM_BF16, &f->gstate[b].req);
    } else {
        f->be->ireduce_scatter(f->group, f->gbuf[b], f->gbuf[b] + own, shard, KEEL_COMM_F32, &f->gstate[b].req);
    }
}

static void start_reduce_scatter(keel_fsdp *f, int u) {
    if (frozen(f) || f->plan.units[u].padded == 0) return;
    for (int b = 0; b < GRAD_BUFFERS; b++)
        if (f->gstate[b].unit == u && !f->gstate[b].req) {
            reduce_scatter(f, u, b);
            return;
        }
    KEEL_CHECK(false, "unit %d has no gradient buffer to reduce-scatter", u);
}

/* Point the model at unit u's gathered parameters (and gradient buffer). */
static void set_unit(keel_fsdp *f, int u, void *params, float *grads) {
    if (f->set == KEEL_FSDP_SET_ADAPTERS) keel_model_set_unit_lora(f->model, u, params, grads);
    else if (f->bf16) keel_model_set_unit_bf16(f->model, u, params, grads);
    else keel_model_set_unit_buffers(f->model, u, params, grads);
}

/* A forward starts with nothing gathered but the pinned unit: an evaluation
 * pass, or a training forward whose backward did not come, may have left
 * units (and a prefetch) behind. */
static void release_all(keel_fsdp *f) {
    for (int u = 0; u < f->plan.n_units; u++)
        if (u != pinned_unit(f)) free_slot(f, u);
}

/* The model's next unit: gather it while this one computes. */
static void prefetch(keel_fsdp *f, int next) {
    if (f->prefetch && next >= 0) start_gather(f, next);
}

static void before_forward(void *p, int u, int next) {
    keel_fsdp *f = p;
    if (u == 0 && f->strategy != KEEL_FSDP_SHARD_GRAD_OP) release_all(f);
    set_unit(f, u, ready(f, u), NULL);
    if (f->plan.tied && u == f->plan.n_units - 1) /* the head reads the embedding */
        set_unit(f, 0, ready(f, 0), NULL);
    prefetch(f, next);
    if (f->adapters) before_forward(f->adapters, u, next);
}

static void after_forward(void *p, int u, int next) {
    keel_fsdp *f = p;
    /* SHARD_GRAD_OP keeps every unit until its backward; a unit whose
     * backward follows at once (the head, a recomputed block's last) stays. */
    if (f->strategy != KEEL_FSDP_SHARD_GRAD_OP && next != u) release(f, u);
    if (f->adapters) after_forward(f->adapters, u, next);
}

static void before_backward(void *p, int u, int next) {
    keel_fsdp *f = p;
    void *params = ready(f, u);
    if (u == f->plan.n_units - 1 && f->plan.tied) /* the head adds into unit 0's gradient */
        set_unit(f, 0, ready(f, 0), grad_buffer_for(f, 0));
    float *grads = u != pinned_unit(f) ? grad_buffer_for(f, u) : f->gbuf[GRAD_BUFFERS - 1];
    set_unit(f, u, params, grads);
    prefetch(f, next);
    if (f->adapters) before_backward(f->adapters, u, next);
}

static void after_backward(void *p, int u, int next) {
    keel_fsdp *f = p;
    (void)next;
    start_reduce_scatter(f, u);
    /* SHARD_GRAD_OP holds every unit through a step anyway: a frozen base,
     * which no step changes, stays gathered for the next (until a fill) */
    if (!(frozen(f) && f->strategy == KEEL_FSDP_SHARD_GRAD_OP)) release(f, u);
    if (f->adapters) after_backward(f->adapters, u, next);
}

/* The slots' memory: a node window's (collective over the group; none where
 * its ranks do not share a machine, or the backend has no windows), else
 * the backend's. */
static void alloc_slots(keel_fsdp *f, bool node_window) {
    size_t *bytes = keel_xmalloc(sizeof(size_t) * (size_t)f->n_slots, "fsdp slots");
    for (int s = 0; s < f->n_slots; s++) {
        bool own = f->strategy == KEEL_FSDP_SHARD_GRAD_OP; /* slot s holds unit s */
        int64_t floats = whole_units(&f->plan, f->bf16) ? 0 : own ? f->plan.units[s].padded : f->plan.max_padded;
        bytes[s] = f->elem * (size_t)floats; /* none: whole units, or an adapter set's empty unit */
    }
    if (node_window && f->be->window_create && !whole_units(&f->plan, f->bf16))
        f->win = f->be->window_create(f->group, bytes, f->n_slots);
    for (int s = 0; s < f->n_slots; s++)
        f->slots[s] = f->win ? keel_comm_window_slot(f->win, s) : bytes[s] ? f->be->alloc(bytes[s], "fsdp unit slot") : NULL;
    keel_free(bytes);
}

/* The unit gradient buffers: a node window's where the slots are one's too
 * and reductions are fp32 (collective over the group), else the backend's. */
static void alloc_grad_buffers(keel_fsdp *f, bool node_window) {
    int n = frozen(f) ? 0 : buffers_needed(f->plan.tied); /* the pinned unit's, only when tied */
    size_t part = sizeof(float) * (size_t)f->plan.max_padded;
    if (node_window && n > 0 && f->win && !f->reduce_bf16) {
        size_t bytes[GRAD_BUFFERS];
        for (int b = 0; b < n; b++) bytes[b] = part * (size_t)keel_comm_size(f->group);
        f->gwin = f->be->window_create(f->group, bytes, n);
    }
    for (int b = 0; b < n; b++)
        f->gbuf[b] = f->gwin ? (float *)((char *)keel_comm_window_slot(f->gwin, b) + part * (size_t)f->rank)
                             : f->be->alloc(part, "fsdp unit grads");
}

static void free_grad_buffers(keel_fsdp *f) {
    for (int b = 0; b < GRAD_BUFFERS; b++) {
        if (!f->gwin) f->be->free(f->gbuf[b]);
        f->gbuf[b] = NULL;
    }
    if (f->gwin) f->be->window_free(f->gwin);
    f->gwin = NULL;
}

static void free_slots(keel_fsdp *f) {
    if (f->win) f->be->window_free(f->win);
    else
        for (int s = 0; s < f->n_slots; s++) f->be->free(f->slots[s]);
    f->win = NULL;
}

/* The shard group and the replica group of this rank for a strategy. */
static keel_status make_groups(keel_fsdp *f, keel_comm *world, int shard_group_size) {
    int W = keel_comm_size(world), r = keel_comm_rank(world);
    keel_parallel_dims dims;
    char why[256];
    if (keel_parallel_dims_resolve(f->strategy, shard_group_size, W, &dims, why, sizeof why) != KEEL_OK) {
        keel_errorf("%s", why);
        return KEEL_ERR_INPUT;
    }
    switch (f->strategy) {
    case KEEL_FSDP_FULL_SHARD:
    case KEEL_FSDP_SHARD_GRAD_OP:
        f->group = world;
        return KEEL_OK;
    case KEEL_FSDP_NO_SHARD: /* every rank its own shard group of one; all ranks are replicas */
        f->own_group = true;
        f->replicas = world;
        return keel_comm_split(world, r, 0, &f->group);
    case KEEL_FSDP_HYBRID_SHARD: { /* groups of K consecutive ranks; replicas: one place in every group */
        int K = dims.shard_ranks;
        f->own_group = true;
        keel_status st = keel_comm_split(world, r / K, r, &f->group);
        if (st == KEEL_OK && dims.replicas > 1) st = keel_comm_split(world, r % K, r, &f->replicas);
        return st;
    }
    }
    return KEEL_ERR_INTERNAL;
}

keel_status keel_fsdp_build(keel_model *model, keel_comm *world, keel_fsdp_strategy strategy,
                            int shard_group_size, keel_fsdp **out) {
    return keel_fsdp_build_set(model, world, strategy, shard_group_size, KEEL_FSDP_SET_MODEL, out);
}

keel_status keel_fsdp_build_set(keel_model *model, keel_comm *world, keel_fsdp_strategy strategy,
                                int shard_group_size, keel_fsdp_set set, keel_fsdp **out) {
    KEEL_CHECK((set == KEEL_FSDP_SET_MODEL) == !keel_model_lora_layout(model),
               "the model's set for a model without adapters, the base and adapters for one with them");
    keel_fsdp *f = keel_xcalloc(sizeof *f, "fsdp");
    f->model = model;
    f->set = set;
    f->be = keel_model_backend(model);
    f->strategy = strategy;
    keel_status st = make_groups(f, world, shard_group_size);
    if (st != KEEL_OK) {
        keel_free(f);
        return st;
    }
    f->lay = set == KEEL_FSDP_SET_ADAPTERS ? keel_model_lora_layout(model) : keel_model_get_layout(model);
    f->rank = keel_comm_rank(f->group);
    keel_fsdp_plan_init(&f->plan, f->lay, keel_comm_size(f->group));
    if (set == KEEL_FSDP_SET_ADAPTERS) f->plan.tied = false; /* the embedding's unit holds no adapter */
    const keel_backend *be = f->be;
    f->master = be->alloc(sizeof(float) * (size_t)f->plan.shard_total, "fsdp master shard");
    if (!frozen(f)) f->grads = be->alloc(sizeof(float) * (size_t)f->plan.shard_total, "fsdp grad shard");
    f->grads_unset = keel_xcalloc(sizeof(bool) * (size_t)f->plan.n_units, "fsdp units");
    f->bf16 = keel_model_is_bf16(model) && set != KEEL_FSDP_SET_ADAPTERS; /* adapters compute in fp32 */
    f->elem = f->bf16 ? sizeof(keel_bf16) : sizeof(float);
    f->n_slots = strategy == KEEL_FSDP_SHARD_GRAD_OP ? f->plan.n_units : buffers_needed(f->plan.tied);
    f->slots = keel_xcalloc(sizeof(void *) * (size_t)f->n_slots, "fsdp slots");
    f->slot_unit = keel_xmalloc(sizeof(int) * (size_t)f->n_slots, "fsdp slots");
    f->slot_awaited = keel_xcalloc(sizeof(bool) * (size_t)f->n_slots, "fsdp slots");
    for (int s = 0; s < f->n_slots; s++) f->slot_unit[s] = -1;
    alloc_slots(f, false);
    for (int b = 0; b < GRAD_BUFFERS; b++) f->gstate[b].unit = -1;
    alloc_grad_buffers(f, false);
    f->unit_slot = keel_xmalloc(sizeof(int) * (size_t)f->plan.n_units, "fsdp unit slots");
    for (int u = 0; u < f->plan.n_units; u++) f->unit_slot[u] = -1;
    f->gather_req = keel_xcalloc(sizeof(keel_backend_req *) * (size_t)f->plan.n_units, "fsdp reqs");
    f->prefetch = true;
    if (set != KEEL_FSDP_SET_ADAPTERS) { /* the adapters' hooks run from their base's */
        keel_model_hooks hooks = {f, before_forward, after_forward, before_backward, after_backward};
        keel_model_set_hooks(model, &hooks);
    }
    *out = f;
    return KEEL_OK;
}

void keel_fsdp_chain_adapters(keel_fsdp *base, keel_fsdp *adapters) {
    KEEL_CHECK(base->set == KEEL_FSDP_SET_FROZEN_BASE && adapters->set == KEEL_FSDP_SET_ADAPTERS &&
                   base->model == adapters->model && base->plan.n_units == adapters->plan.n_units,
               "adapters chained to their model's frozen base");
    base->adapters = adapters;
    adapters->prefetch = base->prefetch;
}

void keel_fsdp_free(keel_fsdp *f) {
    if (!f) return;
    keel_fsdp_finish_grads(f);
    keel_fsdp_invalidate(f);
    if (f->set != KEEL_FSDP_SET_ADAPTERS) keel_model_set_hooks(f->model, NULL);
    const keel_backend *be = f->be;
    free_slots(f);
    keel_free(f->slots);
    keel_free(f->slot_awaited);
    keel_free(f->slot_unit);
    free_grad_buffers(f);
    for (int b = 0; b < GRAD_BUFFERS; b++) be->free(f->gbuf16[b]);
    be->free(f->master);
    be->free(f->grads);
    keel_free(f->grads_unset);
    keel_free(f->host_unit);
    keel_free(f->unit_slot);
    keel_free(f->gather_req);
    keel_fsdp_plan_free(&f->plan);
    be->release_group(f->group);
    if (f->replicas) be->release_group(f->replicas);
    if (f->own_group) {
        keel_comm_free(f->group);
        if (f->replicas && f->strategy == KEEL_FSDP_HYBRID_SHARD) keel_comm_free(f->replicas);
    }
    keel_free(f);
}

int keel_fsdp_shard_rank(const keel_fsdp *f) { return f->rank; }

void keel_fsdp_set_prefetch(keel_fsdp *f, bool prefetch) {
    f->prefetch = prefetch;
    if (f->adapters) f->adapters->prefetch = prefetch;
}

bool keel_fsdp_set_node_windows(keel_fsdp *f, bool on) {
    keel_fsdp_invalidate(f); /* nothing gathered, so nothing lost */
    for (int b = 0; b < GRAD_BUFFERS; b++) drain(f, b); /* nor a gradient on its way */
    if (on != (f->win != NULL)) {
        free_slots(f);
        alloc_slots(f, on);
        free_grad_buffers(f);
        alloc_grad_buffers(f, on);
    }
    bool used = f->win != NULL;
    if (f->adapters) used = keel_fsdp_set_node_windows(f->adapters, on) || used;
    return used;
}

void keel_fsdp_set_reduce_bf16(keel_fsdp *f, bool bf16) {
    keel_fsdp_finish_grads(f);
    f->reduce_bf16 = bf16;
    if (bf16 && f->gwin) { /* a window's reduce-scatter sums fp32: the buffers become this rank's */
        free_grad_buffers(f);
        alloc_grad_buffers(f, false);
    }
    for (int b = 0; b < GRAD_BUFFERS && bf16; b++)
        if (f->gbuf[b] && !f->gbuf16[b]) {
            f->gbuf16[b] = f->be->alloc(sizeof(keel_bf16) * (size_t)f->plan.max_padded, "fsdp bf16 grads");
        }
}

const keel_fsdp_plan *keel_fsdp_get_plan(const keel_fsdp *f) { return &f->plan; }
float *keel_fsdp_master(keel_fsdp *f) { return f->master; }
float *keel_fsdp_grads(keel_fsdp *f) { return f->grads; }

/* Range by range into the shard; through a host buffer a unit's shard at a
 * time when the host cannot write the backend's memory. */
keel_status keel_fsdp_fill(keel_fsdp *f, keel_param_source fill, void *ctx) {
    const keel_backend *be = f->be;
    be->zero(f->master, sizeof(float) * (size_t)f->plan.shard_total);
    float *host = be->host_memory ? NULL : keel_xmalloc(sizeof(float) * (size_t)max_shard(&f->plan), "fsdp fill");
    keel_status st = KEEL_OK;
    for (int u = 0; u < f->plan.n_units && st == KEEL_OK; u++) {
        int64_t begin, len;
        keel_fsdp_shard_range(&f->plan, u, f->rank, &begin, &len);
        float *dst = f->master + f->plan.units[u].shard_offset;
        if (len <= 0) continue;
        st = fill(ctx, begin, len, host ? host : dst);
        if (st == KEEL_OK && host) be->to_device(dst, host, sizeof(float) * (size_t)len);
    }
    keel_free(host);
    keel_fsdp_invalidate(f);
    return st;
}

void keel_fsdp_invalidate(keel_fsdp *f) {
    for (int u = 0; u < f->plan.n_units; u++) free_slot(f, u);
}

keel_status keel_fsdp_gather_unit(keel_fsdp *f, int u, const float **out) {
    for (int b = 0; b < GRAD_BUFFERS; b++) { /* between steps: every gradient sent; then buffer 0 is free */
        KEEL_CHECK(f->gstate[b].unit < 0 || f->gstate[b].req, "gather_unit inside a backward");
        drain(f, b);
    }
    const keel_fsdp_unit *x = &f->plan.units[u];
    /* through gradient buffer 0 (a frozen set has none: one unit buffer,
     * made the first time). In a window, once every rank has summed its
     * slice of this rank's part, no rank reads it until this rank publishes
     * it again: a claim, and it is scratch until the next. */
    if (!f->gbuf[0]) f->gbuf[0] = f->be->alloc(sizeof(float) * (size_t)f->plan.max_padded, "fsdp unit gather");
    float *buf = f->gbuf[0];
    if (f->gwin) f->be->window_claim(f->gwin, 0), f->be->window_release(f->gwin, 0);
    keel_backend_req *req = NULL;
    if (x->padded > 0) {
        f->be->iallgather(f->group, f->master + x->shard_offset, buf, (size_t)x->shard, KEEL_COMM_F32, &req);
        f->be->wait(req);
    }
    *out = buf;
    if (f->be->host_memory) return KEEL_OK;
    if (!f->host_unit) f->host_unit = keel_xmalloc(sizeof(float) * (size_t)f->plan.max_padded, "fsdp unit on the host");
    f->be->to_host(f->host_unit, buf, sizeof(float) * (size_t)x->padded);
    *out = f->host_unit;
    return KEEL_OK;
}

void keel_fsdp_zero_grads(keel_fsdp *f) {
    if (frozen(f)) return;
    for (int u = 0; u < f->plan.n_units; u++) f->grads_unset[u] = true;
}

keel_status keel_fsdp_finish_grads(keel_fsdp *f) {
    for (int b = 0; b < GRAD_BUFFERS; b++) drain(f, b);
    if (frozen(f)) return KEEL_OK;
    for (int u = 0; u < f->plan.n_units; u++) /* no gradient came this step: 0 */
        if (f->grads_unset[u]) {
            f->be->zero(f->grads + f->plan.units[u].shard_offset, sizeof(float) * (size_t)f->plan.units[u].shard);
            f->grads_unset[u] = false;
        }
    /* Replicas hold the same shard: sum their gradients (NO_SHARD, HYBRID_SHARD). */
    if (!f->replicas || keel_comm_size(f->replicas) == 1) return KEEL_OK;
    const keel_backend *be = f->be;
    size_t n = (size_t)f->plan.shard_total;
    if (!f->reduce_bf16) {
        be->allreduce(f->replicas, f->grads, n, KEEL_COMM_F32);
        return KEEL_OK;
    }
    /* in pieces through a (free, every reduce-scatter drained) gradient
     * buffer: nothing allocated in a step */
    size_t piece = (size_t)f->plan.max_padded;
    for (size_t at = 0; at < n; at += piece) {
        size_t len = n - at < piece ? n - at : piece;
        be->f32_to_bf16(f->gbuf16[0], f->grads + at, (int64_t)len);
        be->allreduce(f->replicas, f->gbuf16[0], len, KEEL_COMM_BF16);
        be->bf16_to_f32(f->grads + at, f->gbuf16[0], (int64_t)len);
    }
    return KEEL_OK;
}

keel_status keel_fsdp_grad_sumsq(keel_fsdp *f, double *sumsq) {
    *sumsq = f->be->sumsq(f->grads, f->plan.shard_total);
    return keel_comm_allreduce_scalar(f->group, sumsq, KEEL_COMM_SUM);
}

/* Bytes of the gathered-parameter slots and of the unit gradient buffers with
 * their reduce-scatter results; a frozen set has one unit buffer instead, for gather_unit. */
static void transient_parts(const keel_fsdp_plan *plan, keel_fsdp_strategy strategy, bool frozen,
                            bool bf16_params, bool bf16_reduce, bool grad_window, int64_t *gathered,
                            int64_t *unit_grads) {
    int n = buffers_needed(plan->tied);
    int64_t slots = n * plan->max_padded;
    if (strategy == KEEL_FSDP_SHARD_GRAD_OP) {
        slots = 0;
        for (int u = 0; u < plan->n_units; u++) slots += plan->units[u].padded;
    }
    if (whole_units(plan, bf16_params)) slots = 0;
    *gathered = (bf16_params ? 2 : 4) * slots;
    *unit_grads = frozen ? 4 * plan->max_padded : (bf16_reduce ? 6 : 4) * n * plan->max_padded; /* results in place */
    /* in a node window a rank also reads its slice of every other rank's
     * buffers, pages its RSS counts */
    if (grad_window && !frozen)
        *unit_grads += 4 * n * (plan->max_padded / plan->shard_ranks) * (plan->shard_ranks - 1);
}

int64_t keel_fsdp_transient_bytes(const keel_fsdp_plan *plan, keel_fsdp_strategy strategy,
                                  bool bf16_params, bool bf16_reduce, bool node_windows) {
    int64_t gathered, unit_grads;
    bool grad_window = node_windows && !bf16_reduce && plan->shard_ranks > 1;
    transient_parts(plan, strategy, false, bf16_params, bf16_reduce, grad_window, &gathered, &unit_grads);
    return gathered + unit_grads;
}

int64_t keel_fsdp_frozen_transient_bytes(const keel_fsdp_plan *plan, keel_fsdp_strategy strategy, bool bf16_params) {
    int64_t gathered, unit_buffer;
    transient_parts(plan, strategy, true, bf16_params, false, false, &gathered, &unit_buffer);
    return gathered + unit_buffer;
}

void keel_fsdp_get_stats(keel_fsdp *f, keel_fsdp_stats *out) {
    f->device_wait_s += f->be->comm_stall_s();
    *out = (keel_fsdp_stats){
        .device_wait_s = f->device_wait_s,
        .master_bytes = 4 * f->plan.shard_total,
        .grad_bytes = frozen(f) ? 0 : 4 * f->plan.shard_total,
        .gather_wait_s = f->gather_wait_s,
        .reduce_wait_s = f->reduce_wait_s,
    };
    transient_parts(&f->plan, f->strategy, frozen(f), f->bf16, f->reduce_bf16, f->gwin != NULL, &out->gathered_bytes,
                    &out->unit_grad_bytes);
}
