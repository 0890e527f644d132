/* plan/report.c: a plan as a table for people and as JSON for programs. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>

#include "keel/plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

static double gbps(double bytes_per_s) { return bytes_per_s * 8 / 1e9; }

/* ---- text ------------------------------------------------------------------ */

static void print_cluster(FILE *out, const keel_plan *p) {
    const keel_cluster *cl = &p->cluster;
    const keel_device *d = &cl->device;
    double peak = p->bf16 ? d->peak_flops_bf16 : d->peak_flops_fp32;
    fprintf(out, "keel plan: %s: %.3f B parameters, %.3e training FLOPs per token, seq %d, %s GEMMs\n",
            p->cfg->source ? p->cfg->source : "config", p->n_params / 1e9, p->flops_per_token,
            p->cfg->model.max_seq_len, keel_dtype_name(p->cfg->fsdp.mixed_precision));
    if (d->kind == KEEL_DEVICE_CPU)
        fprintf(out, "cluster: %d node(s) x %d rank(s) = %d, on this machine's cpu: %d cores, peak %.0f GF/s, "
                "%.1f GiB available (%.2f GiB per rank), memory %.1f GB/s, AdamW %.0f M parameters/s\n", cl->nodes,
                cl->per_node, p->ranks, d->cores, peak / 1e9, d->memory_bytes / GIB, d->memory_bytes / cl->per_node / GIB,
                d->mem_bw / 1e9, d->adamw_params_per_s / 1e6);
    else
        fprintf(out, "cluster: %d node(s) x %d %s = %d ranks: %.0f TF/s %s peak, %.1f GiB, %.2f TB/s of HBM per GPU "
                "in AdamW\n",
                cl->nodes, cl->per_node, d->name, p->ranks, peak / 1e12, p->bf16 ? "bf16" : "fp32",
                d->memory_bytes / GIB, d->mem_bw / 1e12);
    fprintf(out, "  compute: MFU %.2f (%s%s%s)\n", d->mfu, d->mfu_source, d->detail[0] ? ": " : "", d->detail);
    fprintf(out, "  inside a node: %.1f Gbit/s per rank (%s), %.0f us per ring hop\n", gbps(d->intra_bw),
            d->intra_source, d->intra_latency_s * 1e6);
    fprintf(out, "  between nodes: %.0f Gbit/s per node (%.0f in rings), %.0f us per ring hop\n", d->net_gbps,
            gbps(d->net_bw), d->net_latency_s * 1e6);
    fprintf(out, "  communication hidden behind compute still costs %.2f of its time%s\n", d->overlap_cost,
            d->kind == KEEL_DEVICE_CPU ? " (the comm thread runs on the cores compute uses)" : " (NCCL's SMs)");
    if (!p->bf16 && d->kind != KEEL_DEVICE_CPU)
        fprintf(out, "  note: fp32 GEMMs run at the fp32 peak; --set fsdp.mixed_precision=bf16 uses tensor cores\n");
}

typedef double (*entry_value)(const keel_plan_entry *e);
#define FIELD(name, expr) \
    static double name(const keel_plan_entry *e) { return (double)(expr); }
FIELD(v_compute, e->compute_s)
FIELD(v_recompute, e->recompute_s)
FIELD(v_optimizer, e->optimizer_s)
FIELD(v_comm, e->comm_s)
FIELD(v_first, e->waits_s[KEEL_WAIT_FIRST_GATHER])
FIELD(v_steady, e->waits_s[KEEL_WAIT_STEADY])
FIELD(v_last, e->waits_s[KEEL_WAIT_LAST_REDUCE])
FIELD(v_replicas, e->waits_s[KEEL_WAIT_REPLICAS])
FIELD(v_scalars, e->waits_s[KEEL_WAIT_SCALARS])
FIELD(v_hidden, e->hidden_s)
FIELD(v_overlap, e->overlap_s)
FIELD(v_step, e->step_s)

static void row(FILE *out, const char *label, const keel_plan *p, double scale, const char *fmt, entry_value f) {
    fprintf(out, "  %-28s", label);
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) fprintf(out, fmt, f(&p->strategies[s]) * scale);
    fprintf(out, "\n");
}

