/* Activation checkpointing of the first K blocks, every K: the same loss and
 * bit-identical gradients as keeping every activation (with accumulation
 * over micro-batches), in fp32 and with bf16 GEMMs, with less activation
 * memory. The bf16 GEMMs take the
 * machine's path; ctest also runs this as test_activation_checkpointing_avx2
 * (KEEL_MAX_ISA=avx2: emulated). Under FSDP: tests/fsdp/train_nproc.sh. */
#include <stdio.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/model.h"
#include "../testlib.h"

/* Every K of fsdp.activation_checkpointing (the first K blocks) against
 * none: the same loss, the same gradients bit for bit, and activation memory
 * that falls with K by one block's set per block after the first. */
static void check(bool bf16) {
    keel_model_config mc = {.dim = 32, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2,
                            .vocab_size = 50, .multiple_of = 16, .norm_eps = 1e-5,
                            .rope_theta = 10000, .max_seq_len = 24};
    int B = 3, T = mc.max_seq_len, L = mc.n_layers;
    int32_t tokens[3 * 25];
    for (int i = 0; i < 3 * 25; i++) tokens[i] = (i * 13 + 5) % mc.vocab_size;
    const char *what = bf16 ? "bf16" : "fp32";

    keel_model *plain;
    keel_model_options without = {.own_params = true, .bf16 = bf16};
    keel_model_build_with(&mc, B, &without, &plain);
    keel_model_init_weights(plain, 9);
    const keel_model_layout *lay = keel_model_get_layout(plain);
    int64_t full = keel_model_activation_bytes(lay, B, &without), set = 0;
    double loss_plain = 0;
    keel_model_zero_grads(plain);
    for (int micro = 0; micro < 2; micro++) { /* accumulation too */
        loss_plain = keel_model_forward(plain, tokens, NULL, B, 1.0f / (float)(2 * B * T));
        keel_model_backward(plain);
    }
    for (int K = 1; K <= L + 1; K++) { /* L + 1: KEEL_CHECKPOINT_ALL */
        int k = K > L ? KEEL_CHECKPOINT_ALL : K;
        keel_model *ckpt;
        keel_model_options with = {.own_params = true, .checkpoint_blocks = k, .bf16 = bf16};
        keel_model_build_with(&mc, B, &with, &ckpt);
        keel_model_init_weights(ckpt, 9);
        double loss = 0;
        keel_model_zero_grads(ckpt);
        for (int micro = 0; micro < 2; micro++) {
            loss = keel_model_forward(ckpt, tokens, NULL, B, 1.0f / (float)(2 * B * T));
            keel_model_backward(ckpt);
        }
        EXPECT(loss == loss_plain, "%s, K %d: loss identical (%.9g, %.9g)", what, k, loss, loss_plain);
        EXPECT(!memcmp(keel_model_grads(plain), keel_model_grads(ckpt), sizeof(float) * (size_t)lay->n_params),
               "%s, K %d: gradients bit-identical with checkpointing", what, k);
        int64_t bytes = keel_model_activation_bytes(lay, B, &with), kk = K > L ? L : K;
        if (kk == 2) set = full - bytes; /* one block's set less its kept input */
        EXPECT(bytes == full - (kk - 1) * set && (kk < 2 || set > 0),
               "%s, K %d: activation bytes %lld = %lld - %lld x %lld", what, k, (long long)bytes,
               (long long)full, (long long)(kk - 1), (long long)set);
        EXPECT(keel_model_recomputed_blocks(lay, k) == kk - 1, "%s, K %d: %d blocks recomputed", what, k,
               keel_model_recomputed_blocks(lay, k));
        keel_model_free(ckpt);
    }
    EXPECT(keel_model_recomputed_blocks(lay, 0) == 0, "%s: nothing recomputed without checkpointing", what);
    keel_model_free(plain);
}

int main(void) {
    keel_kernels_init(2);
    const char *path;
    keel_bf16_native(&path);
    printf("bf16 GEMMs at %s: %s\n", keel_isa_name(keel_isa_active()), path);
    check(false);
    check(true);
    keel_kernels_shutdown();
    return test_summary("test_activation_checkpointing");
}
