/* train/packed.c: this rank's optimizer state in its checkpoint file's
 * layout (train/packed.h). */
#include "train/packed.h"

void trainer_packed_init(trainer_packed *p, keel_model *model, keel_optim *opt, keel_fsdp *fsdp) {
    *p = (trainer_packed){0};
    const keel_model_layout *lay = keel_model_lora_layout(model) ? keel_model_lora_layout(model)
                                                                 : keel_model_get_layout(model);
    p->be = keel_optim_backend(opt);
    p->arrays[1] = keel_optim_m(opt);
    p->arrays[2] = keel_optim_v(opt);
    if (fsdp) {
        p->plan = keel_fsdp_get_plan(fsdp);
        p->arrays[0] = keel_fsdp_master(fsdp);
        p->n_ranges = keel_fsdp_param_ranges(p->plan, keel_fsdp_shard_rank(fsdp), &p->ranges);
    } else {
        keel_fsdp_plan_init(&p->own_plan, lay, 1);
        p->plan = &p->own_plan;
        p->arrays[0] = keel_model_lora_layout(model) ? keel_model_lora_params(model) : keel_model_params(model);
        p->ranges = keel_xmalloc(sizeof(keel_param_range) * (size_t)lay->n_units, "ranges");
        for (int u = 0; u < lay->n_units; u++) /* an adapter set's empty units hold nothing */
            if (lay->unit_size[u] > 0)
                p->ranges[p->n_ranges++] = (keel_param_range){lay->unit_offset[u], lay->unit_size[u], lay->unit_offset[u]};
    }
}

void trainer_packed_free(trainer_packed *p) {
    if (p->plan == &p->own_plan) keel_fsdp_plan_free(&p->own_plan);
    keel_free(p->ranges);
    *p = (trainer_packed){0};
}

int64_t trainer_packed_floats(const trainer_packed *p) { return KEEL_CKPT_ARRAYS * p->plan->shard_total; }

/* The packed position of canonical range r (inside one unit). */
static int64_t packed_offset(const trainer_packed *p, const keel_param_range *r) {
    for (int u = 0; u < p->plan->n_units; u++) {
        const keel_fsdp_unit *x = &p->plan->units[u];
        if (r->begin >= x->offset && r->begin < x->offset + x->logical)
            return x->shard_offset + (r->begin - x->offset) % x->shard;
    }
    KEEL_CHECK(false, "range at %lld is in no unit", (long long)r->begin);
    return 0;
}

void trainer_packed_copy_out(const trainer_packed *p, float *dst, bool async) {
    for (int a = 0; a < KEEL_CKPT_ARRAYS; a++)
        for (int i = 0; i < p->n_ranges; i++) {
            const keel_param_range *r = &p->ranges[i];
            (async ? p->be->to_host_async : p->be->to_host)(dst + (int64_t)a * p->plan->shard_total + packed_offset(p, r),
                                                           p->arrays[a] + r->buffer_offset, sizeof(float) * (size_t)r->len);
        }
}

int trainer_packed_pieces(const trainer_packed *p, keel_snap_piece *out) {
    KEEL_CHECK(p->be->host_memory, "packed pieces of a device's arrays");
    int n = 0;
    for (int a = 0; a < KEEL_CKPT_ARRAYS; a++)
        for (int i = 0; i < p->n_ranges; i++) {
            const keel_param_range *r = &p->ranges[i];
            out[n++] = (keel_snap_piece){(int64_t)a * p->plan->shard_total + packed_offset(p, r),
                                         p->arrays[a] + r->buffer_offset, r->len};
        }
    return n;
}

void trainer_packed_copy_in(const trainer_packed *p, const float *src) {
    for (int a = 0; a < KEEL_CKPT_ARRAYS; a++)
        for (int i = 0; i < p->n_ranges; i++) {
            const keel_param_range *r = &p->ranges[i];
            p->be->to_device(p->arrays[a] + r->buffer_offset,
                             src + (int64_t)a * p->plan->shard_total + packed_offset(p, r), sizeof(float) * (size_t)r->len);
        }
}

void trainer_packed_clear(const trainer_packed *p) {
    for (int a = 0; a < KEEL_CKPT_ARRAYS; a++)
        for (int i = 0; i < p->n_ranges; i++)
            p->be->zero(p->arrays[a] + p->ranges[i].buffer_offset, sizeof(float) * (size_t)p->ranges[i].len);
}

/* Range r of array a from a checkpoint into the live array: straight in on
 * the host, else through a host buffer a piece at a time. */
static keel_status read_range(const trainer_packed *p, keel_ckpt *ck, int a, const keel_param_range *r) {
    float *live = p->arrays[a] + r->buffer_offset;
    if (p->be->host_memory) return keel_ckpt_read(ck, a, r->begin, r->len, live);
    enum { PIECE = 1 << 24 };
    int64_t piece = r->len < PIECE ? r->len : PIECE;
    float *host = keel_xmalloc(sizeof(float) * (size_t)(piece > 0 ? piece : 1), "checkpoint read");
    keel_status st = KEEL_OK;
    for (int64_t at = 0; at < r->len && st == KEEL_OK; at += piece) {
        int64_t len = r->len - at < piece ? r->len - at : piece;
        st = keel_ckpt_read(ck, a, r->begin + at, len, host);
        if (st == KEEL_OK) p->be->to_device(live + at, host, sizeof(float) * (size_t)len);
    }
    keel_free(host);
    return st;
}

keel_status trainer_packed_read(const trainer_packed *p, keel_ckpt *ck) {
    keel_status st = keel_ckpt_verify_ranges(ck, p->ranges, p->n_ranges);
    for (int a = 0; a < KEEL_CKPT_ARRAYS && st == KEEL_OK; a++)
        for (int r = 0; r < p->n_ranges && st == KEEL_OK; r++) st = read_range(p, ck, a, &p->ranges[r]);
    return st;
}
