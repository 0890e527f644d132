/* The model reaches its tensors only through its backend (keel/backend.h):
 * run on a "fenced" backend — the CPU kernels, on memory that is unreadable
 * (PROT_NONE) except while one of the backend's own calls runs — a training
 * step gives the CPU backend's loss and gradients bit for bit, in fp32 and
 * bf16, with and without activation checkpointing. A host read or write of a
 * tensor anywhere in the model (the bug that would crash on a GPU) faults
 * here. The fence itself is checked first: a host read of fenced memory
 * outside a call must kill a child process. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cuda_table.h"
#include "keel/backend.h"
#include "keel/kernels.h"
#include "keel/model.h"
#include "../testlib.h"

/* Every field of the table is set: a new backend call the wrapper forgot would be NULL.
 * Generation's calls may be NULL where the backend has none (keel/backend.h: cuda),
 * node windows on every backend but the CPU's (all seven of them, or none). */
static void check_table_complete(const keel_backend *be) {
    const char *p = (const char *)be;
    size_t first = offsetof(keel_backend, alloc), n = (sizeof *be - first) / sizeof(void (*)(void));
    const size_t optional[] = {offsetof(keel_backend, rope_at), offsetof(keel_backend, attention_cached),
                               offsetof(keel_backend, attention_cached_bf16),
                               offsetof(keel_backend, matmul_few_rows), offsetof(keel_backend, matmul_few_rows_bf16)};
    const size_t windows[] = {offsetof(keel_backend, window_create), offsetof(keel_backend, window_claim),
                              offsetof(keel_backend, window_gather), offsetof(keel_backend, window_wait),
                              offsetof(keel_backend, window_release), offsetof(keel_backend, window_reduce_scatter),
                              offsetof(keel_backend, window_free)};
    int missing = 0, window_calls = 0;
    for (size_t i = 0; i < n; i++) {
        void (*fn)(void);
        memcpy(&fn, p + first + i * sizeof fn, sizeof fn);
        bool may_lack = be->kind == KEEL_BACKEND_CUDA;
        for (size_t j = 0; j < sizeof optional / sizeof *optional && may_lack; j++)
            if (first + i * sizeof fn == optional[j]) fn = (void (*)(void))1; /* counted as set */
        for (size_t j = 0; j < sizeof windows / sizeof *windows; j++)
            if (first + i * sizeof fn == windows[j]) {
                window_calls += fn != NULL;
                fn = be->window_create ? fn : (void (*)(void))1; /* with windows, every call of them */
            }
        missing += fn == NULL;
    }
    EXPECT(window_calls == 0 || window_calls == (int)(sizeof windows / sizeof *windows),
           "%s backend: node windows' calls all set or none (%d set)", be->name, window_calls);
    EXPECT(!be->window_create == (strcmp(be->name, "cpu") != 0), "%s backend: node windows on the CPU's alone",
           be->name);
    EXPECT(missing == 0, "%s backend: every one of its %zu calls set (%d missing)", be->name, n, missing);
}

/* The fence works: reading arena memory from the host outside a call kills the reader. */
static void check_fence_faults(void) {
    float *x = keel_backend_fenced()->alloc(sizeof(float) * 16, "the fence check");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        volatile float v = x[3]; /* must fault */
        (void)v;
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(!(WIFEXITED(status) && WEXITSTATUS(status) == 0),
           "a host read of fenced memory outside a backend call faults (child status %#x)", status);
}

