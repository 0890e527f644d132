/* ckpt: durable files for model state — the final-weights file of a run
 * (RUN/weights.bin) and sharded checkpoints (DESIGN §5; what to save and
 * when is train/saving.c, where to resume from train/resume.c). The
 * durable-write helpers are core's (keel/core.h, "durable file I/O").
 *
 * weights.bin: 64-byte little-endian header — magic "KEELWTS1", u32 version,
 * u32 dtype (1 = fp32), u64 n_params, u64 XXH3-64 of the payload, zero padding
 * — then n_params fp32 values in the canonical order of keel/model.h.
 */
#ifndef KEEL_CKPT_H
#define KEEL_CKPT_H

#include "keel/model.h"

/* The types of peers this header names only by pointer (keel/fsdp.h and
 * keel/optim.h have them in full). */
typedef struct keel_fsdp_plan keel_fsdp_plan;
typedef struct keel_param_range keel_param_range;

#define KEEL_WEIGHTS_MAGIC "KEELWTS1"
#define KEEL_WEIGHTS_VERSION 1

keel_status keel_weights_save(const char *path, const float *params, int64_t n_params);
/* The same file streamed, so no process ever holds the whole model: begin
 * (a tmp file beside path), append the values in canonical order, commit
 * (the header with the XXH3 of the payload, fsync, rename; *xxh3_hex, if not
 * NULL, gets it as 16 hex digits: summary.json's params_xxh3) or abort. commit and abort
 * free the writer. */
typedef struct keel_weights_writer keel_weights_writer;
keel_status keel_weights_begin(const char *path, int64_t n_params, keel_weights_writer **out);
keel_status keel_weights_append(keel_weights_writer *w, const float *values, int64_t n);
keel_status keel_weights_commit(keel_weights_writer *w, char xxh3_hex[17]);
void keel_weights_abort(keel_weights_writer *w);
/* Load exactly n_params values; a size, magic or checksum mismatch is an input
 * error naming the file. */
keel_status keel_weights_load(const char *path, float *params, int64_t n_params);

/* ---- sharded checkpoints ----------------------------------------------------
 *
 * RUN/checkpoints/step_NNNNNNNN/manifest.json + shard-RRRRR-of-WWWWW.bin, and
 * RUN/checkpoints/LATEST naming the newest committed one. A directory is
 * written as step_NNNNNNNN.tmp and renamed once every file in it is fsync'd
 * (the commit); LATEST is replaced by tmp + fsync + rename after that.
 *
 * Shard file RRRRR holds shard rank RRRRR's buffer of the saved shard plan
 * (keel/fsdp.h: each unit's padded slice, units in order): a 64-byte
 * little-endian header — magic "KEELCKS1", u32 version, u32 shard rank, u32
 * shard ranks, u32 arrays (3), u64 step, u64 floats per array, zero padding —
 * then the fp32 arrays parameters, AdamW m, AdamW v, shard_total floats each.
 * The manifest lists every file with its size and XXH3-64. */
#define KEEL_CKPT_MAGIC "KEELCKS1"
#define KEEL_CKPT_VERSION 1
#define KEEL_CKPT_ARRAYS 3 /* parameters, AdamW m, AdamW v */
#define KEEL_CKPT_HEADER_BYTES 64

typedef struct {
    uint64_t xxh3;
    int64_t bytes;
} keel_ckpt_file;

/* Write one shard file into dir (the step's .tmp directory; created, with
 * its parent, if missing): header + the KEEL_CKPT_ARRAYS arrays of `floats`
 * each, fsync'd. Fills *file.
 * Errors (a full disk, a file-size limit) are one line naming the file;
 * nothing outside dir is touched. */
keel_status keel_ckpt_write_shard(const char *dir, int rank, int ranks, int64_t step,
                                  const float *const arrays[KEEL_CKPT_ARRAYS], int64_t floats,
                                  keel_ckpt_file *file);
/* The same file streamed: begin writes the header, append adds floats in file
 * order (array after array, each in the plan's layout; values NULL appends
 * zeros), finish fsyncs and closes it and fills *file. A failure anywhere is
 * one line at finish; the writer is freed there. */
