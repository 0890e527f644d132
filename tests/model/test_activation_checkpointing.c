/* Activation checkpointing: the same loss and bit-identical gradients as
 * keeping every activation (with accumulation over micro-batches), in fp32 and
 * with bf16 GEMMs, with less activation memory. The bf16 GEMMs take the
 * machine's path; ctest also runs this as test_activation_checkpointing_avx2
 * (KEEL_MAX_ISA=avx2: emulated). Under FSDP: tests/fsdp/train_nproc.sh. */
#include <stdio.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/model.h"
#include "../testlib.h"

static void check(bool bf16) {
    keel_model_config mc = {.dim = 32, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2,
                            .vocab_size = 50, .multiple_of = 16, .norm_eps = 1e-5,
                            .rope_theta = 10000, .max_seq_len = 24};
    int B = 3, T = mc.max_seq_len;
    int32_t tokens[3 * 25];
    for (int i = 0; i < 3 * 25; i++) tokens[i] = (i * 13 + 5) % mc.vocab_size;

    keel_model *plain, *ckpt;
    keel_model_options with = {.own_params = true, .checkpoint_activations = true, .bf16 = bf16};
    keel_model_options without = {.own_params = true, .bf16 = bf16};
    keel_model_build_with(&mc, B, &without, &plain);
    keel_model_build_with(&mc, B, &with, &ckpt);
    keel_model_init_weights(plain, 9);
    keel_model_init_weights(ckpt, 9);
    const keel_model_layout *lay = keel_model_get_layout(plain);
    double losses[2];
    keel_model *models[2] = {plain, ckpt};
    for (int i = 0; i < 2; i++) {
        keel_model_zero_grads(models[i]);
        for (int micro = 0; micro < 2; micro++) { /* accumulation too */
            losses[i] = keel_model_forward(models[i], tokens, B, 1.0f / (float)(2 * B * T));
            keel_model_backward(models[i]);
        }
    }
    const char *what = bf16 ? "bf16" : "fp32";
    EXPECT(losses[0] == losses[1], "%s: loss identical (%.9g, %.9g)", what, losses[0], losses[1]);
    EXPECT(!memcmp(keel_model_grads(plain), keel_model_grads(ckpt), sizeof(float) * (size_t)lay->n_params),
           "%s: gradients bit-identical with checkpointing", what);
    int64_t full = keel_model_activation_bytes(lay, B, &without),
            saved = keel_model_activation_bytes(lay, B, &with);
    EXPECT(saved < full * 0.6, "%s: activation bytes %lld with checkpointing vs %lld without", what,
           (long long)saved, (long long)full);
    keel_model_free(plain);
    keel_model_free(ckpt);
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