static void print_memory(FILE *out, const keel_plan *p) {
    bool gib = p->strategies[0].budget_bytes >= 8 * GIB;
    double unit = gib ? GIB : MIB;
    fprintf(out, "\nmemory per rank (%s)            ", gib ? "GiB" : "MiB");
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) fprintf(out, "%15s", keel_strategy_name(p->strategies[s].strategy));
    fprintf(out, "\n  %-28s", "shard group x replicas");
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) {
        char g[32];
        snprintf(g, sizeof g, "%d x %d", p->strategies[s].shard_group, p->strategies[s].replicas);
        fprintf(out, "%15s", g);
    }
    fprintf(out, "\n");
    keel_fsdp_memory_item items[KEEL_PLAN_STRATEGIES][KEEL_FSDP_MEMORY_CATEGORIES];
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) keel_fsdp_memory_items(&p->strategies[s].memory, items[s]);
    for (int i = 0; i < KEEL_FSDP_MEMORY_CATEGORIES; i++) {
        fprintf(out, "  %-28s", items[0][i].what);
        for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) fprintf(out, "%15.2f", items[s][i].bytes / unit);
        fprintf(out, "\n");
    }
    fprintf(out, "  %-28s", "peak");
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) fprintf(out, "%15.2f", p->strategies[s].peak_bytes / unit);
    fprintf(out, "\n  %-28s", "fits in");
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) {
        char f[32];
        snprintf(f, sizeof f, "%s %.2f", p->strategies[s].fits ? "yes" : "NO", p->strategies[s].budget_bytes / unit);
        fprintf(out, "%15s", f);
    }
    const keel_plan_entry *e = &p->strategies[0];
    fprintf(out, "\n  activations: %.2f without checkpointing, %.2f with (micro-batch %d)\n",
            e->activations_without / unit, e->activations_with / unit, e->micro_batch);
}

/* The time rows, top to bottom: what each is. */
static const struct {
    const char *label;
    entry_value value;
} TIME_ROWS[] = {
    {"compute (forward + backward)", v_compute}, {"recompute (checkpointing)", v_recompute},
    {"optimizer and shard passes", v_optimizer}, {"communication, all of it", v_comm},
    {"exposed: first gather", v_first},          {"  comm outran compute", v_steady},
    {"  last reduce-scatters", v_last},          {"  all-reduce over replicas", v_replicas},
    {"  loss and norm", v_scalars},              {"hidden behind compute", v_hidden},
    {"  what hiding costs", v_overlap},          {"step", v_step},
};

static void print_time(FILE *out, const keel_plan *p) {
    bool ms = p->strategies[0].step_s < 10;
    fprintf(out, "\ntime per optimizer step (%s)\n", ms ? "ms" : "s");
    for (size_t i = 0; i < sizeof TIME_ROWS / sizeof TIME_ROWS[0]; i++)
        row(out, TIME_ROWS[i].label, p, ms ? 1e3 : 1, ms ? "%15.1f" : "%15.3f", TIME_ROWS[i].value);
    fprintf(out, "  %-28s", "tokens/s (all ranks)");
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) fprintf(out, "%15.0f", p->strategies[s].tokens_per_s);
    fprintf(out, "\n  %-28s", "scaling efficiency");
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) fprintf(out, "%15.3f", p->strategies[s].scaling_efficiency);
    fprintf(out, "\n  %-28s", "MFU");
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) fprintf(out, "%15.3f", p->strategies[s].mfu);
    fprintf(out, "\n");
}

/* fsdp.activation_checkpointing of an entry as the config takes it, and in words. */
static const char *checkpointing_value(const keel_plan *p, const keel_plan_entry *e, char *buf, size_t n) {
    int K = e->checkpoint_blocks;
    keel_config_format_checkpointing(K == p->cfg->model.n_layers ? KEEL_CHECKPOINT_ALL : K, buf, n);
    return buf;
}

static const char *checkpointing_words(const keel_plan *p, const keel_plan_entry *e, char *buf, size_t n) {
    int K = e->checkpoint_blocks, L = p->cfg->model.n_layers;
    if (K == 0 || K == L) snprintf(buf, n, "%s", K ? "on" : "off");
    else snprintf(buf, n, "on for %d of %d blocks", K, L);
    return buf;
}

