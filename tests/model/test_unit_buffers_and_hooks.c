/* The FSDP contract of the model, for block and matrix units, with
 * activation checkpointing of none, some and all blocks: units can live in separate buffers, the
 * hooks run in the documented order, each hook's `next` is the unit the
 * model really uses next, and a unit's parameters are read only between its
 * before_* and after_* hooks — poisoning them outside that window (what
 * FULL_SHARD's free does) leaves loss and gradients bit-identical; progress
 * (the trainer's heartbeat) follows every unit's forward and backward, and
 * comes inside every unit that holds a matrix (after each product). */
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
    char order[512][24]; /* hook calls, "f+3" = before_forward(3) ... */
    char kind[512];      /* 'F' before_forward ... 'b' after_backward */
    int unit[512], next[512];
    int beats[512];      /* progress calls made before each hook call */
    int n, progress;
} hooks_ctx;

static void record(hooks_ctx *h, const char *what, int unit, int next) {
    if (h->n >= 512) return;
    snprintf(h->order[h->n], sizeof h->order[0], "%s%d", what, unit);
    h->kind[h->n] = what[0] == 'f' ? (what[1] == '+' ? 'F' : 'f') : (what[1] == '+' ? 'B' : 'b');
    h->unit[h->n] = unit, h->next[h->n] = next, h->beats[h->n] = h->progress;
    h->n++;
}
static void poison(hooks_ctx *h, int u) {
    for (int64_t i = 0; i < h->lay->unit_size[u]; i++) h->live[u][i] = NAN;
}
static void restore(hooks_ctx *h, int u) {
    memcpy(h->live[u], h->saved[u], sizeof(float) * (size_t)h->lay->unit_size[u]);
}
static void before_forward(void *p, int u, int next) { record(p, "f+", u, next), restore(p, u); }
static void after_forward(void *p, int u, int next) { record(p, "f-", u, next), poison(p, u); }
static void before_backward(void *p, int u, int next) { record(p, "b+", u, next), restore(p, u); }
static void after_backward(void *p, int u, int next) { record(p, "b-", u, next), poison(p, u); }
static void count(void *p, const char *doing) {
    if (!strcmp(doing, "forward") || !strcmp(doing, "backward")) ((hooks_ctx *)p)->progress++;
}

/* A progress call after every after_* hook (before the next hook, or the
 * end), and between the before_* and after_* of every unit but the
 * embedding (every other unit holds a matrix, and a product beats). */
static bool beats_ok(const hooks_ctx *h) {
    for (int i = 0; i < h->n; i++) {
        bool after = h->kind[i] == 'f' || h->kind[i] == 'b';
        int then = i + 1 < h->n ? h->beats[i + 1] : h->progress;
        if (after && then <= h->beats[i]) return false;
        if (after && h->unit[i] != 0)
            for (int j = i - 1; j >= 0; j--)
                if (h->unit[j] == h->unit[i] && h->kind[j] == (h->kind[i] == 'f' ? 'F' : 'B')) {
                    if (h->beats[i] <= h->beats[j]) return false;
                    break;
                }
    }
    return true;
}

/* Every before_* hook's next is the unit of the first later before_* call
 * for another unit (-1 if none); after_forward says next == unit exactly
 * when that unit's backward comes right after. */
static bool next_is_true(const hooks_ctx *h) {
    for (int i = 0; i < h->n; i++) {
        if (h->kind[i] == 'F' || h->kind[i] == 'B') {
            int want = -1;
            for (int j = i + 1; j < h->n && want < 0; j++)
                if ((h->kind[j] == 'F' || h->kind[j] == 'B') && h->unit[j] != h->unit[i]) want = h->unit[j];
            if (h->next[i] != want) return false;
        }
        if (h->kind[i] == 'f') {
            bool backward_next = i + 1 < h->n && h->kind[i + 1] == 'B' && h->unit[i + 1] == h->unit[i];
            if ((h->next[i] == h->unit[i]) != backward_next) return false;
        }
    }
    return true;
}

/* The documented order: forward 0..head; backward head..0, the units of
 * each of the first K - 1 blocks recomputed (forward order) just before
 * their backward when the first K blocks are checkpointed (the last of them
 * still has its activations). */
