// tests/cuemu/include/cuemu_warp_mma.h: src/cuda/warp_mma.h's functions on
// the host emulator (their implementations: ../cuemu.cpp). Each is what the
// PTX instruction does, lane by lane, with the layouts warp_mma.h states:
//   mma_bf16_16816  a warp collective (every lane, as .sync.aligned wants):
//                   each lane's d from every lane's a and b, bf16 products
//                   (exact in fp32) summed in fp32 in k order onto d;
//   ldmatrix_x4     a warp collective: each lane's registers gathered from
//                   the rows the lanes point at (16-byte aligned, inside the
//                   block's shared memory, or the run stops);
//   cp_async_16     the 16 shared bytes are NaN from the issue until a wait
//                   covers the copy's group, and the copy reads the global
//                   bytes only then: a read before the wait, or a wait that
//                   covers too little, sees NaN; a block that ends with
//                   copies it never waited for stops the run.
#ifndef KEEL_CUEMU_WARP_MMA_H
#define KEEL_CUEMU_WARP_MMA_H

#include <stdint.h>

namespace cuemu {
// named apart from the macros below, which the expansions would otherwise meet again
void mma_16816(int line, float d[4], const uint32_t a[4], const uint32_t b[2]);
void ldsm_x4(int line, uint32_t r[4], const void *row, bool trans);
void cp_async16(int line, void *smem, const void *global, bool valid);
void cp_async_close_group();
void cp_async_wait_groups(int pending);
} // namespace cuemu

#define mma_bf16_16816(...) cuemu::mma_16816(__LINE__, __VA_ARGS__)
#define ldmatrix_x4(r, row) cuemu::ldsm_x4(__LINE__, r, row, false)
#define ldmatrix_x4_trans(r, row) cuemu::ldsm_x4(__LINE__, r, row, true)
#define cp_async_16(...) cuemu::cp_async16(__LINE__, __VA_ARGS__)
static inline void cp_async_commit(void) { cuemu::cp_async_close_group(); }
template <int pending> static inline void cp_async_wait(void) { cuemu::cp_async_wait_groups(pending); }

#endif
