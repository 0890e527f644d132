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

#include "keel/core.h"

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
/* AMX (attention_amx.c): the same roundings, TDPBF16PS on 16 x 16 tiles. */
void tile_product_amx(const tile_product *g, char *scratch);
size_t tile_scratch_amx(int max_dim);

/* attention_bf16.c's packing, which the AMX product shares (bf16 values,
 * round to nearest even; even(x) is x rounded up to even, up16 to 16):
 *   rows:  dst (R, even(K)), row stride ld, from src (R, K), row stride lds;
 *   pairs: dst (even(R)/2 pair rows, stride ld, of up16(N) pairs: rows 2p
 *          and 2p+1 interleaved) from src (R, N);
 *   b:     the product's B as pairs (ldb), through `rows` (N x even(K)
 *          values) when it is stored transposed. */
void tile_pack_rows(keel_bf16 *dst, int ld, const float *src, int64_t lds, int R, int K);
void tile_pack_pairs(keel_bf16 *dst, int ld, const float *src, int64_t lds, int R, int N);
void tile_pack_b(keel_bf16 *b, int ldb, keel_bf16 *rows, const tile_product *g);

#endif