static int expected_order(const keel_model_layout *lay, int K, char want[][24]) {
    int n = 0, head = lay->n_units - 1, P = lay->units_per_block;
    for (int u = 0; u <= head; u++) {
        snprintf(want[n++], 24, "f+%d", u);
        snprintf(want[n++], 24, "f-%d", u);
    }
    snprintf(want[n++], 24, "b+%d", head);
    snprintf(want[n++], 24, "b-%d", head);
    for (int l = lay->L - 1; l >= 0; l--) {
        int first = keel_model_block_unit(lay, l);
        for (int u = first; l < K - 1 && u < first + P; u++) {
            snprintf(want[n++], 24, "f+%d", u);
            snprintf(want[n++], 24, "f-%d", u);
        }
        for (int u = first + P - 1; u >= first; u--) {
            snprintf(want[n++], 24, "b+%d", u);
            snprintf(want[n++], 24, "b-%d", u);
        }
    }
    snprintf(want[n++], 24, "b+0");
    snprintf(want[n++], 24, "b-0");
    return n;
}

int main(void) {
    keel_kernels_init(2);
    keel_model_config mc = {.dim = 32, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2,
                            .vocab_size = 50, .multiple_of = 16, .norm_eps = 1e-5,
                            .rope_theta = 10000, .max_seq_len = 16};
    int B = 2, T = mc.max_seq_len;
    int32_t tokens[2 * 17];
    for (int i = 0; i < 2 * 17; i++) tokens[i] = (i * 7 + 3) % mc.vocab_size;

    keel_model *ref;
    keel_model_build(&mc, B, &ref);
    keel_model_init_weights(ref, 5);
    const keel_model_layout *ref_lay = keel_model_get_layout(ref);
    keel_model_zero_grads(ref);
    double loss_ref = keel_model_forward(ref, tokens, NULL, B, 1.0f / (float)(B * T));
    keel_model_backward(ref);

    for (int kind = KEEL_UNIT_BLOCK; kind <= KEEL_UNIT_MATRIX; kind++)
        for (int K = 0; K <= mc.n_layers; K++) { /* the first K blocks */
            const char *name = keel_unit_kind_name((keel_unit_kind)kind);
            keel_model_options opts = {.unit = (keel_unit_kind)kind, .checkpoint_blocks = K};
            keel_model *m;
            keel_model_build_with(&mc, B, &opts, &m);
            const keel_model_layout *lay = keel_model_get_layout(m);
            EXPECT(lay->n_units == 2 + mc.n_layers * (kind == KEEL_UNIT_MATRIX ? KEEL_BLOCK_MATRIX_UNITS : 1),
                   "%s units: %d", name, lay->n_units);
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
            keel_model_set_progress(m, count, &h);
            double loss = keel_model_forward(m, tokens, NULL, B, 1.0f / (float)(B * T));
            keel_model_backward(m);

            EXPECT(loss == loss_ref, "%s units, checkpointing K %d: loss %.9g with separate, "
                   "poisoned-outside-window unit buffers, %.9g without", name, K, loss, loss_ref);
            for (int u = 0; u < lay->n_units; u++)
                EXPECT(!memcmp(grads[u], keel_model_grads(ref) + lay->unit_offset[u],
                               sizeof(float) * (size_t)lay->unit_size[u]),
                       "%s units, checkpointing K %d: unit %d gradients bit-identical", name, K, u);
            EXPECT(lay->n_params == ref_lay->n_params && lay->unit_offset[lay->n_units - 1] ==
                   ref_lay->unit_offset[ref_lay->n_units - 1], "%s units tile the same parameters", name);

            static char want[512][24];
            int n = expected_order(lay, K, want);
            bool order_ok = n == h.n;
            for (int i = 0; order_ok && i < n; i++) order_ok = !strcmp(want[i], h.order[i]);
            EXPECT(order_ok, "%s units, checkpointing K %d: hooks run in compute order (%d calls, want %d)",
                   name, K, h.n, n);
            EXPECT(next_is_true(&h), "%s units, checkpointing K %d: every hook's next is the unit used next",
                   name, K);
            EXPECT(beats_ok(&h), "%s units, checkpointing K %d: progress after each unit's forward and backward, "
                   "and inside each unit with a matrix (%d calls for %d units' passes)", name, K, h.progress, n / 2);

            for (int u = 0; u < lay->n_units; u++) free(h.live[u]), free(h.saved[u]), free(grads[u]);
            free(h.live), free(h.saved), free(grads);
            keel_model_free(m);
        }
    keel_model_free(ref);
    keel_kernels_shutdown();
    return test_summary("test_unit_buffers_and_hooks");
}
