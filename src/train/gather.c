/* train/gather.c: the whole model's parameters on the host, a piece at a
 * time — from the model itself in a single process (through a host buffer
 * where the backend's memory is not the host's), or unit by unit through
 * FSDP's gathers — for the final weights and for samples. With train.lora
 * each unit is its frozen base with the adapters merged in: the model as it
 * computes. */
#include <string.h>

#include "train/gather.h"

/* Unit u's parameters on the host, in *out (valid until the next call):
 * gathered under FSDP, else copied; with LoRA the adapters merged in
 * (scratch: host buffers of the largest unit and the largest unit's
 * adapters). Collective under FSDP. */
static keel_status unit_on_host(trainer *t, int u, float *scratch, float *adapter_scratch, const float **out) {
    const keel_model_layout *lay = keel_model_get_layout(t->model), *lora = keel_model_lora_layout(t->model);
    int64_t n = lay->unit_size[u];
    const float *base = NULL, *adapters = NULL;
    keel_status st = KEEL_OK;
    if (t->fsdp) {
        st = keel_fsdp_gather_unit(t->base ? t->base : t->fsdp, u, &base);
        if (lora) {
            keel_status ast = keel_fsdp_gather_unit(t->fsdp, u, &adapters);
            if (st == KEEL_OK) st = ast;
        }
    } else {
        t->be->to_host(scratch, keel_model_params(t->model) + lay->unit_offset[u], sizeof(float) * (size_t)n);
        base = scratch;
        if (lora) {
            t->be->to_host(adapter_scratch, keel_model_lora_params(t->model) + lora->unit_offset[u],
                           sizeof(float) * (size_t)lora->unit_size[u]);
            adapters = adapter_scratch;
        }
    }
    if (st != KEEL_OK || !lora) {
        *out = base;
        return st;
    }
    if (base != scratch) memcpy(scratch, base, sizeof(float) * (size_t)n);
    keel_lora_merge_unit(lay, lora, u, scratch, adapters);
    *out = scratch;
    return KEEL_OK;
}

keel_status trainer_each_param(trainer *t, bool every_rank, trainer_piece_fn fn, void *ctx) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    bool mine = every_rank || t->leader;
    keel_status st = KEEL_OK;
    if (!t->fsdp && !mine) return KEEL_OK;
    if (!t->fsdp && !keel_model_lora_layout(t->model)) { /* the model's own parameters */
        const float *params = keel_model_params(t->model);
        if (t->be->host_memory) return fn(ctx, 0, params, lay->n_params);
        enum { CHUNK = 1 << 24 }; /* through a host buffer, a piece at a time */
        int64_t chunk = lay->n_params < CHUNK ? lay->n_params : CHUNK;
        float *host = keel_xmalloc(sizeof(float) * (size_t)chunk, "parameters on the host");
        for (int64_t at = 0; at < lay->n_params && st == KEEL_OK; at += chunk) {
            int64_t len = lay->n_params - at < chunk ? lay->n_params - at : chunk;
            t->be->to_host(host, params + at, sizeof(float) * (size_t)len);
            st = fn(ctx, at, host, len);
        }
        keel_free(host);
        return st;
    }
    const keel_model_layout *lora = keel_model_lora_layout(t->model);
    int64_t most = 0, most_a = 1;
    for (int u = 0; u < lay->n_units; u++) {
        most = lay->unit_size[u] > most ? lay->unit_size[u] : most;
        if (lora) most_a = lora->unit_size[u] > most_a ? lora->unit_size[u] : most_a;
    }
    float *scratch = keel_xmalloc(sizeof(float) * (size_t)most, "a unit on the host");
    float *adapter_scratch = t->fsdp ? NULL : keel_xmalloc(sizeof(float) * (size_t)most_a, "a unit's adapters");
    for (int u = 0; u < lay->n_units; u++) { /* under FSDP every rank gathers every unit, whatever fn said */
        const float *unit;
        keel_status got = unit_on_host(t, u, scratch, adapter_scratch, &unit);
        if (mine && st == KEEL_OK) st = got != KEEL_OK ? got : fn(ctx, lay->unit_offset[u], unit, lay->unit_size[u]);
    }
    keel_free(scratch);
    keel_free(adapter_scratch);
    return st;
}
