/* kernels/gemm_bf16_emulated.h: the bf16 GEMM without bf16 instructions
 * (gemm_bf16_emulated.c), private to kernels/ and its tests. */
#ifndef KEEL_KERNELS_GEMM_BF16_EMULATED_H
#define KEEL_KERNELS_GEMM_BF16_EMULATED_H

#include "keel/core.h"

/* keel_gemm_bf16's contract, through OpenBLAS sgemm on widened operands;
 * runs on any x86-64-v3. */
void keel_gemm_bf16_emulated(float *out, const keel_bf16 *a, bool a_t, const keel_bf16 *b,
                             bool b_t, int M, int N, int K, bool accumulate);
/* Frees its scratch (keel_gemm_bf16_release). */
void keel_gemm_bf16_emulated_release(void);

#endif
