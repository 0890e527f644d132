/* train/gather.c: the whole model's parameters on the host, a piece at a
 * time — from the model itself in a single process (through a host buffer
 * where the backend's memory is not the host's), or unit by unit through
 * FSDP's gathers — for the final weights and for samples. */
#include "train/gather.h"

keel_status trainer_each_param(trainer *t, bool every_rank, trainer_piece_fn fn, void *ctx) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    bool mine = every_rank || t->leader;
    keel_status st = KEEL_OK;
    if (t->fsdp) {
        const keel_fsdp_plan *plan = keel_fsdp_get_plan(t->fsdp);
        int64_t at = 0;
        for (int u = 0; u < plan->n_units; u++) { /* every rank gathers every unit, whatever fn said */
            const float *unit;
            keel_status gathered = keel_fsdp_gather_unit(t->fsdp, u, &unit);
            if (mine && st == KEEL_OK) st = gathered != KEEL_OK ? gathered : fn(ctx, at, unit, plan->units[u].logical);
            at += plan->units[u].logical;
        }
        return st;
    }
    if (!mine) return KEEL_OK;
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