typedef struct keel_ckpt_writer keel_ckpt_writer;
keel_status keel_ckpt_shard_begin(const char *dir, int rank, int ranks, int64_t step, int64_t floats,
                                  keel_ckpt_writer **out);
keel_status keel_ckpt_shard_append(keel_ckpt_writer *w, const float *values, int64_t n);
keel_status keel_ckpt_shard_finish(keel_ckpt_writer *w, keel_ckpt_file *file);
/* Give up on a file begun: close, remove it, free w. A write of its own that
 * failed is one line here; the failure of the caller's source is the
 * caller's to say. */
void keel_ckpt_shard_abort(keel_ckpt_writer *w);
/* A file a checkpoint carries beside its shards: an import's tokenizer
 * (tokenizer.json or tokenizer.model, tokenizer_config.json) and
 * generation_config.json, kept so export can write them out again. The
 * manifest lists each under "carried_files" with its size and XXH3; open
 * checks that it is there with its size, verification checksums it like a
 * shard. A name is a plain file name of the checkpoint directory. */
#define KEEL_CKPT_MAX_CARRIED 8
typedef struct {
    char name[64];
    int64_t bytes;
    uint64_t xxh3;
} keel_ckpt_carried;
/* One to write: name (a plain file name) and its bytes. */
typedef struct {
    const char *name;
    const void *data;
    size_t bytes;
} keel_ckpt_carry;
/* What a manifest records besides the files. */
typedef struct {
    int64_t step;             /* optimizer steps done: training resumes at this step */
    int64_t global_batch;     /* sequences per step; the data order is (seed, step) */
    int world_size;
    const char *strategy;
    const keel_fsdp_plan *plan;     /* the shard plan the files follow */
    const keel_ckpt_file *files;    /* (plan->shard_ranks) */
    const char *config_json;        /* the run's resolved config */
    uint64_t seed;                  /* train.seed: initialisation and data order */
    double next_lr;                 /* the schedule's learning rate at `step` */
    const keel_ckpt_carried *carried; /* (n_carried) files beside the shards; none in a run's saves */
    int n_carried;
    /* train.lora: the files hold adapters; the frozen base they were trained
     * on (init_from) and its identity (keel_ckpt_identity); NULL otherwise */
    const char *lora_base, *lora_base_id;
} keel_ckpt_meta;
/* manifest.json's text (caller frees). */
char *keel_ckpt_manifest_json(const keel_ckpt_meta *m);
/* The step's directory names: RUN/checkpoints/step_NNNNNNNN[.tmp]. */
void keel_ckpt_dir(char *out, size_t n, const char *run_dir, int64_t step, bool tmp);
/* Commit: write manifest_json into the step's .tmp directory, fsync it and
 * the directory, rename it to step_NNNNNNNN, then point LATEST at it. */
keel_status keel_ckpt_commit(const char *run_dir, int64_t step, const char *manifest_json);
/* The same for any directory: tmp (holding the shard files) becomes dir. */
keel_status keel_ckpt_commit_dir(const char *tmp, const char *dir, const char *manifest_json);
/* Remove a checkpoint directory: its files, then it (a missing one is no error). */
void keel_ckpt_remove_tree(const char *dir);
/* Remove every step_*.tmp directory (a save that never committed). */
void keel_ckpt_clean_tmp(const char *run_dir);
/* Delete the oldest committed checkpoints so that keep_last remain (0 keeps
 * all); never `keep`, the newest good one. */
void keel_ckpt_retain(const char *run_dir, int keep_last, int64_t keep);

/* Committed checkpoints, newest first: LATEST's target, then every other
 * step_* directory by step. *steps is malloc'd (keel_free). */
int keel_ckpt_list(const char *run_dir, int64_t **steps);
/* The step LATEST names, or -1 (none yet, or unreadable). */
int64_t keel_ckpt_latest(const char *run_dir);

/* A checkpoint opened for reading: its manifest and saved shard plan. */
typedef struct {
    char dir[4096];
    int64_t step, global_batch;
    int world_size, shard_ranks;
    char strategy[32];
    keel_fsdp_plan *plan;     /* as saved: units' logical, padded, shard, shard_offset */
    keel_ckpt_file *files;    /* (shard_ranks) from the manifest */
    keel_ckpt_carried *carried; /* (n_carried) files beside the shards, from the manifest */
    int n_carried;
    void *manifest;           /* cJSON of manifest.json */
} keel_ckpt;

