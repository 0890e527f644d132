/* ckpt: durable files for model state. Today: the final-weights file of a run
 * (RUN/weights.bin) and the durable-write helper every module uses; sharded
 * checkpoints arrive here next (DESIGN §5).
 *
 * weights.bin: 64-byte little-endian header — magic "KEELWTS1", u32 version,
 * u32 dtype (1 = fp32), u64 n_params, u64 XXH3-64 of the payload, zero padding
 * — then n_params fp32 values in the canonical order of keel/model.h.
 */
#ifndef KEEL_CKPT_H
#define KEEL_CKPT_H

#include "keel/core.h"

#define KEEL_WEIGHTS_MAGIC "KEELWTS1"
#define KEEL_WEIGHTS_VERSION 1

/* Write `bytes` to path durably: tmp file in the same directory, fsync, rename,
 * fsync the directory. On error the old file is untouched and the tmp removed. */
keel_status keel_write_file_atomic(const char *path, const void *data, size_t bytes);

keel_status keel_weights_save(const char *path, const float *params, int64_t n_params);
/* Load exactly n_params values; a size, magic or checksum mismatch is an input
 * error naming the file. */
keel_status keel_weights_load(const char *path, float *params, int64_t n_params);
/* XXH3-64 of params as fp32 (summary.json's params_xxh3), as 16 hex digits + NUL. */
void keel_params_xxh3_hex(const float *params, int64_t n_params, char out[17]);

#endif
