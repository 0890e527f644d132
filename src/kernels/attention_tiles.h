/* kernels/attention_tiles.h: the products of flash attention's tiles
 * (attention.c), in three precisions that share one calling convention.
 *
 * A product is sgemm's: C (M, N) = alpha · op(A) · op(B), plus C when
 * accumulate, with fp32 operands in row-major storage. The bf16 kinds
 * (attention_bf16.c) round A and B to bf16 as they copy them into the
 * caller's scratch and sum in fp32: the AVX512_BF16 microkernel, or where
 * the active instruction set lacks it the same roundings multiplied by
 * OpenBLAS sgemm (bf16 products are exact in fp32, so the sums are fp32 sums
 * of the same products). M, N and K are each at most the max_dim the
 * scratch was sized for (attention.c: max(key tile, HS)). */
#ifndef KEEL_KERNELS_ATTENTION_TILES_H
#define KEEL_KERNELS_ATTENTION_TILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const float *a; /* (M, K), or stored (K, M) when a_t */
    int64_t lda;
    bool a_t;
    bool a_bf16;    /* A's values are bf16 values already: need no rounding */
    const float *b; /* (K, N), or stored (N, K) when b_t */
    int64_t ldb;
    bool b_t;
    bool b_bf16;
    float *c; /* (M, N) */
    int64_t ldc;
    int M, N, K;
    float alpha;
    bool accumulate;
} tile_product;

/* Runs one product; scratch holds tile_scratch_bytes(max_dim) bytes, 64-byte
 * aligned, that the product may overwrite. */
typedef void (*tile_product_fn)(const tile_product *g, char *scratch);
typedef size_t (*tile_scratch_fn)(int max_dim);

void tile_product_bf16(const tile_product *g, char *scratch);
size_t tile_scratch_bf16(int max_dim);
void tile_product_bf16_emulated(const tile_product *g, char *scratch);
size_t tile_scratch_bf16_emulated(int max_dim);

#endif
