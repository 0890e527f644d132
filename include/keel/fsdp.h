/* fsdp: how parameters are sharded (DESIGN §3). This header holds the shard
 * plan — pure arithmetic, no communication: each unit's flat length padded to
 * a multiple of (ranks in the shard group × KEEL_FSDP_ALIGN), the equal slice
 * each rank owns, and where those slices sit in a rank's flat shard buffer.
 * The runtime (gather, free, reduce-scatter, prefetch) builds on it.
 *
 *     keel_fsdp_plan plan;
 *     keel_fsdp_plan_init(&plan, &layout, world_size);
 *     float *master = calloc(plan.shard_total, sizeof(float));   // this rank's fp32 shard
 *     for (int u = 0; u < plan.n_units; u++) {
 *         int64_t begin, len;                                     // canonical params it holds
 *         keel_fsdp_shard_range(&plan, u, rank, &begin, &len);
 *         memcpy(master + plan.units[u].shard_offset, full + begin, len * sizeof(float));
 *     }
 */
#ifndef KEEL_FSDP_H
#define KEEL_FSDP_H

#include "keel/model.h"
#include "keel/optim.h"

/* ---- the parallel dimensions (dims.c) ----------------------------------------
 * What fsdp.strategy, fsdp.shard_group_size and a world size mean, resolved
 * in one place: the runtime's groups, the memory plan, keel plan and the run
 * directory's checks all ask it. A shard group is the ranks one copy of the
 * state is split over; the replicas are the shard groups, each holding the
 * whole state. */
typedef struct {
    int world_size;  /* ranks */
    int shard_ranks; /* ranks in a shard group: all (FULL_SHARD, SHARD_GRAD_OP), one (NO_SHARD), K (HYBRID_SHARD) */
    int replicas;    /* shard groups: world_size / shard_ranks */
} keel_parallel_dims;

/* Resolve the dimensions of `world_size` ranks (>= 1). HYBRID_SHARD's group
 * is shard_group_size ranks, 0 meaning 2; a world of one rank is one shard
 * rank and one replica whatever the strategy. A group size that does not
 * divide the world is KEEL_ERR_INPUT with `why` (why_n bytes) saying so and
 * how to fix it; nothing is printed. */
keel_status keel_parallel_dims_resolve(keel_fsdp_strategy strategy, int shard_group_size, int world_size,
                                       keel_parallel_dims *out, char *why, size_t why_n);

/* Shards are multiples of 16 floats: every rank's slice starts on a 64-byte
 * boundary of a gathered unit, so AVX-512 and streaming stores apply. */
#define KEEL_FSDP_ALIGN 16

typedef struct {
    int64_t offset;       /* the unit's first parameter in the canonical vector */
    int64_t logical;      /* parameters in the unit */
    int64_t padded;       /* logical rounded up to a multiple of shard_ranks * KEEL_FSDP_ALIGN */
    int64_t shard;        /* padded / shard_ranks: each rank's slice of the unit */
    int64_t shard_offset; /* where this unit's slice starts in a rank's flat shard buffer */
} keel_fsdp_unit;

typedef struct keel_fsdp_plan {
    int n_units;
    keel_fsdp_unit *units;  /* (n_units) */
    int shard_ranks;        /* ranks a unit is split over */
    int64_t shard_total;    /* floats in a rank's flat shard buffer (sum of unit shards) */
    int64_t max_padded;     /* floats in the largest gathered unit */
    bool tied;              /* tied embeddings: unit 0 stays gathered through a step */
} keel_fsdp_plan;

void keel_fsdp_plan_init(keel_fsdp_plan *plan, const keel_model_layout *lay, int shard_ranks);
void keel_fsdp_plan_free(keel_fsdp_plan *plan);

/* The canonical parameters [*begin, *begin + *len) that `rank`'s slice of
 * unit u holds; the rest of the slice (if any) is padding. *len may be 0. */
void keel_fsdp_shard_range(const keel_fsdp_plan *plan, int unit, int rank, int64_t *begin,
                           int64_t *len);

/* The ranges of `rank`'s shard buffer that hold real parameters, one per unit
 * with len > 0, for keel_optim_build_ranges. Returns the count; *out is
 * malloc'd (keel_free). */
int keel_fsdp_param_ranges(const keel_fsdp_plan *plan, int rank, keel_param_range **out);

/* Persistent bytes per rank of FULL_SHARD fp32 state: master weights, gradient,
 * AdamW m and v — 16 bytes per padded parameter / shard_ranks. */
int64_t keel_fsdp_persistent_bytes(const keel_fsdp_plan *plan);
/* ---- memory (memory.c) ------------------------------------------------------
 * One rank's bytes for a config on world_size ranks, by category, computed
 * before anything is allocated: `keel train --dry-run`, the memory check
 * before a run starts, `keel health`'s memory check and `keel plan`. The
 * categories add up to the rank's peak: everything below lives from the
 * first step to the end of the run (the final weights are gathered through
 * the runtime's own unit-gradient buffer). */
