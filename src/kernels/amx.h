/* kernels/amx.h: the AMX tile configuration keel's tile kernels load
 * (peak.c's yardstick, attention_amx.c's products). Include it after
 * <immintrin.h>.
 *
 * Palette 1 in Intel's 64-byte layout: a start row, then the bytes per row
 * and the rows of tiles 0-15. keel uses tiles 0-7 at their largest, 16 rows
 * of 64 bytes (16 fp32 or 32 bf16 a row). Only for code that runs where
 * keel_isa_active() is AMX, which includes the kernel's permission (isa.c).
 * GCC's tile intrinsics are asm that does not declare the memory they read,
 * hence the barrier before the load. */
#ifndef KEEL_KERNELS_AMX_H
#define KEEL_KERNELS_AMX_H

#include <stdint.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tile_config;

/* Tiles 0-7 as 16 rows of 64 bytes, loaded on this thread (release with _tile_release). */
__attribute__((target("amx-tile"))) static inline void amx_load_16x64(void) {
    _Alignas(64) amx_tile_config cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

#endif