/* One step of a small model on backend be: the loss, and the gradients copied to grads. */
static double step(const keel_backend *be, bool bf16, bool ckpt, const keel_lora_config *lora, float *grads,
                   int64_t *n_params) {
    keel_model_config mc = {.dim = 32, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 61,
                            .multiple_of = 16, .norm_eps = 1e-5, .rope_theta = 10000, .max_seq_len = 20};
    int B = 2, T = mc.max_seq_len;
    int32_t tokens[2 * 21];
    for (int i = 0; i < 2 * 21; i++) tokens[i] = (i * 17 + 3) % mc.vocab_size;
    keel_model_options opts = {.own_params = true, .checkpoint_blocks = ckpt ? KEEL_CHECKPOINT_ALL : 0, .bf16 = bf16,
                               .backend = be, .lora = lora};
    keel_model *m;
    keel_model_build_with(&mc, B, &opts, &m);
    keel_model_init_weights(m, 5);
    const keel_model_layout *ll = keel_model_lora_layout(m);
    if (ll) { /* adapters with a non-zero B, through the host */
        float *a = keel_xmalloc(sizeof(float) * (size_t)ll->n_params, "adapters");
        keel_lora_init_range(ll, 3, 0, ll->n_params, a);
        for (int64_t i = 0; i < ll->n_params; i++) a[i] += 0.01f * (float)(i % 7);
        be->to_device(keel_model_lora_params(m), a, sizeof(float) * (size_t)ll->n_params);
        keel_free(a);
        keel_model_set_dropout_keys(m, (uint64_t[]){1, 2}, B);
    }
    keel_model_zero_grads(m);
    double loss = 0;
    for (int micro = 0; micro < 2; micro++) { /* accumulation: a second forward on the same buffers */
        loss += keel_model_forward(m, tokens, NULL, B, 1.0f / (float)(2 * B * T));
        keel_model_backward(m);
    }
    loss += keel_model_forward(m, tokens, NULL, 1, 0.0f); /* an evaluation: a smaller batch, no backward */
    *n_params = ll ? ll->n_params : keel_model_get_layout(m)->n_params;
    if (grads) be->to_host(grads, ll ? keel_model_lora_grads(m) : keel_model_grads(m), sizeof(float) * (size_t)*n_params);
    keel_model_free(m);
    return loss;
}

int main(void) {
    keel_kernels_init(2);
    const keel_backend *cpu = keel_backend_cpu(), *fenced = keel_backend_fenced();
    check_table_complete(cpu);
    check_table_complete(fenced);
    if (keel_backend_cuda_table()) check_table_complete(keel_backend_cuda_table()); /* a CUDA build: set without a GPU too */
    check_fence_faults();

    int64_t n = 0;
    step(cpu, false, false, NULL, NULL, &n);
    float *want = keel_xmalloc(sizeof(float) * (size_t)n, "grads"), *got = keel_xmalloc(sizeof(float) * (size_t)n, "grads");
    keel_lora_config lora = {.on = true, .rank = 4, .alpha = 8, .dropout = 0.2,
                             .targets = 1u << KEEL_LORA_Q | 1u << KEEL_LORA_O | 1u << KEEL_LORA_UP};
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int ckpt = 0; ckpt < 3; ckpt++) { /* 2: LoRA with dropout, the base frozen */
            const char *what = bf16 ? (const char *[]){"bf16", "bf16, checkpointing", "bf16, LoRA"}[ckpt]
                                    : (const char *[]){"fp32", "fp32, checkpointing", "fp32, LoRA"}[ckpt];
            const keel_lora_config *l = ckpt == 2 ? &lora : NULL;
            double l_cpu = step(cpu, bf16, ckpt == 1, l, want, &n);
            int64_t before = keel_backend_fenced_calls();
            double l_fenced = step(fenced, bf16, ckpt == 1, l, got, &n);
            int64_t calls = keel_backend_fenced_calls() - before;
            EXPECT(calls > 100, "%s: the model ran through %lld fenced calls", what, (long long)calls);
            EXPECT(l_cpu == l_fenced, "%s: loss identical on the fenced backend (%.9g, %.9g)", what, l_cpu, l_fenced);
            EXPECT(!memcmp(want, got, sizeof(float) * (size_t)n), "%s: gradients bit-identical on the fenced backend",
                   what);
        }
    keel_free(want);
    keel_free(got);
    keel_kernels_shutdown();
    return test_summary("test_backend_boundary");
}
