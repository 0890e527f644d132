/* hf/safetensors.h: the safetensors file format, internal to the hf module
 * (hf.c maps keel's Llama parameters onto it).
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON
 * ({"__metadata__": {...}, "<tensor>": {"dtype", "shape", "data_offsets"}}),
 * padded with spaces to a multiple of 8, then the tensors' data back to back;
 * data_offsets are relative to the end of the header. A model split over
 * several files has model.safetensors.index.json, whose "weight_map" names
 * the file of each tensor.
 *
 * Writing: keel writes F32 only, tensors in the caller's order, data straight
 * from the caller's buffer. Reading: F32, F16 and BF16, converted to fp32
 * exactly; every problem is one line naming the file (and the tensor) and
 * KEEL_ERR_INPUT. */
#ifndef KEEL_HF_SAFETENSORS_H
#define KEEL_HF_SAFETENSORS_H

#include <cjson/cJSON.h>

#include "keel/core.h"

#define SAFETENSORS_SINGLE "model.safetensors"
#define SAFETENSORS_INDEX "model.safetensors.index.json"

/* A tensor as the format sees it: a name and a 1- or 2-dimensional shape. */
typedef struct {
    const char *name;
    int ndim;          /* 1 or 2 */
    int64_t shape[2];  /* shape[1] unused when ndim is 1 */
} safetensors_tensor;

/* Its bytes as F32. */
int64_t safetensors_f32_bytes(const safetensors_tensor *t);

/* ---- writing ------------------------------------------------------------------ */

/* The header (length + JSON, padded) of a file holding t[0..n) as F32, data
 * back to back in that order. New buffer (keel_free); *bytes is its size. */
uint8_t *safetensors_header(const safetensors_tensor *t, int n, size_t *bytes);

/* Which file each of t[0..n) goes to (file_of[i], in order) when a file may
 * hold at most max_file_bytes of data (0 = no limit): a new file whenever the
 * next tensor would pass the limit; a tensor is never split, one larger than
 * the limit gets a file of its own. Returns the number of files; *indexed is
 * true when the data exceeds the limit, so the files need an index (and the
 * sharded names) even if one file results. */
int safetensors_plan_files(const safetensors_tensor *t, int n, int64_t max_file_bytes, int *file_of,
                           bool *indexed);
/* File i's name (out holds 64): model.safetensors, or
 * model-0000I-of-0000N.safetensors when indexed (I from 1). */
void safetensors_file_name(char *out, int i, int n_files, bool indexed);
/* model.safetensors.index.json's text for that plan (keel_free); *len its
 * length. */
char *safetensors_index_json(const safetensors_tensor *t, int n, const int *file_of, int n_files,
                             size_t *len);

/* ---- reading ------------------------------------------------------------------ */

/* The tensors of a directory: its model.safetensors, or the files its
 * model.safetensors.index.json maps them to (each opened once, when first
 * needed). */
typedef struct safetensors_dir safetensors_dir;

/* Open dir's tensors (the index is read now, shard files later). On error one
 * line, *out NULL. */
keel_status safetensors_open_dir(const char *dir, safetensors_dir **out);
/* Read tensor t, which must have exactly t's shape, into dst as fp32. */
keel_status safetensors_read(safetensors_dir *d, const safetensors_tensor *t, float *dst);
void safetensors_close_dir(safetensors_dir *d);

/* path as a JSON object (cJSON_Delete), or NULL after one line naming path:
 * cannot open `what`, invalid JSON near line L, not an object. The index and
 * the config.json beside it are read with this. */
cJSON *safetensors_read_json_object(const char *path, const char *what);

#endif