void keel_plan_print(FILE *out, const keel_plan *p) {
    print_cluster(out, p);
    const keel_plan_entry *e = &p->strategies[0];
    char ac[48];
    fprintf(out, "as configured: micro-batch %d x %d accumulation, activation checkpointing %s, prefetch %s\n",
            e->micro_batch, e->grad_accum, checkpointing_words(p, e, ac, sizeof ac),
            p->cfg->fsdp.prefetch ? "on" : "off");
    print_memory(out, p);
    print_time(out, p);
    const keel_plan_entry *b = &p->best;
    if (!b->fits) {
        fprintf(out, "\nNO PLAN FITS: the smallest, %s with %s units and activation checkpointing %s at micro-batch "
                "%d, needs %.2f GiB per rank and a rank has %.2f; add ranks or use a device with more memory\n",
                keel_strategy_name(b->strategy), keel_unit_kind_name(b->unit), checkpointing_words(p, b, ac, sizeof ac),
                b->micro_batch,
                b->peak_bytes / GIB, b->budget_bytes / GIB);
        return;
    }
    fprintf(out, "\nrecommended: %s (shard group %d x %d replicas%s), %s units, activation checkpointing %s, "
            "micro-batch %d x %d: %.2f GiB of %.2f per rank, %.4g s per step, %.0f tokens/s, scaling efficiency %.3f\n",
            keel_strategy_name(b->strategy), b->shard_group, b->replicas,
            b->strategy == KEEL_FSDP_HYBRID_SHARD ? ", a node each" : "", keel_unit_kind_name(b->unit),
            checkpointing_words(p, b, ac, sizeof ac),
            b->micro_batch, b->grad_accum, b->peak_bytes / GIB, b->budget_bytes / GIB, b->step_s, b->tokens_per_s,
            b->scaling_efficiency);
    fprintf(out, "  --set fsdp.strategy=%s --set fsdp.unit=%s --set fsdp.activation_checkpointing=%s "
            "--set train.micro_batch_size=%d --set train.grad_accum_steps=%d%s", keel_strategy_name(b->strategy),
            keel_unit_kind_name(b->unit), checkpointing_value(p, b, ac, sizeof ac),
            b->micro_batch, b->grad_accum,
            b->strategy == KEEL_FSDP_HYBRID_SHARD ? " --set fsdp.shard_group_size=" : "");
    if (b->strategy == KEEL_FSDP_HYBRID_SHARD) fprintf(out, "%d", b->shard_group);
    fprintf(out, "\n");
}

/* ---- JSON ------------------------------------------------------------------ */

static cJSON *entry_json(const keel_plan_entry *e, int L) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "strategy", keel_strategy_name(e->strategy));
    cJSON_AddNumberToObject(o, "shard_group", e->shard_group);
    cJSON_AddNumberToObject(o, "replicas", e->replicas);
    cJSON_AddStringToObject(o, "unit", keel_unit_kind_name(e->unit));
    /* as the config takes it: true (every block), false or the count */
    if (e->checkpoint_blocks == 0 || e->checkpoint_blocks == L)
        cJSON_AddBoolToObject(o, "activation_checkpointing", e->checkpoint_blocks == L);
    else
        cJSON_AddNumberToObject(o, "activation_checkpointing", e->checkpoint_blocks);
    cJSON_AddNumberToObject(o, "micro_batch", e->micro_batch);
    cJSON_AddNumberToObject(o, "grad_accum", e->grad_accum);
    cJSON *mem = cJSON_AddObjectToObject(o, "memory");
    keel_fsdp_memory_item items[KEEL_FSDP_MEMORY_CATEGORIES];
    keel_fsdp_memory_items(&e->memory, items);
    for (int i = 0; i < KEEL_FSDP_MEMORY_CATEGORIES; i++)
        cJSON_AddNumberToObject(mem, items[i].name, (double)items[i].bytes);
    cJSON_AddNumberToObject(o, "peak_bytes", (double)e->peak_bytes);
    cJSON_AddNumberToObject(o, "budget_bytes", (double)e->budget_bytes);
    cJSON_AddBoolToObject(o, "fits", e->fits);
    cJSON_AddNumberToObject(o, "activation_bytes_without_checkpointing", (double)e->activations_without);
    cJSON_AddNumberToObject(o, "activation_bytes_with_checkpointing", (double)e->activations_with);
    cJSON *t = cJSON_AddObjectToObject(o, "time");
    cJSON_AddNumberToObject(t, "compute_s", e->compute_s);
    cJSON_AddNumberToObject(t, "recompute_s", e->recompute_s);
    cJSON_AddNumberToObject(t, "optimizer_s", e->optimizer_s);
    cJSON_AddNumberToObject(t, "comm_s", e->comm_s);
    cJSON_AddNumberToObject(t, "exposed_s", e->exposed_s);
    static const char *WAIT_NAMES[KEEL_WAITS] = {"first_gather_s", "steady_s", "last_reduce_scatter_s",
                                                 "replica_allreduce_s", "scalars_s"};
    cJSON *w = cJSON_AddObjectToObject(t, "exposed");
    for (int i = 0; i < KEEL_WAITS; i++) cJSON_AddNumberToObject(w, WAIT_NAMES[i], e->waits_s[i]);
    cJSON_AddNumberToObject(t, "hidden_s", e->hidden_s);
    cJSON_AddNumberToObject(t, "overlap_cost_s", e->overlap_s);
    cJSON_AddNumberToObject(t, "step_s", e->step_s);
    cJSON_AddNumberToObject(o, "tokens_per_s", e->tokens_per_s);
    cJSON_AddNumberToObject(o, "mfu", e->mfu);
    cJSON_AddNumberToObject(o, "scaling_efficiency", e->scaling_efficiency);
    return o;
}

