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
/* The same for one file dir/name (e.g. PEFT's adapter_model.safetensors). */
keel_status safetensors_open_file(const char *dir, const char *name, safetensors_dir **out);
/* Whether tensor t is there, of a dtype keel reads and exactly t's shape
 * (opening its file if needed): one line if not. keel_hf_open checks every
 * tensor so before anything is allocated or written. */
keel_status safetensors_check(safetensors_dir *d, const safetensors_tensor *t);
/* Read tensor t, which must have exactly t's shape, into dst as fp32. */
keel_status safetensors_read(safetensors_dir *d, const safetensors_tensor *t, float *dst);
void safetensors_close_dir(safetensors_dir *d);

/* What opening a file does with its first bytes, head[0, have) (the 8-byte
 * length and the JSON header it announces; have may stop after the length
 * when that is too large for the file), file_bytes being the file's size:
 * the length within 100 MiB and the file; the header a JSON object whose
 * __metadata__ is an object of strings and whose every other entry has a
 * dtype, a shape of integers >= 0 and data_offsets [begin, end]; each
 * F32/F16/BF16 tensor exactly the bytes its shape needs (overflow-checked);
 * no name twice; and the tensors' bytes tiling the data exactly, as the
 * safetensors library requires (no overlap, no gap, nothing past the end).
 * On success *header (cJSON_Delete) and *data_start (8 + the header's
 * length); else one line naming path (and the tensor). The fuzz harness's
 * entry (tests/fuzz/fuzz_hf.c). */
keel_status safetensors_parse_header(const uint8_t *head, size_t have, int64_t file_bytes, const char *path,
                                     cJSON **header, int64_t *data_start);
/* model.safetensors.index.json's text[0, len): a JSON object whose
 * "weight_map" maps names to plain file names of the same directory (no
 * "/", not "." or ".."). *index (cJSON_Delete) or one line naming path. */
keel_status safetensors_parse_index(const char *text, size_t len, const char *path, cJSON **index);

/* text[0, len) as a JSON object (cJSON_Delete), or NULL after one line naming
 * path: invalid JSON near line L, not an object. */
cJSON *safetensors_parse_json_object(const char *text, size_t len, const char *path);
/* The same for the file path (a regular file of at most 256 MiB): also
 * "cannot open `what`". The config.json beside the tensors is read with
 * this. */
cJSON *safetensors_read_json_object(const char *path, const char *what);
/* name for a message line: control characters as '?', at most size - 1
 * bytes ("..." when cut). */
void safetensors_printable(char *out, size_t size, const char *name);

#endif