/* Parse dir/manifest.json and check that every file exists with its size
 * and header (a carried file: with its size); reasons are one line
 * (KEEL_ERR_INPUT). */
keel_status keel_ckpt_open(const char *dir, keel_ckpt *out);
/* What keel_ckpt_open does with the manifest's text[0, len) (dir names the
 * checkpoint in messages): every number range-checked, the units tiling the
 * parameters and the shard buffer, every file's size the header and arrays
 * they imply (overflow-checked). On failure one line, and *out needs no close.
 * The fuzz harness's entry (tests/fuzz/fuzz_ckpt.c). */
keel_status keel_ckpt_parse_manifest(const char *text, size_t len, const char *dir, keel_ckpt *out);
/* Shard file j's first len bytes (head) and size against the manifest: one
 * line naming path on a mismatch. */
keel_status keel_ckpt_check_shard_header(const keel_ckpt *c, int j, const void *head, size_t len,
                                         int64_t file_bytes, const char *path);
void keel_ckpt_close(keel_ckpt *c);
/* XXH3 of shard file j against the manifest. */
keel_status keel_ckpt_verify_file(const keel_ckpt *c, int j);
/* XXH3 of carried file i against the manifest. */
keel_status keel_ckpt_verify_carried(const keel_ckpt *c, int i);
/* The path of the file `name` the checkpoint carries (a new string:
 * keel_free), or NULL when its manifest lists none of that name. */
char *keel_ckpt_carried_path(const keel_ckpt *c, const char *name);
/* The model the checkpoint was saved from has lay's parameters (its units
 * may be blocks or matrices, whichever fsdp.unit saved it). */
keel_status keel_ckpt_check_layout(const keel_ckpt *c, const keel_model_layout *lay);
/* Read canonical values [begin, begin + len) of array a (0 parameters, 1 m,
 * 2 v) into dst, from whichever files and units hold them. */
keel_status keel_ckpt_read(const keel_ckpt *c, int a, int64_t begin, int64_t len, float *dst);
/* Every parameter (canonical order) after verifying every file; the
 * checkpoint must hold the model of lay. */
keel_status keel_ckpt_load_params(const keel_ckpt *c, const keel_model_layout *lay, float *params);
/* The resolved config saved in the manifest, as JSON text (free()), or NULL. */
char *keel_ckpt_config_json(const keel_ckpt *c);
/* The shard files this rank's canonical ranges come from: sets used[j]. */
void keel_ckpt_files_for(const keel_ckpt *c, const keel_param_range *ranges, int n, bool *used);

/* ---- checkpoints as a model's parameter set (params.c) ------------------------
 * What `keel ckpt`, `keel eval` and init_from use. */

/* XXH3 of every file (shards and carried files) against the manifest. */
keel_status keel_ckpt_verify_all(const keel_ckpt *c);
/* XXH3 of the files that hold these canonical ranges. */
keel_status keel_ckpt_verify_ranges(const keel_ckpt *c, const keel_param_range *ranges, int n);
/* Open path: a checkpoint directory (its files are verified as they are
 * read), or a run directory's newest checkpoint whose files all verify. */
keel_status keel_ckpt_open_any(const char *path, keel_ckpt *out);
/* The config saved in the manifest, finalized, whose model the checkpoint's
 * units hold (keel_ckpt_check_layout): what export, eval and `keel ckpt
 * verify` need before they read. cfg needs keel_config_free afterwards, also
 * on failure. */
keel_status keel_ckpt_load_config(const keel_ckpt *c, keel_config *cfg);
/* What a checkpoint holds, as 16 hex digits: the XXH3 of its manifest's file
 * list (each shard's name, size and XXH3). A copy elsewhere has the same
 * identity; a checkpoint with other contents has another. */
void keel_ckpt_identity(const keel_ckpt *c, char out[17]);
/* A LoRA checkpoint's record of its base (keel_ckpt_meta.lora_base_id), or
 * NULL when the manifest has none. */
const char *keel_ckpt_lora_base_id(const keel_ckpt *c);
/* KEEL_OK when the checkpoint of cfg (its load_config) holds a whole model;
 * one that holds LoRA adapters (train.lora) is an input error saying what to
 * use instead. Export and loading a model ask it. */