typedef struct {
    int64_t params, grads, optimizer; /* persistent fp32 state (sharded under FSDP) */
    int64_t gathered;                 /* compute copies: gathered units, unit gradients, bf16 copies */
    int64_t activations;              /* one micro-batch's, as the model keeps them */
    int64_t checkpoint_buffer;        /* the async save's host buffer (on a rank that writes a file) */
    int64_t snapshot;                 /* the in-memory snapshot's two slots in /dev/shm (mapped: in RSS),
                                         and a buddy's replica's two on more than one node */
    int64_t accumulation;             /* gradient accumulation buffers (none: see memory.c) */
    int64_t workspaces;               /* token batch, NO_SHARD/HYBRID's bf16 all-reduce copy */
    int64_t runtime;                  /* fixed cost of a process: libraries, OpenMPI, kernel scratch, data */
} keel_fsdp_memory;
void keel_fsdp_memory_plan(const keel_config *cfg, int world_size, keel_fsdp_memory *out);
/* The same, saying how the model runs: distributed (a rank of `keel train
 * --nproc N`, FSDP even when N is 1) or not (one process, `keel train`
 * without --nproc; world_size 1), on how many nodes (over more than one, each
 * rank also keeps a buddy's snapshot). keel_fsdp_memory_plan is this with
 * distributed = world_size > 1 on one node. */
void keel_fsdp_memory_plan_run(const keel_config *cfg, int world_size, bool distributed, int nodes,
                               keel_fsdp_memory *out);
int64_t keel_fsdp_memory_total(const keel_fsdp_memory *m);
/* The categories in one fixed order, for everything that prints them:
 * name (a JSON key), what (a short label) and bytes. */
#define KEEL_FSDP_MEMORY_CATEGORIES 10
typedef struct {
    const char *name, *what;
    int64_t bytes;
} keel_fsdp_memory_item;
void keel_fsdp_memory_items(const keel_fsdp_memory *m,
                            keel_fsdp_memory_item out[KEEL_FSDP_MEMORY_CATEGORIES]);

/* Bytes of the runtime's unit-sized buffers: gathered parameters (bf16 with
 * bf16_params; each rank's slice is rounded into its place, gathered in place) and unit gradients
 * with their reduce-scatter results (and bf16 copies with bf16_reduce); with node_windows (the
 * group on one machine), a rank's slices of the other ranks' gradient buffers too (fp32 reductions). */
int64_t keel_fsdp_transient_bytes(const keel_fsdp_plan *plan, keel_fsdp_strategy strategy,
                                  bool bf16_params, bool bf16_reduce, bool node_windows);
/* The same for a frozen set (a LoRA base): the slots, and one unit-sized
 * fp32 buffer that gathers a unit for the final weights; no gradients. */
int64_t keel_fsdp_frozen_transient_bytes(const keel_fsdp_plan *plan, keel_fsdp_strategy strategy, bool bf16_params);


/* ---- runtime ---------------------------------------------------------------
 *
 *     keel_fsdp *f;
 *     keel_fsdp_build(model, world, KEEL_FSDP_FULL_SHARD, 0, &f);  // installs the model hooks
 *     keel_fsdp_fill(f, fill_fn, ctx);           // this rank's canonical ranges
 *     keel_fsdp_zero_grads(f);
 *     keel_model_forward(...); keel_model_backward(...);   // gathers, frees, reduce-scatters
 *     keel_fsdp_finish_grads(f);                 // wait for the last reduce-scatters
 *     ... clip with keel_fsdp_grad_sumsq (all-reduced), AdamW on master/grads ...
 *     keel_fsdp_invalidate(f);                   // gathered copies are stale now
 *
 * Each unit is all-gathered into one of a few unit-sized slots before it is
 * used — fp32, or bf16 for a model built with bf16 GEMMs (each rank rounds its
 * fp32 master slice as the gather starts) — the next unit's gather is
 * started at once (prefetch), and the slot is released after the unit's
 * forward; backward gathers again in reverse. A unit's full gradient goes to a unit-sized buffer whose
 * reduce-scatter starts as soon as the unit's backward is done and is added
 * into this rank's gradient shard; replicas of a shard (NO_SHARD, HYBRID)
 * then all-reduce it. With tied embeddings unit 0 stays gathered for the
 * whole step (the head reads it too).
 */
#include "keel/comm.h"

typedef struct keel_fsdp keel_fsdp;

/* The parameter set a runtime shards. With LoRA (keel_model_options.lora) a
 * model has two: its frozen base — gathered as a model's are, never given a
 * gradient, never reduce-scattered, no gradient shard — and its adapters
 * (keel_model_lora_layout), sharded the same way, always fp32, with their
 * gradients and optimizer. The adapters' runtime is chained to its base's
 * (keel_fsdp_chain_adapters), whose model hooks run it unit by unit. */
typedef enum { KEEL_FSDP_SET_MODEL, KEEL_FSDP_SET_FROZEN_BASE, KEEL_FSDP_SET_ADAPTERS } keel_fsdp_set;

