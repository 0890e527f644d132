// cuda/warp_mma.h: the warp-level PTX that attention_tc.cu's forward is built
// on (sm_80 and newer), as device functions: tensor-core products whose
// register layouts the PTX ISA documents (so a product's result stays in
// registers for the softmax, unlike WMMA's unspecified fragments), the
// shared-memory matrix loads that feed them, and asynchronous copies from
// global to shared memory. On the host CUDA emulator (tests/cuemu) the same
// functions are its own, with the same semantics.
//
// Layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
// type"; g = lane / 4, t = lane % 4; a register holds two bf16, the lower
// column or row in its low half):
//   A 16x16 (row)  a[0] = A(g, 2t..2t+1)      a[1] = A(g+8, 2t..2t+1)
//                  a[2] = A(g, 2t+8..2t+9)    a[3] = A(g+8, 2t+8..2t+9)
//   B 16x8  (col)  b[0] = B(2t..2t+1, g)      b[1] = B(2t+8..2t+9, g)
//   C 16x8  fp32   c[0..1] = C(g, 2t..2t+1)   c[2..3] = C(g+8, 2t..2t+1)
//   ldmatrix x4    lanes 8i..8i+7 give the addresses of the 8 rows (16
//                  bytes each, 16-byte aligned) of matrix i; r[i] = row g of
//                  matrix i, elements 2t..2t+1; with .trans, elements (2t, g)
//                  and (2t+1, g): a row-major [k][n] tile read as B.
//   cp.async       16 bytes, global to shared, both 16-byte aligned; zero
//                  bytes read (the 16 written as zeros) when !valid; the
//                  shared bytes are undefined until a cp_async_wait covers
//                  the copy's group (cp_async_commit closes a group).
#ifndef KEEL_CUDA_WARP_MMA_H
#define KEEL_CUDA_WARP_MMA_H

#include <stdint.h>

#ifdef __CUDACC__

// d += a b: bf16 A (16x16) and B (16x8), fp32 C (16x8)
__device__ __forceinline__ static void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ static void ldmatrix_x4(uint32_t r[4], const void *row) {
    const unsigned at = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at)
                 : "memory");
}

__device__ __forceinline__ static void ldmatrix_x4_trans(uint32_t r[4], const void *row) {
    const unsigned at = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at)
                 : "memory");
}

__device__ __forceinline__ static void cp_async_16(void *smem, const void *global, bool valid) {
    const unsigned at = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(at), "l"(global), "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ static void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }

// every group but the newest `pending` ones has landed (this thread's copies)
template <int pending> __device__ __forceinline__ static void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(pending) : "memory");
}

#else
#include "cuemu_warp_mma.h" // the emulator's: tests/cuemu/include
#endif

#endif
