/* plan: `keel plan` — before a run, what each rank of it would hold and how
 * fast it would go on a cluster, for every FSDP strategy, and the fastest
 * plan that fits. Memory comes from fsdp's plan of what the code allocates
 * (keel_fsdp_memory_plan_run), time from the model's FLOPs at an MFU plus an
 * alpha-beta model of the collectives, replayed in the order the FSDP
 * runtime issues and waits for them (prefetch included).
 *
 *     keel_device dev;
 *     if (keel_plan_device("h100", &dev) != KEEL_OK) return 2;   // presets; "cpu" measures
 *     keel_cluster cl = {.nodes = 16, .per_node = 8, .device = dev};
 *     keel_plan p;
 *     keel_plan_make(&cfg, &cl, &p);        // every strategy + the recommendation
 *     keel_plan_print(stdout, &p);           // or keel_plan_json(&p)
 *     return p.best.fits ? 0 : 1;            // nothing fits: exit 1
 */
#ifndef KEEL_PLAN_H
#define KEEL_PLAN_H

#include <stdio.h>

#include "keel/fsdp.h"

typedef enum { KEEL_DEVICE_CPU, KEEL_DEVICE_H100, KEEL_DEVICE_H200, KEEL_DEVICE_A100 } keel_device_kind;

/* What one rank runs on. A GPU is one device per rank; the cpu is this
 * machine, whose cores, memory and memory bandwidth its ranks share. */
typedef struct {
    keel_device_kind kind;
    char name[16];
    double peak_flops_bf16, peak_flops_fp32; /* dense FLOP/s of a GPU, of the node's cores (cpu) */
    double memory_bytes;       /* a GPU's memory; cpu: MemAvailable of the node */
    double mem_bw;             /* bytes/s of a GPU (HBM) or of the node (cpu): passes over the shard, local copies */
    double adamw_params_per_s; /* AdamW's rate (a GPU: HBM-bound; cpu: the node's, measured) */
    double intra_bw;           /* bytes/s each rank moves inside a node (NVLink; MPI shared memory) */
    double intra_latency_s;    /* one ring hop inside a node */
    double net_bw;             /* bytes/s of one node's network, after protocol efficiency */
    double net_gbps;           /* the same as line rate, Gbit/s (--net) */
    double net_latency_s;      /* one ring hop between nodes */
    double overlap_cost;       /* share of communication hidden behind compute that still
                                  costs compute time (cpu: 1, its comm thread runs on the cores) */
    double mfu;                /* model FLOPs / peak the compute reaches */
    double runtime_bytes;      /* a rank's fixed cost on a GPU (context, NCCL); cpu: memory.c's */
    int cores;                 /* cpu: cores of the node */
    const char *mfu_source;    /* "--mfu", "preset", "measured ..." */
    const char *intra_source;  /* "--intra", "preset", "measured ..." */
    char detail[256];          /* how the cpu numbers were measured */
    double measured_share;     /* cpu: the share of its cores the measuring process got (a busy machine: < 1) */
} keel_device;

/* A device preset by name: h100 (SXM), h200, a100 (SXM 80 GB), or cpu (this
 * machine: the MFU yardstick keel_peak_flops, MemAvailable; its MFU, memory
 * bandwidth and shared-memory bandwidth come from keel_plan_measure_cpu and
 * the caller). Unknown names are one error line naming --device
 * (KEEL_ERR_INPUT). */
keel_status keel_plan_device(const char *name, keel_device *out);
/* --net: a node's network line rate in Gbit/s (80% of it is what rings get). */
void keel_plan_device_set_net(keel_device *d, double gbps);
/* --intra, or a measured bandwidth: what a rank moves inside a node, Gbit/s
 * (line rate: 80% of it; measured: as measured, efficiency = 1). */
void keel_plan_device_set_intra(keel_device *d, double gbps, double efficiency, const char *source);
/* cpu: time keel's own forward + backward of a one-block slice of cfg's
 * model (micro-batch, then sequence shortened to keep it near a second)
 * with the threads one of per_node ranks gets, times the ranks that run at
 * once, with the block timed apart from the rest, and
 * AdamW and a streaming pass over a few million parameters; sets dev->mfu
 * (unless mfu_given: the node's rate, which its ranks share),
 * dev->adamw_params_per_s and dev->mem_bw. */
