/* Training FLOPs per token (keel_model_flops_per_token, the numerator of MFU)
 * against a count written here from each shape's numbers alone, PaLM's
 * convention as docs/run-directory.md states it: 6 x the matmul parameters
 * (q, k, v, o, gate, up, down of every block and the output head — the tied
 * embedding's matrix when the head is tied — but not the embedding lookup)
 * + 12 x L x C x T for attention's scores and values. Shapes: tiny (MHA,
 * untied), micro with grouped-query heads and tied embeddings, Llama 2 7B and
 * 70B (GQA, ffn_dim_multiplier); the ffn sizes are the published ones, not
 * keel's rounding rule. A count of the forward only (2x) is a third of it.
 * The per-unit count (keel_model_unit_flops) sums to it; under LoRA (rank 8
 * on q and v) to 4 x the matmul parameters + 12 L C T + 8 |A| + 6 |B|. */
#include <math.h>
#include <stdio.h>

#include "keel/model.h"

#include "../testlib.h"

typedef struct {
    const char *name;
    keel_model_config cfg;
    int64_t F; /* the ffn hidden size, as published for the shape */
} shape;

/* The count, from the shape's numbers: no keel code. */
static double expected_flops_per_token(const shape *s) {
    int64_t C = s->cfg.dim, L = s->cfg.n_layers, NH = s->cfg.n_heads, V = s->cfg.vocab_size,
            T = s->cfg.max_seq_len;
    int64_t NKV = s->cfg.n_kv_heads ? s->cfg.n_kv_heads : NH, HS = C / NH;
    int64_t attention = C * (NH * HS) + 2 * C * (NKV * HS) + (NH * HS) * C; /* q, k, v, o */
    int64_t mlp = 3 * C * s->F;                                            /* gate, up, down */
    int64_t head = V * C;                                                  /* untied or tied: one matmul */
    int64_t matmul_params = L * (attention + mlp) + head;
    return 6.0 * (double)matmul_params + 12.0 * (double)(L * C * T);
}

/* LoRA of rank r on q_proj and v_proj: the frozen base's matrices 4x (no
 * weight gradient), each A (r, C) 8x and B (out, r) 6x. */
static double expected_lora_flops_per_token(const shape *s, int r) {
    double full = expected_flops_per_token(s), attention = 12.0 * s->cfg.n_layers * s->cfg.dim * s->cfg.max_seq_len;
    int64_t C = s->cfg.dim, NH = s->cfg.n_heads, NKV = s->cfg.n_kv_heads ? s->cfg.n_kv_heads : NH, HS = C / NH;
    double a = 2.0 * r * C, b = (double)r * (NH * HS + NKV * HS); /* q's and v's */
    return (full - attention) / 6 * 4 + attention + s->cfg.n_layers * (8 * a + 6 * b);
}

int main(void) {
    const shape shapes[] = {
        {"tiny (configs/tiny.json)",
         {.dim = 288, .n_layers = 6, .n_heads = 6, .n_kv_heads = 6, .vocab_size = 32000, .multiple_of = 32,
          .max_seq_len = 256},
         768},
        {"micro, GQA 4/2 heads, tied embeddings",
         {.dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 512, .multiple_of = 32,
          .max_seq_len = 64, .tie_embeddings = true},
         192},
        {"Llama 2 7B",
         {.dim = 4096, .n_layers = 32, .n_heads = 32, .n_kv_heads = 32, .vocab_size = 32000, .multiple_of = 256,
          .max_seq_len = 4096},
         11008},
        {"Llama 2 70B (GQA 64/8)",
         {.dim = 8192, .n_layers = 80, .n_heads = 64, .n_kv_heads = 8, .vocab_size = 32000, .multiple_of = 4096,
          .ffn_dim_multiplier = 1.3, .max_seq_len = 4096},
         28672},
    };
    /* tiny by hand, so the formula above is itself checked once:
     * 6 x (6 x (4 x 288^2 + 3 x 288 x 768) + 32000 x 288) + 12 x 6 x 288 x 256 */
    EXPECT(expected_flops_per_token(&shapes[0]) == 96436224.0, "tiny's count by hand: %.0f",
           expected_flops_per_token(&shapes[0]));
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        keel_model_layout lay;
        keel_model_layout_init(&lay, &shapes[i].cfg);
        double got = keel_model_flops_per_token(&lay), want = expected_flops_per_token(&shapes[i]);
        EXPECT(got == want, "%s: training FLOPs per token %.0f, want %.0f (ratio %.4f)", shapes[i].name, got, want,
               got / want);
        double units = keel_model_train_flops_per_token(&lay, NULL);
        EXPECT(units == want, "%s: the units' forward and backward sum to %.0f, want %.0f", shapes[i].name, units, want);
        keel_model_layout lora;
        char why[256] = "";
        keel_lora_config lc = {.on = true, .rank = 8, .alpha = 16, .targets = 1u << KEEL_LORA_Q | 1u << KEEL_LORA_V};
        EXPECT(keel_lora_layout_init(&lora, &lay, &lc, why, sizeof why) == KEEL_OK, "%s: LoRA's layout%s%s",
               shapes[i].name, *why ? ": " : "", why);
        got = keel_model_train_flops_per_token(&lay, &lora), want = expected_lora_flops_per_token(&shapes[i], 8);
        EXPECT(fabs(got - want) <= 1e-12 * want, "%s: LoRA's training FLOPs per token %.0f, want %.0f",
               shapes[i].name, got, want);
        keel_model_layout_free(&lora);
        keel_model_layout_free(&lay);
    }
    return test_summary("test_flops_per_token");
}