keel_status keel_ckpt_need_model(const keel_ckpt *c, const keel_config *cfg);
/* A LoRA checkpoint (adapters, cfg its load_config) merged into its base —
 * cfg's init_from, opened and verified, refused when its identity is not the
 * one the adapters recorded — as a parameter source over the whole model
 * (keel_ckpt_merged_read, ctx: the keel_ckpt_merged): a unit at a time, the
 * base's unit with the unit's adapters added (keel_lora_merge_unit). The base
 * (keel_ckpt_merged_base) carries an import's tokenizer and generation
 * config. adapters must stay open until keel_ckpt_merged_close. */
typedef struct keel_ckpt_merged keel_ckpt_merged;
keel_status keel_ckpt_merged_open(const keel_ckpt *adapters, const keel_config *cfg, keel_ckpt_merged **out);
keel_status keel_ckpt_merged_read(void *merged, int64_t begin, int64_t len, float *dst);
keel_ckpt *keel_ckpt_merged_base(keel_ckpt_merged *m);
void keel_ckpt_merged_close(keel_ckpt_merged *m);
/* A model from path (as keel_ckpt_open_any): *cfg its config (keel_config_free
 * afterwards, also on failure), *params its canonical fp32 parameters
 * (keel_free; NULL on failure), *step (may be NULL) the step it was saved at. */
keel_status keel_ckpt_load_model(const char *path, keel_config *cfg, float **params, int64_t *step);
/* An opened checkpoint as a parameter source (ckpt: the keel_ckpt *; its
 * files are not verified here: keel_ckpt_verify_all first). */
keel_status keel_ckpt_read_params(void *ckpt, int64_t begin, int64_t len, float *dst);
/* cfg's model, read tensor by tensor from a source, as a committed one-file
 * checkpoint at out, a path that must not exist: step 0, AdamW moments zero,
 * cfg in the manifest — a checkpoint to start a run from with init_from —
 * carrying the n_carry files of carry (may be NULL) beside the shard, each
 * written durably before the commit. No more than one tensor is in memory at
 * a time; on failure nothing is left at out or out.tmp. */
keel_status keel_ckpt_write_model(const char *out, const keel_config *cfg, keel_param_source read, void *ctx,
                                  const keel_ckpt_carry *carry, int n_carry);
/* The same for LoRA adapters (cfg's train.lora on a base cfg->init_from whose
 * keel_ckpt_identity is base_id): a checkpoint to start a LoRA run's adapters
 * from with train.lora.init_from (keel ckpt import --from-peft). */
keel_status keel_ckpt_write_adapters(const char *out, const keel_config *cfg, const char *base_id,
                                     keel_param_source read, void *ctx);
/* The file `name` carried by the checkpoint init_from names, when init_from
 * is a checkpoint directory (not a run's) whose manifest lists it and whose
 * copy passes its checksum: a new path (keel_free), else NULL, quietly. What
 * export falls back on for a run started from an imported checkpoint. */
char *keel_ckpt_init_from_carried(const char *init_from, const char *name);
/* The file `name` that goes with the model of checkpoint ck (NULL: a run's
 * final weights) and config cfg: ck's carried copy, else the one carried by
 * cfg's init_from (keel_ckpt_init_from_carried). A new path, or NULL quietly. */
char *keel_ckpt_find_carried(const keel_ckpt *ck, const keel_config *cfg, const char *name);
/* The tokenizer of that model: the tokenizer.json or tokenizer.model ck
 * carries (an import's), else cfg's data.tokenizer if it is readable here,
 * else the one carried by init_from. A new path, or NULL quietly. */
char *keel_ckpt_find_tokenizer(const keel_ckpt *ck, const keel_config *cfg);
/* Bytes of one checkpoint of this model saved by world_size shard ranks. */
int64_t keel_ckpt_bytes(const keel_model_config *model, int world_size);