static cJSON *cluster_json(const keel_plan *p) {
    const keel_cluster *cl = &p->cluster;
    const keel_device *d = &cl->device;
    bool cpu = d->kind == KEEL_DEVICE_CPU;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "device", d->name);
    cJSON_AddNumberToObject(o, "nodes", cl->nodes);
    cJSON_AddNumberToObject(o, "per_node", cl->per_node);
    cJSON_AddNumberToObject(o, "ranks", p->ranks);
    double peak = p->bf16 ? d->peak_flops_bf16 : d->peak_flops_fp32;
    cJSON_AddNumberToObject(o, "peak_flops_per_rank", cpu ? peak / cl->per_node : peak);
    cJSON_AddNumberToObject(o, "memory_bytes", d->memory_bytes);
    cJSON_AddBoolToObject(o, "memory_shared_by_node", cpu);
    cJSON_AddNumberToObject(o, "mfu", d->mfu);
    cJSON_AddStringToObject(o, "mfu_source", d->mfu_source);
    cJSON_AddNumberToObject(o, "memory_bandwidth_bytes_per_s", d->mem_bw);
    cJSON_AddNumberToObject(o, "intra_gbps", gbps(d->intra_bw));
    cJSON_AddStringToObject(o, "intra_source", d->intra_source);
    cJSON_AddNumberToObject(o, "intra_latency_s", d->intra_latency_s);
    cJSON_AddNumberToObject(o, "net_gbps", d->net_gbps);
    cJSON_AddNumberToObject(o, "net_effective_gbps", gbps(d->net_bw));
    cJSON_AddNumberToObject(o, "net_latency_s", d->net_latency_s);
    cJSON_AddNumberToObject(o, "overlap_cost", d->overlap_cost);
    if (d->detail[0]) cJSON_AddStringToObject(o, "measured", d->detail);
    if (d->measured_share > 0) cJSON_AddNumberToObject(o, "measured_cpu_share", d->measured_share);
    return o;
}

char *keel_plan_json(const keel_plan *p) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "config", p->cfg->source ? p->cfg->source : "");
    cJSON *m = cJSON_AddObjectToObject(o, "model");
    cJSON_AddNumberToObject(m, "n_params", (double)p->n_params);
    cJSON_AddNumberToObject(m, "flops_per_token", p->flops_per_token);
    cJSON_AddNumberToObject(m, "seq_len", p->cfg->model.max_seq_len);
    cJSON_AddStringToObject(m, "mixed_precision", keel_dtype_name(p->cfg->fsdp.mixed_precision));
    cJSON_AddItemToObject(o, "cluster", cluster_json(p));
    cJSON *list = cJSON_AddArrayToObject(o, "strategies");
    int L = p->cfg->model.n_layers;
    for (int s = 0; s < KEEL_PLAN_STRATEGIES; s++) cJSON_AddItemToArray(list, entry_json(&p->strategies[s], L));
    cJSON_AddItemToObject(o, "recommendation", entry_json(&p->best, L));
    cJSON_AddBoolToObject(o, "fits", p->best.fits);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}
