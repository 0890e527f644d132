/* attention_bench.c: one thread's causal attention forward and backward, fp32
 * (OpenBLAS sgemm) against bf16 (AVX512_BF16 products), at one layer of a
 * config's shape (default the small config: B=1, T=512, 12 heads of 64).
 * Best of `reps` runs; GF/s counts the products' FLOPs as computed (query
 * blocks against the keys they see). Run by bench/attention.sh. */
#include <stdio.h>
#include <stdlib.h>

#include "keel/kernels.h"

static float *rand_vec(int64_t n) {
    float *x = keel_xmalloc(sizeof(float) * (size_t)n, "bench input");
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    return x;
}

int main(int argc, char **argv) {
    int B = 1, T = 512, NH = 12, NKV = 12, HS = 64, reps = 20;
    if (argc == 7) B = atoi(argv[1]), T = atoi(argv[2]), NH = atoi(argv[3]), NKV = atoi(argv[4]),
                   HS = atoi(argv[5]), reps = atoi(argv[6]);
    keel_kernels_init(1);
    int64_t nq = (int64_t)B * T * NH * HS, nkv = (int64_t)B * T * NKV * HS;
    int64_t na = (int64_t)B * NH * T * T;
    float *q = rand_vec(nq), *k = rand_vec(nkv), *v = rand_vec(nkv), *dout = rand_vec(nq);
    float *out = rand_vec(nq), *att = rand_vec(na), *datt = rand_vec(na);
    float *dq = rand_vec(nq), *dk = rand_vec(nkv), *dv = rand_vec(nkv);
    double flops = 0; /* one product: blocks of 128 query rows x keys seen x HS */
    for (int r0 = 0; r0 < T; r0 += 128) {
        int rows = T - r0 < 128 ? T - r0 : 128;
        flops += 2.0 * rows * (r0 + rows) * HS;
    }
    flops *= (double)B * NH;
    printf("attention B=%d T=%d NH=%d NKV=%d HS=%d, 1 thread, best of %d\n", B, T, NH, NKV, HS, reps);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        double fwd = 1e30, bwd = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = keel_now_s();
            (bf16 ? keel_attention_forward_bf16 : keel_attention_forward)(out, att, q, k, v, B, T,
                                                                           NH, NKV, HS);
            double t1 = keel_now_s();
            (bf16 ? keel_attention_backward_bf16 : keel_attention_backward)(
                dq, dk, dv, datt, dout, q, k, v, att, B, T, NH, NKV, HS);
            double t2 = keel_now_s();
            fwd = t1 - t0 < fwd ? t1 - t0 : fwd;
            bwd = t2 - t1 < bwd ? t2 - t1 : bwd;
        }
        printf("%s: forward %6.2f ms (%3.0f GF/s)  backward %6.2f ms (%3.0f GF/s)  total %6.2f ms\n",
               bf16 ? "bf16" : "fp32", 1e3 * fwd, 2 * flops / fwd / 1e9, 1e3 * bwd,
               4 * flops / bwd / 1e9, 1e3 * (fwd + bwd));
    }
    keel_free(q), keel_free(k), keel_free(v), keel_free(dout), keel_free(out), keel_free(att);
    keel_free(datt), keel_free(dq), keel_free(dk), keel_free(dv);
    keel_kernels_shutdown();
    return 0;
}
