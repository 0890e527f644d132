/* The FSDP contract of the model: units can live in separate buffers, the
 * hooks run in the documented order, and a unit's parameters are read only
 * between its before_* and after_* hooks — poisoning them outside that window
 * (what FULL_SHARD's free does) leaves loss and gradients bit-identical;
 * progress (the trainer's heartbeat) follows every unit's forward and backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/model.h"
#include "../testlib.h"

typedef struct {
    keel_model *m;
    const keel_model_layout *lay;
    float **live;        /* (n_units) the buffers the model reads */
    float **saved;       /* (n_units) the true parameters */
    char order[256][24]; /* hook calls, "f+3" = before_forward(3) ... */
    int n;
} hooks_ctx;

static void record(hooks_ctx *h, const char *what, int unit) {
    if (h->n < 256) snprintf(h->order[h->n++], sizeof h->order[0], "%s%d", what, unit);
}
static void poison(hooks_ctx *h, int u) {
    for (int64_t i = 0; i < h->lay->unit_size[u]; i++) h->live[u][i] = NAN;
}
static void restore(hooks_ctx *h, int u) {
    memcpy(h->live[u], h->saved[u], sizeof(float) * (size_t)h->lay->unit_size[u]);
}
static void before_forward(void *p, int u) { record(p, "f+", u), restore(p, u); }
static void after_forward(void *p, int u) { record(p, "f-", u), poison(p, u); }
static void before_backward(void *p, int u) { record(p, "b+", u), restore(p, u); }
static void after_backward(void *p, int u) { record(p, "b-", u), poison(p, u); }
static void count(void *p) { ++*(int *)p; }

int main(void) {
    keel_kernels_init(2);
    keel_model_config mc = {.dim = 32, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2,
                            .vocab_size = 50, .multiple_of = 16, .norm_eps = 1e-5,
                            .rope_theta = 10000, .max_seq_len = 16};
    int B = 2, T = mc.max_seq_len;
    int32_t tokens[2 * 17];
    for (int i = 0; i < 2 * 17; i++) tokens[i] = (i * 7 + 3) % mc.vocab_size;

    keel_model *ref, *m;
    keel_model_build(&mc, B, &ref);
    keel_model_build(&mc, B, &m);
    keel_model_init_weights(ref, 5);
    const keel_model_layout *lay = keel_model_get_layout(ref);
    keel_model_zero_grads(ref);
    double loss_ref = keel_model_forward(ref, tokens, B, 1.0f / (float)(B * T));
    keel_model_backward(ref);

    hooks_ctx h = {.m = m, .lay = lay};
    h.live = calloc((size_t)lay->n_units, sizeof(float *));
    h.saved = calloc((size_t)lay->n_units, sizeof(float *));
    float **grads = calloc((size_t)lay->n_units, sizeof(float *));
    for (int u = 0; u < lay->n_units; u++) {
        size_t bytes = sizeof(float) * (size_t)lay->unit_size[u];
        h.live[u] = malloc(bytes);
        h.saved[u] = malloc(bytes);
        grads[u] = calloc(1, bytes);
        memcpy(h.saved[u], keel_model_params(ref) + lay->unit_offset[u], bytes);
        keel_model_set_unit_buffers(m, u, h.live[u], grads[u]);
        poison(&h, u);
    }
    keel_model_hooks hooks = {&h, before_forward, after_forward, before_backward, after_backward};
    keel_model_set_hooks(m, &hooks);
    int progress = 0;
    keel_model_set_progress(m, count, &progress);
    keel_model_zero_grads(m);
    double loss = keel_model_forward(m, tokens, B, 1.0f / (float)(B * T));
    keel_model_backward(m);

    EXPECT(loss == loss_ref, "loss %.9g with separate, poisoned-outside-window unit buffers, %.9g without",
           loss, loss_ref);
    for (int u = 0; u < lay->n_units; u++)
        EXPECT(!memcmp(grads[u], keel_model_grads(ref) + lay->unit_offset[u],
                       sizeof(float) * (size_t)lay->unit_size[u]),
               "unit %d gradients bit-identical", u);
    const float *flat = keel_model_grads(m);
    bool untouched = true;
    for (int64_t i = 0; i < lay->n_params; i++) untouched &= flat[i] == 0.0f;
    EXPECT(untouched, "the flat gradient vector is not written when units have their own buffers");

    /* Expected order: f+0 f-0 f+1 f-1 ... f+(L+1) f-(L+1) b+(L+1) b-(L+1) ... b+0 b-0 */
    char want[256][24];
    int n = 0;
    for (int u = 0; u < lay->n_units; u++) {
        snprintf(want[n++], 24, "f+%d", u);
        snprintf(want[n++], 24, "f-%d", u);
    }
    for (int u = lay->n_units - 1; u >= 0; u--) {
        snprintf(want[n++], 24, "b+%d", u);
        snprintf(want[n++], 24, "b-%d", u);
    }
    bool order_ok = n == h.n;
    for (int i = 0; order_ok && i < n; i++) order_ok = !strcmp(want[i], h.order[i]);
    EXPECT(order_ok, "hooks run in compute order (%d calls, want %d)", h.n, n);
    EXPECT(progress == 2 * lay->n_units, "progress after each unit's forward and backward: %d calls, want %d",
           progress, 2 * lay->n_units);

    for (int u = 0; u < lay->n_units; u++) free(h.live[u]), free(h.saved[u]), free(grads[u]);
    free(h.live), free(h.saved), free(grads);
    keel_model_free(ref);
    keel_model_free(m);
    keel_kernels_shutdown();
    return test_summary("test_unit_buffers_and_hooks");
}