/* Shard `model` over world with a strategy (shard_group_size: HYBRID_SHARD's
 * K, keel_parallel_dims_resolve). The shard plan is over the shard group:
 * all ranks (FULL_SHARD, SHARD_GRAD_OP), one (NO_SHARD) or K (HYBRID). A
 * group size that does not divide the world is an input error. */
keel_status keel_fsdp_build(keel_model *model, keel_comm *world, keel_fsdp_strategy strategy,
                            int shard_group_size, keel_fsdp **out);
/* The same for one set of a LoRA model (keel_fsdp_build is the model's set). */
keel_status keel_fsdp_build_set(keel_model *model, keel_comm *world, keel_fsdp_strategy strategy,
                                int shard_group_size, keel_fsdp_set set, keel_fsdp **out);
/* The base's hooks run the adapters' after its own, unit by unit (free the
 * adapters' runtime first). */
void keel_fsdp_chain_adapters(keel_fsdp *base, keel_fsdp *adapters);
void keel_fsdp_free(keel_fsdp *f);
/* This rank's index in its shard group: the slice of the plan it holds. */
int keel_fsdp_shard_rank(const keel_fsdp *f);
/* Prefetch (default on): start the next unit's all-gather as soon as the
 * current one is ready. Off: gather each unit only when it is needed. */
void keel_fsdp_set_prefetch(keel_fsdp *f, bool prefetch);
/* Collective over the shard group, with nothing gathered (after build):
 * on, the gathered-unit slots become a node window (keel/comm.h) where the
 * group's ranks share a machine and the backend's memory is the host's —
 * one gathered copy on the machine, and a gather copies nothing; off (the
 * default), every rank's own slots and the backend's all-gathers. The
 * results are bit for bit the same. Applies to chained adapters too; true
 * when some slots are a window. */
bool keel_fsdp_set_node_windows(keel_fsdp *f, bool on);
/* fsdp.reduce_dtype bf16: round unit gradients to bf16 for the reduce-scatter
 * (and the replicas' all-reduce); sums combine pairs in fp32 (keel/comm.h). The
 * gradient shard and everything after stay fp32. Default fp32. */
void keel_fsdp_set_reduce_bf16(keel_fsdp *f, bool bf16);
const keel_fsdp_plan *keel_fsdp_get_plan(const keel_fsdp *f);
/* This rank's fp32 master shard and gradient shard (plan.shard_total each),
 * in the model's backend's memory (keel_model_backend): every array of the
 * runtime is, and every operation on one is a backend call. */
float *keel_fsdp_master(keel_fsdp *f);
float *keel_fsdp_grads(keel_fsdp *f);
/* Fill this rank's master shard from a source, range by range (padding
 * stays zero): initialisation and init_from read only the shard, never a
 * whole model. Returns the first failing read's status. */
keel_status keel_fsdp_fill(keel_fsdp *f, keel_param_source read, void *ctx);
/* Collective over the shard group: unit u's fp32 master parameters on every
 * rank, in *out (plan.units[u].padded floats; the first .logical are the
 * unit's canonical parameters) — one unit at a time, so saving the final
 * weights never needs the whole model in one process. *out is the runtime's
 * first unit-gradient buffer (outstanding reduce-scatters are finished
 * first), or a host copy of it when the backend's memory is not the host's:
 * host memory either way, valid until the next gather_unit or backward. */
keel_status keel_fsdp_gather_unit(keel_fsdp *f, int u, const float **out);
/* Start an optimizer step: the gradient shard counts as zero. Every
 * micro-batch's backward reduce-scatters its unit gradients into the shard,
 * which sums them (a unit's first result is copied, not added to zeros
 * written for it): accumulation costs no full-size gradient buffers (more
 * reductions than PyTorch's no_sync, whose memory is one full gradient per
 * unit). */
void keel_fsdp_zero_grads(keel_fsdp *f);
/* The master shard changed (optimizer step, load): drop every gathered unit. */
void keel_fsdp_invalidate(keel_fsdp *f);
/* Wait for every outstanding reduce-scatter; then the grad shard is complete. */
keel_status keel_fsdp_finish_grads(keel_fsdp *f);
/* Global sum of squared gradients (all-reduced over the shard group; replicas
 * hold the same values). */
keel_status keel_fsdp_grad_sumsq(keel_fsdp *f, double *sumsq);

typedef struct {
    int64_t master_bytes, grad_bytes;  /* persistent fp32 shards */
    int64_t gathered_bytes;            /* unit slots for gathered parameters */
    int64_t unit_grad_bytes;           /* unit-sized gradient buffers (+ bf16 copies) */
    double gather_wait_s, reduce_wait_s; /* compute thread blocked on communication (the host's clock) */
    double device_wait_s; /* a device's compute stream waiting for collectives (its clock; 0 on the cpu) */
} keel_fsdp_stats;
/* Reads the backend's stall timings first (comm_stall_s): call it between
 * steps, when the device's work is done. */
void keel_fsdp_get_stats(keel_fsdp *f, keel_fsdp_stats *out);

#endif
