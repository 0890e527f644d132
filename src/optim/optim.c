/* optim/optim.c: AdamW on a parameter range with per-tensor weight-decay masks. */
#include <math.h>

#include "keel/kernels.h"
#include "keel/optim.h"

typedef struct {
    int64_t begin, len; /* in the optimizer's buffer */
    bool decay;
} segment;

struct keel_optim {
    keel_train_config cfg;
    const keel_backend *be;
    int64_t len;
    float *m, *v;        /* (len) */
    segment *segs;
    int n_segs;
};

keel_status keel_optim_build_ranges(const keel_train_config *cfg, const keel_model_layout *lay,
                                    const keel_param_range *ranges, int n_ranges,
                                    int64_t buffer_len, const keel_backend *be, keel_optim **out) {
    keel_optim *o = keel_xcalloc(sizeof *o, "optimizer");
    o->cfg = *cfg;
    o->be = be ? be : keel_backend_cpu();
    o->len = buffer_len;
    o->m = o->be->alloc(sizeof(float) * (size_t)(buffer_len > 0 ? buffer_len : 1), "AdamW m");
    o->v = o->be->alloc(sizeof(float) * (size_t)(buffer_len > 0 ? buffer_len : 1), "AdamW v");
    o->segs = keel_xcalloc(sizeof(segment) * (size_t)(lay->n_tensors * (n_ranges > 0 ? n_ranges : 1)),
                           "optimizer segments");
    /* One segment per (range, tensor) overlap: the decay flag is per tensor. */
    for (int r = 0; r < n_ranges; r++) {
        const keel_param_range *pr = &ranges[r];
        KEEL_CHECK(pr->buffer_offset >= 0 && pr->buffer_offset + pr->len <= buffer_len,
                   "range %d outside the buffer", r);
        for (int i = 0; i < lay->n_tensors; i++) {
            const keel_tensor_info *t = &lay->tensors[i];
            int64_t t_end = t->offset + t->rows * t->cols, r_end = pr->begin + pr->len;
            int64_t lo = t->offset > pr->begin ? t->offset : pr->begin;
            int64_t hi = t_end < r_end ? t_end : r_end;
            if (lo >= hi) continue;
            o->segs[o->n_segs++] = (segment){pr->buffer_offset + (lo - pr->begin), hi - lo,
                                             !t->is_norm_or_embedding || cfg->decay_norms_and_embeddings};
        }
    }
    *out = o;
    return KEEL_OK;
}

keel_status keel_optim_build(const keel_train_config *cfg, const keel_model_layout *lay,
                             int64_t begin, int64_t len, const keel_backend *be, keel_optim **out) {
    keel_param_range whole = {begin, len, 0};
    return keel_optim_build_ranges(cfg, lay, &whole, 1, len, be, out);
}

void keel_optim_free(keel_optim *opt) {
    if (!opt) return;
    opt->be->free(opt->m);
    opt->be->free(opt->v);
    keel_free(opt->segs);
    keel_free(opt);
}

int64_t keel_optim_state_bytes(const keel_optim *opt) { return 2 * opt->len * (int64_t)sizeof(float); }
float *keel_optim_m(keel_optim *opt) { return opt->m; }
float *keel_optim_v(keel_optim *opt) { return opt->v; }
const keel_backend *keel_optim_backend(const keel_optim *opt) { return opt->be; }
double keel_optim_sumsq(const keel_optim *opt, const float *grads) { return opt->be->sumsq(grads, opt->len); }

double keel_lr_at(const keel_train_config *cfg, int step) {
    if (step < cfg->warmup_steps) return cfg->lr * (step + 1) / cfg->warmup_steps;
    int decay_steps = cfg->steps - cfg->warmup_steps;
    if (decay_steps <= 1) return cfg->lr;
    double progress = (double)(step - cfg->warmup_steps) / (decay_steps - 1);
    if (progress > 1) progress = 1;
    return cfg->min_lr + 0.5 * (cfg->lr - cfg->min_lr) * (1.0 + cos(M_PI * progress));
}

double keel_clip_scale(double grad_norm, double clip) {
    if (clip <= 0 || !(grad_norm > clip)) return 1.0;
    return clip / (grad_norm + 1e-6);
}

void keel_optim_update(keel_optim *opt, float *params, float *grads, int step, double lr,
                       double grad_scale) {
    for (int i = 0; i < opt->n_segs; i++) {
        const segment *s = &opt->segs[i];
        keel_adamw_step st = {.lr = (float)lr, .beta1 = (float)opt->cfg.beta1,
                              .beta2 = (float)opt->cfg.beta2, .eps = (float)opt->cfg.adam_eps,
                              .weight_decay = s->decay ? (float)opt->cfg.weight_decay : 0.0f,
                              .grad_scale = (float)grad_scale,
                              .t = step + 1};
        opt->be->adamw_update(params + s->begin, grads + s->begin, opt->m + s->begin,
                          opt->v + s->begin, s->len, &st);
    }
}