/* ---- in-memory snapshots (segment.c) ---------------------------------------
 * One shared-memory segment per rank, /dev/shm/keel-snap-<run id>-w<world size>-r<rank>
 * (a replica of rank R's that a buddy keeps: -b<R>), outliving the process:
 * two slots of `floats` floats (the rank's packed shard, in the layout of shard
 * rank `shard_rank` of `shard_ranks`' checkpoint file), each committed with
 * its step and XXH3 after its bytes are written,
 * so a process killed mid-copy leaves the other slot good. The run id is the
 * XXH3 of the run directory's real path, device and inode.
 *
 *     keel_snap *s;
 *     keel_snap_open("runs/x", &shape, key, false, &s);     // attach, or create empty
 *     int slot;
 *     float *dst = keel_snap_begin(s, step, &slot);         // the older slot, now "writing"
 *     ...copy the shard into dst...
 *     keel_snap_commit(s, slot, step);
 *     int64_t steps[2];
 *     int n = keel_snap_steps(s, steps);                    // committed steps, newest first
 *     const float *src;
 *     keel_snap_get(s, steps[0], &src);                     // checksum verified
 *     keel_snap_close(s, false);                            // the segment stays
 *     keel_snap_remove_run("runs/x");                      // the run is over: every rank's segment goes
 *
 * A segment of another shape (layout, floats), key (what its state must
 * match to be resumed) or version is emptied on open; its pages are allocated
 * then (posix_fallocate), so a full /dev/shm is an error there, not a SIGBUS later. */
typedef struct keel_snap keel_snap;
typedef struct {
    int rank, world_size;        /* whose segment (a replica's: the rank it copies) */
    int shard_ranks, shard_rank; /* the packed shard's layout */
    int64_t floats;              /* per slot */
} keel_snap_shape;
keel_status keel_snap_run_id(const char *run_dir, uint64_t *id, char *real, size_t real_n);
keel_status keel_snap_open(const char *run_dir, const keel_snap_shape *shape, uint64_t key, bool replica,
                           keel_snap **out);
keel_snap_shape keel_snap_get_shape(const keel_snap *s);
/* This run's segments (own and replicas) of world sizes other than
 * world_size with this key, mapped read-only: what a relaunch on another
 * number of ranks reshards from. *out is malloc'd (keel_free; close each). */
int keel_snap_open_others(const char *run_dir, int world_size, uint64_t key, keel_snap ***out);
int keel_snap_steps(const keel_snap *s, int64_t steps[2]);
/* The slot to write `step` into, marked "writing": an empty one, else the
 * older. Committed steps at or after `step` are dropped first: they belong to
 * a timeline a relaunch abandoned when it resumed from an older step. */
float *keel_snap_begin(keel_snap *s, int64_t step, int *slot);
void keel_snap_commit(keel_snap *s, int slot, int64_t step);
/* One piece of a slot's contents from host memory: n floats from src, at float `at` of the slot. */
typedef struct {
    int64_t at;
    const float *src;
    int64_t n;
} keel_snap_piece;
/* Copy the pieces into the slot begun for `step` and commit it, reading the
 * state once: each piece is hashed while in cache and streamed into the slot
 * past the caches (nothing reads it soon). Half the memory traffic of a copy
 * and then keel_snap_commit. The pieces (sorted by `at` here) must not overlap;
 * the slot's bytes between them (padding) are hashed as they are. */
void keel_snap_fill(keel_snap *s, int slot, int64_t step, keel_snap_piece *pieces, int n);
/* The committed slot of `step`, its checksum verified; an input error naming the segment otherwise. */
keel_status keel_snap_get(const keel_snap *s, int64_t step, const float **data);
const char *keel_snap_path(const keel_snap *s);
/* The segment's mapping (to pin it for a device's copies). */
void keel_snap_mapping(const keel_snap *s, void **base, size_t *bytes);
/* Unmap; remove: unlink the segment too (the rank's run is over). */
void keel_snap_close(keel_snap *s, bool remove);
/* Unlink every segment of this run. How many went. */
int keel_snap_remove_run(const char *run_dir);
/* Unlink this user's segments of runs whose directory is gone or is another run now —
 * judged only for segments made in this process's mount namespace, where their run
 * directory's path means what it meant to their creator — unreadable ones, and creations
 * abandoned over 10 minutes ago. How many went. */
int keel_snap_remove_stale(void);
/* Unlink this run's segments of world sizes other than world_size (a resume on
 * world_size is done with them). How many went. */
int keel_snap_remove_other_worlds(const char *run_dir, int world_size);

#endif
