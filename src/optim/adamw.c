/* optim/adamw.c: AdamW on a parameter range with per-tensor weight-decay masks. */
#include <math.h>

#include "keel/kernels.h"
#include "keel/optim.h"

typedef struct {
    int64_t begin, len; /* relative to the optimizer's range */
    bool decay;
} segment;

struct keel_optim {
    keel_train_config cfg;
    int64_t len;
    float *m, *v;        /* (len) */
    segment *segs;
    int n_segs;
};

keel_status keel_optim_build(const keel_train_config *cfg, const keel_model_layout *lay,
                             int64_t begin, int64_t len, keel_optim **out) {
    keel_optim *o = keel_xcalloc(sizeof *o, "optimizer");
    o->cfg = *cfg;
    o->len = len;
    o->m = keel_xcalloc(sizeof(float) * (size_t)(len > 0 ? len : 1), "AdamW m");
    o->v = keel_xcalloc(sizeof(float) * (size_t)(len > 0 ? len : 1), "AdamW v");
    o->segs = keel_xcalloc(sizeof(segment) * (size_t)lay->n_tensors, "optimizer segments");
    for (int i = 0; i < lay->n_tensors; i++) {
        const keel_tensor_info *t = &lay->tensors[i];
        int64_t lo = t->offset > begin ? t->offset : begin;
        int64_t hi_t = t->offset + t->rows * t->cols, hi = hi_t < begin + len ? hi_t : begin + len;
        if (lo >= hi) continue;
        o->segs[o->n_segs++] = (segment){lo - begin, hi - lo,
                                         !t->is_norm_or_embedding || cfg->decay_norms_and_embeddings};
    }
    *out = o;
    return KEEL_OK;
}

void keel_optim_free(keel_optim *opt) {
    if (!opt) return;
    keel_free(opt->m);
    keel_free(opt->v);
    keel_free(opt->segs);
    keel_free(opt);
}

int64_t keel_optim_state_bytes(const keel_optim *opt) { return 2 * opt->len * (int64_t)sizeof(float); }

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
        keel_adamw_update(params + s->begin, grads + s->begin, opt->m + s->begin,
                          opt->v + s->begin, s->len, &st);
    }
}
