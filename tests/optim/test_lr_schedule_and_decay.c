/* LR schedule (warmup, cosine, floor), clip factor, and AdamW's weight-decay
 * mask: norms and the embedding are not decayed unless asked. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/optim.h"

#include "../testlib.h"

static bool near(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(1, fabs(b)); }

int main(void) {
    keel_config cfg;
    keel_config_defaults(&cfg);
    keel_train_config *t = &cfg.train;
    t->steps = 110, t->warmup_steps = 10, t->lr = 1e-3, t->min_lr = 1e-4;
    EXPECT(near(keel_lr_at(t, 0), 1e-4), "warmup starts at lr/warmup (%g)", keel_lr_at(t, 0));
    EXPECT(near(keel_lr_at(t, 9), 1e-3), "warmup ends at lr (%g)", keel_lr_at(t, 9));
    EXPECT(near(keel_lr_at(t, 10), 1e-3), "cosine starts at lr (%g)", keel_lr_at(t, 10));
    EXPECT(near(keel_lr_at(t, 109), 1e-4), "cosine ends at min_lr (%g)", keel_lr_at(t, 109));
    /* step 43: progress 33/99 = 1/3, so (1 + cos(pi/3)) / 2 = 3/4 of the way from min_lr to lr */
    EXPECT(near(keel_lr_at(t, 43), 1e-4 + 0.75 * 9e-4), "cosine at a third (%g)", keel_lr_at(t, 43));
    bool monotone = true;
    for (int s = 10; s < 109; s++) monotone &= keel_lr_at(t, s + 1) <= keel_lr_at(t, s);
    EXPECT(monotone, "cosine decays monotonically");
    EXPECT(keel_clip_scale(0.5, 1.0) == 1.0 && keel_clip_scale(4.0, 0) == 1.0, "no clip under the bound / off");
    EXPECT(fabs(keel_clip_scale(4.0, 1.0) * 4.0 - 1.0) < 1e-6, "clip scales the norm to the bound");

    /* Decay mask: zero gradients, so only weight decay moves parameters: a decayed element
     * becomes exactly 1 - lr x weight_decay (AdamW's decoupled decay; the Adam step is 0), every
     * other stays 1. */
    keel_model_config mc = {.dim = 8, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .vocab_size = 5,
                            .multiple_of = 4, .norm_eps = 1e-5, .rope_theta = 1e4, .max_seq_len = 4};
    keel_model_layout lay;
    keel_model_layout_init(&lay, &mc);
    keel_kernels_init(1);
    const float decayed_value = 1.0f - 0.1f * 0.5f;
    int wrong = 0, wrong_elements = 0, decayed_tensors[2] = {0, 0};
    for (int pass = 0; pass < 2; pass++) {
        t->decay_norms_and_embeddings = pass == 1;
        t->weight_decay = 0.5;
        keel_optim *o;
        keel_optim_build(t, &lay, 0, lay.n_params, NULL, &o);
        float p[4096], g[4096] = {0};
        for (int64_t i = 0; i < lay.n_params; i++) p[i] = 1.0f;
        keel_optim_update(o, p, g, 0, 0.1, 1.0);
        for (int i = 0; i < lay.n_tensors; i++) {
            const keel_tensor_info *ti = &lay.tensors[i];
            bool decayed = p[ti->offset] < 1.0f;
            bool want = !ti->is_norm_or_embedding || t->decay_norms_and_embeddings;
            decayed_tensors[pass] += decayed;
            if (decayed != want) {
                printf("FAIL %s decayed=%d want %d (pass %d)\n", ti->name, decayed, want, pass);
                failures++;
                wrong++;
            }
            /* every element of the tensor, not just its first */
            for (int64_t k = 0; k < ti->rows * ti->cols; k++)
                wrong_elements += p[ti->offset + k] != (want ? decayed_value : 1.0f);
        }
        keel_optim_free(o);
    }
    EXPECT(wrong == 0 && wrong_elements == 0,
           "decay mask checked for %d tensors, both settings: %d tensors and %d elements differ from "
           "1 - lr x wd = %.9g (decayed) or 1 (not)",
           lay.n_tensors, wrong, wrong_elements, (double)decayed_value);
    /* 1 block: 7 matrices + the head decayed by default; with decay_norms_and_embeddings also the
     * embedding and the 3 norms — all 12 tensors */
    EXPECT(lay.n_tensors == 12 && decayed_tensors[0] == 8 && decayed_tensors[1] == 12,
           "decayed tensors: %d of %d by default (want 8), %d with decay_norms_and_embeddings (want 12)",
           decayed_tensors[0], lay.n_tensors, decayed_tensors[1]);
    keel_model_layout_free(&lay);
    keel_kernels_shutdown();
    keel_config_free(&cfg);
    return test_summary("test_lr_schedule_and_decay");
}
