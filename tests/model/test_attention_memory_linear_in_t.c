/* Flash attention keeps O(T) memory, not O(T²): at a Llama 2 7B layer's shape
 * the model's activation bytes and the attention's per-thread workspace both
 * double when T doubles (up to each buffer's 64-byte alignment), where the
 * (B, NH, T, T) probabilities and their gradient would have added 4 GiB per
 * layer at T = 4096 and quadrupled. Only sizes: nothing is allocated. */
#include <stdio.h>

#include "keel/kernels.h"
#include "keel/model.h"

#include "../testlib.h"

static int64_t activation_bytes(int T, bool checkpointing, bool bf16) {
    keel_model_config mc = {.dim = 4096, .n_layers = 2, .n_heads = 32, .n_kv_heads = 32,
                            .vocab_size = 32000, .multiple_of = 256, .norm_eps = 1e-5,
                            .rope_theta = 10000, .max_seq_len = T};
    keel_model_layout lay;
    keel_model_layout_init(&lay, &mc);
    keel_model_options opts = {.checkpoint_blocks = checkpointing ? KEEL_CHECKPOINT_ALL : 0, .bf16 = bf16};
    int64_t bytes = keel_model_activation_bytes(&lay, 1, &opts);
    keel_model_layout_free(&lay);
    return bytes;
}

int main(void) {
    for (int variant = 0; variant < 4; variant++) {
        bool checkpointing = variant & 1, bf16 = variant & 2;
        int64_t at4k = activation_bytes(4096, checkpointing, bf16);
        int64_t at8k = activation_bytes(8192, checkpointing, bf16);
        EXPECT(at8k - 2 * at4k <= 64 * 64,
               "activations (checkpointing %d, bf16 %d): %.3f GiB at T=4096, %.3f GiB at T=8192 "
               "(2x + %lld bytes)", checkpointing, bf16, at4k / 1073741824.0, at8k / 1073741824.0,
               (long long)(at8k - 2 * at4k));
    }
    keel_kernels_init(2);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        int64_t w4k = keel_attention_workspace_bytes(4096, 128, 2, bf16);
        int64_t w8k = keel_attention_workspace_bytes(8192, 128, 2, bf16);
        EXPECT(w8k - w4k <= w4k && w4k < (64 << 20),
               "attention workspace (bf16 %d, 2 threads, HS 128): %.2f MiB at T=4096, %.2f MiB at T=8192",
               bf16, w4k / 1048576.0, w8k / 1048576.0);
    }
    keel_kernels_shutdown();
    return test_summary("test_attention_memory_linear_in_t");
}