keel_status keel_plan_measure_cpu(const keel_config *cfg, bool mfu_given, int per_node, keel_device *dev);

typedef struct {
    int nodes, per_node;
    keel_device device;
} keel_cluster;

/* Exposed communication by where the compute thread waits. */
typedef enum {
    KEEL_WAIT_FIRST_GATHER,  /* the first unit's all-gather of each micro-batch */
    KEEL_WAIT_STEADY,        /* a prefetched gather or a reduce-scatter that compute outran */
    KEEL_WAIT_LAST_REDUCE,   /* the reduce-scatters still running when backward ends */
    KEEL_WAIT_REPLICAS,      /* NO_SHARD / HYBRID: the gradient all-reduce across replicas */
    KEEL_WAIT_SCALARS,       /* the loss and gradient-norm all-reduces */
    KEEL_WAITS
} keel_plan_wait;

/* One plan: a strategy with its shard group, units, checkpointing and micro-batch. */
typedef struct {
    keel_fsdp_strategy strategy;
    int shard_group;           /* ranks a unit is split over */
    int replicas;              /* ranks holding the same shard */
    keel_unit_kind unit;       /* fsdp.unit */
    int checkpoint_blocks;     /* fsdp.activation_checkpointing as a count, 0..L */
    int micro_batch, grad_accum;
    keel_fsdp_memory memory;   /* per rank, by category */
    int64_t peak_bytes;        /* their total */
    int64_t activations_without, activations_with; /* activation checkpointing of no block / every block */
    int64_t budget_bytes;      /* what a rank may use */
    bool fits;
    /* seconds per optimizer step */
    double compute_s;          /* forward + backward at the MFU */
    double recompute_s;        /* checkpointing's second forward of the recomputed blocks */
    double optimizer_s;        /* AdamW and the shard's other passes (memory-bound) */
    double comm_s;             /* every collective, back to back */
    double exposed_s;          /* the compute thread waiting on them */
    double waits_s[KEEL_WAITS];/* exposed_s by where */
    double hidden_s;           /* comm_s - exposed_s: overlapped with compute */
    double overlap_s;          /* overlap_cost x hidden_s */
    double step_s, tokens_per_s, mfu;
    double scaling_efficiency; /* tokens/s / (ranks x a rank's tokens/s without communication) */
} keel_plan_entry;

#define KEEL_PLAN_STRATEGIES 4
typedef struct {
    const keel_config *cfg;
    keel_cluster cluster;
    int ranks;
    int64_t n_params;
    double flops_per_token;
    bool bf16;
    keel_plan_entry strategies[KEEL_PLAN_STRATEGIES]; /* the config's micro-batch and checkpointing */
    keel_plan_entry best;      /* the fastest that fits (over strategy, checkpointing, micro-batch);
                                  when none fits, the smallest, with fits false */
} keel_plan;

/* Every strategy at cfg's micro-batch and checkpointing, and the best plan
 * over strategies, checkpointing and micro-batches that fits: the most
 * tokens/s, and of plans within 1% of it the least memory. Micro-batches
 * split the config's sequences per rank and step (micro_batch_size x
 * grad_accum_steps), so the global batch stays the config's.
 * HYBRID_SHARD's shard group is a node (per_node ranks). cfg must outlive p. */
void keel_plan_make(const keel_config *cfg, const keel_cluster *cl, keel_plan *p);
/* One plan (for tests and keel_plan_make). */
void keel_plan_entry_make(const keel_config *cfg, const keel_cluster *cl, keel_plan_entry *e);

/* The plan as text: memory by category per strategy, time per step, and the
 * recommendation. */
void keel_plan_print(FILE *out, const keel_plan *p);
/* The plan as JSON (schema in docs/planning.md); caller frees. */
char *keel_plan_json(const keel_plan *p);

#endif
