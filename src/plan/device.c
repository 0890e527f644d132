/* plan/device.c: what a rank runs on — the GPU presets with their published
 * numbers and stated assumptions, and this machine's cpu, measured. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/plan.h"

/* Line rate to what a collective gets out of it: NCCL-class rings reach about
 * 80% of NVLink's and InfiniBand/EFA's bandwidth on large messages. */
#define LINK_EFFICIENCY 0.8
#define MIB (1024.0 * 1024.0)
#define ADAMW_BYTES 28.0 /* per parameter: reads param, grad, m, v; writes param, m, v */

/* The presets (docs/planning.md, `keel plan`): dense bf16 tensor-core and fp32 peaks,
 * memory as nvidia-smi reports it, HBM bandwidth, NVLink per GPU per
 * direction, the default network per node (8 NICs), ring-hop latencies,
 * an MFU from published FSDP runs of Llama-sized models, and what a GPU
 * rank spends outside keel's own buffers (CUDA context, NCCL's channel
 * buffers, cuBLAS workspace). */
typedef struct {
    keel_device_kind kind;
    const char *name;
    double bf16_tflops, fp32_tflops, memory_mib, hbm_tbps, nvlink_gbs, net_gbps, mfu;
} preset;
static const preset PRESETS[] = {
    {KEEL_DEVICE_H100, "h100", 989, 67, 81559, 3.35, 450, 3200, 0.40},
    {KEEL_DEVICE_H200, "h200", 989, 67, 143771, 4.8, 450, 3200, 0.40},
    {KEEL_DEVICE_A100, "a100", 312, 19.5, 81920, 2.039, 300, 1600, 0.50},
};
#define GPU_INTRA_LATENCY_S 2e-6
#define GPU_NET_LATENCY_S 8e-6
#define GPU_OVERLAP_COST 0.25  /* NCCL's ring kernels hold ~32 of an H100's 132 SMs while they run */
#define GPU_RUNTIME_BYTES (2.0 * 1024 * MIB)

/* This machine: a cluster of its like would talk over 10 Gbit/s TCP. */
#define CPU_NET_GBPS 10
#define CPU_NET_LATENCY_S 30e-6
#define CPU_INTRA_LATENCY_S 20e-6 /* a hop through the comm thread and MPI's shared memory */

static void set_net(keel_device *d, double gbps) {
    d->net_gbps = gbps;
    d->net_bw = gbps * 1e9 / 8 * LINK_EFFICIENCY;
}

static void gpu(const preset *p, keel_device *d) {
    *d = (keel_device){.kind = p->kind,
                       .peak_flops_bf16 = p->bf16_tflops * 1e12,
                       .peak_flops_fp32 = p->fp32_tflops * 1e12,
                       .memory_bytes = p->memory_mib * MIB,
                       .mem_bw = p->hbm_tbps * 1e12 * LINK_EFFICIENCY,
                       .adamw_params_per_s = p->hbm_tbps * 1e12 * LINK_EFFICIENCY / ADAMW_BYTES,
                       .intra_bw = p->nvlink_gbs * 1e9 * LINK_EFFICIENCY,
                       .intra_latency_s = GPU_INTRA_LATENCY_S,
                       .net_latency_s = GPU_NET_LATENCY_S,
                       .overlap_cost = GPU_OVERLAP_COST,
                       .mfu = p->mfu,
                       .runtime_bytes = GPU_RUNTIME_BYTES,
                       .mfu_source = "preset",
                       .intra_source = "preset"};
    snprintf(d->name, sizeof d->name, "%s", p->name);
    set_net(d, p->net_gbps);
}

static void cpu(keel_device *d) {
    *d = (keel_device){.kind = KEEL_DEVICE_CPU,
                       .memory_bytes = (double)keel_mem_available_bytes(),
                       .intra_latency_s = CPU_INTRA_LATENCY_S,
                       .net_latency_s = CPU_NET_LATENCY_S,
                       .overlap_cost = 1.0,
                       .runtime_bytes = -1,
                       .mfu_source = "measured",
                       .intra_source = "measured"};
    snprintf(d->name, sizeof d->name, "cpu");
    set_net(d, CPU_NET_GBPS);
    d->cores = keel_kernels_init(0); /* the peaks of all the node's cores */
    d->peak_flops_fp32 = keel_peak_flops(false);
    d->peak_flops_bf16 = keel_peak_flops(true);
    keel_kernels_shutdown();
}

keel_status keel_plan_device(const char *name, keel_device *out) {
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++)
        if (!strcmp(name, PRESETS[i].name)) {
            gpu(&PRESETS[i], out);
            return KEEL_OK;
        }
    if (!strcmp(name, "cpu")) {
        cpu(out);
        return KEEL_OK;
    }
    keel_errorf("--device '%s': unknown device; use cpu, h100, h200 or a100", name);
    return KEEL_ERR_INPUT;
}

void keel_plan_device_set_net(keel_device *d, double gbps) { set_net(d, gbps); }

void keel_plan_device_set_intra(keel_device *d, double gbps, double efficiency, const char *source) {
    d->intra_bw = gbps * 1e9 / 8 * efficiency;
    d->intra_source = source;
}
