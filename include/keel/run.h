/* run: the run directory — the contract between the supervisor and the
 * workers. Neither calls the other; both read and write here.
 *
 *   RUN/config.json         the resolved config (every key), written before any
 *                           rank starts (keel_run_prepare), read by every rank
 *   RUN/metrics.jsonl       one line per optimizer step (the leader rank)
 *   RUN/events.jsonl        one line per decision (keel/monitor.h keel_event)
 *   RUN/summary.json        the leader's report at the end; the supervisor adds its own
 *   RUN/supervisor.json     the supervisor's state that workers read (skipped data windows)
 *   RUN/heartbeats/rank-R   each rank's progress marker (below)
 *   RUN/logs/rank-R.log     each rank's log; launcher.log the launcher's messages
 *   RUN/checkpoints/        sharded checkpoints (keel/ckpt.h)
 *   RUN/weights.bin         the final parameters (keel/ckpt.h)
 *   RUN/profile.json        with train.profile_steps: the leader's calls, timed
 *   RUN/endpoint.json       the metrics endpoint's URL while a process serves it (keel/monitor.h)
 *
 *     keel_run_prepare(&cfg, "runs/x", 4);       // supervisor: validate, new or resume, create
 *     keel_run_load_config("runs/x", &cfg);      // each worker
 *     keel_heartbeat *hb = keel_heartbeat_open("runs/x", rank);
 *     keel_heartbeat_beat(hb, "train", step, 0); // ... the supervisor reads it
 */
#ifndef KEEL_RUN_H
#define KEEL_RUN_H

#include "keel/backend.h"
#include "keel/core.h"

#define KEEL_RUN_CONFIG "config.json"
#define KEEL_RUN_METRICS "metrics.jsonl"
#define KEEL_RUN_SAMPLES "samples.jsonl"
#define KEEL_RUN_SUMMARY "summary.json"
#define KEEL_RUN_SUPERVISOR "supervisor.json"
#define KEEL_RUN_WEIGHTS "weights.bin"
#define KEEL_RUN_PROFILE "profile.json"
#define KEEL_RUN_ENDPOINT "endpoint.json"
#define KEEL_RUN_LOGS "logs"

/* out := RUN/name. */
void keel_run_path(char *out, size_t n, const char *run_dir, const char *name);

/* Everything a run is checked for before anything is written, then the
 * directory: run_dir must be new, empty, or hold a run of the same model to
 * resume (cfg may differ only in the keys a resume may change; then
 * train.grad_accum_steps is set to keep the newest checkpoint's global batch
 * on world_size ranks); memory, init_from, data and tokenizer are checked;
 * then RUN, RUN/logs and RUN/config.json (the resolved cfg, replacing a
 * resumed run's atomically) are written. Input problems are one error line. */
keel_status keel_run_prepare(keel_config *cfg, const char *run_dir, int world_size);
/* The same for ranks_per_node ranks on each machine (keel agent's nodes;
 * keel_run_prepare takes this machine's, or a Slurm allocation's spread).
 * later_round: a later round of the job that prepared run_dir (keel agent),
 * so the summary a failed round left is no finished run. */
keel_status keel_run_prepare_nodes(keel_config *cfg, const char *run_dir, int world_size, int ranks_per_node,
                                   bool later_round);

/* In a relaunch after a failure the supervisor sets this in the ranks'
 * environment: they run the mpi health check (keel_comm_probe) as their first
 * collective instead of a probe job of its own, rank 0 logs its `health`
 * event, and a failure exits KEEL_EXIT_UNHEALTHY. */
#define KEEL_MPI_PROBE_ENV "KEEL_MPI_PROBE"

/* What a run's saved state must match to be resumed (in-memory snapshots'
 * key): the XXH3 of cfg without the keys a resume may change, and the
 * global batch (sequences per step: the data order). */
uint64_t keel_run_state_key(const keel_config *cfg, int64_t global_batch);

/* The checks a rank repeats where it runs: the memory ranks_here ranks of a
 * world_size run need on this machine, and that init_from is a checkpoint of
 * cfg's model — with train.lora the base, which must be the one the run's
 * newest checkpoint of adapters was trained on (run_dir may be NULL: no such
 * check). */
keel_status keel_run_check_memory(const keel_config *cfg, int world_size, int ranks_here);
/* The part of a rank's memory that lives on its device (a GPU: the model's
 * state and activations), against what be says is free there. Only in the
 * process that uses the device, once bound to it: asking a GPU creates a
 * context on it, which a supervisor must not hold for the whole run. */
keel_status keel_run_check_device_memory(const keel_config *cfg, int world_size, int ranks_here,
                                         const keel_backend *be);
keel_status keel_run_check_init_from(const keel_config *cfg, const char *run_dir);

/* A worker's config: RUN/config.json, finalized. cfg needs keel_config_free
 * afterwards, also on failure. */
keel_status keel_run_load_config(const char *run_dir, keel_config *cfg);

/* RUN/logs/rank-R.log: where rank R of a distributed run logs. */
void keel_run_rank_log_path(char *out, size_t n, const char *run_dir, int rank);

/* RUN/name := text + "\n", atomically (tmp + fsync + rename). */
keel_status keel_run_write_file(const char *run_dir, const char *name, const char *text);

/* ---- a stop on request (stopped.c) ------------------------------------------------
 * The line that ends a run stopped on a signal after `done` steps, whose
 * newest committed checkpoint is at step `checkpoint` (0: none): what is
 * saved and how to go on, into line (n bytes). Returns the exit code:
 * KEEL_EXIT_RESUME only when there is a checkpoint to resume from, else 1.
 * The one wording for the supervisor's report and a rank's own. */
int keel_run_stopped(int64_t done, int64_t checkpoint, bool checkpointing, char *line, size_t n);

/* ---- heartbeats: RUN/heartbeats/rank-R (heartbeat.c) -------------------------
 * Written by each rank (phase, steps done, time, pid, node), read by the
 * supervisor. Phases: "init" (started), "ready" (state loaded; step = the
 * checkpoint's step), "train" (step = steps done), "finish" (the last save,
 * final weights and summary: waits on disks, not on peers' steps), "exit"
 * (exit_code set).
 * A step < 0 repeats the last one. A beat is written at once. */
typedef struct keel_heartbeat keel_heartbeat;
keel_heartbeat *keel_heartbeat_open(const char *run_dir, int rank); /* NULL: could not (warned) */
void keel_heartbeat_beat(keel_heartbeat *hb, const char *phase, int64_t step, int exit_code);
/* Work goes on: what the rank is doing now ("forward", "backward", "optimizer",
 * "checkpoint", "eval", "snapshot") and the time of this progress, kept for the next write
 * (without a beat thread, written at most once a second). A step of a large
 * model takes minutes; its units take seconds each, and a rank stuck in one
 * stops making progress. */
void keel_heartbeat_progress(keel_heartbeat *hb, const char *doing);
/* The state was loaded in `seconds` from `source` ("disk", or "none" for a
 * fresh start): carried from the next beat on (the supervisor's recovery split). */
void keel_heartbeat_restored(keel_heartbeat *hb, double seconds, const char *source);
/* Where the rank is in its sequence of collectives (keel_comm_stats'
 * issued, running, waiting), asked for by the beat thread before each write. */
typedef void (*keel_heartbeat_sampler)(void *ctx, uint64_t *issued, uint64_t *running, uint64_t *waiting);
/* Start the beat thread: the line rewritten every KEEL_BEAT_INTERVAL_S with
 * the state now, however long the rank's own work or waits take. A process
 * that stops beating is frozen (SIGSTOP, a debugger) or dead. */
#define KEEL_BEAT_INTERVAL_S 0.5
void keel_heartbeat_start_beating(keel_heartbeat *hb, keel_heartbeat_sampler sampler, void *ctx);
/* A step is done: it took step_s, of which compute_s computing (not waiting
 * on peers). Kept for the next beats with the process's RSS and CPU time
 * now, its CPU use over the step (CPU seconds over wall seconds x the rank's
 * threads, 0-1) and the step time histogram's counts — what the supervisor
 * compares across ranks (stragglers) and the metrics endpoint shows. */
void keel_heartbeat_step_done(keel_heartbeat *hb, double step_s, double compute_s, int threads);
void keel_heartbeat_close(keel_heartbeat *hb);

/* Upper bounds (seconds) of the step time histogram's buckets; +Inf after them. */
#define KEEL_STEP_BUCKETS 12
extern const double keel_step_bucket_s[KEEL_STEP_BUCKETS];

typedef struct {
    char phase[16];
    int64_t step, start_step;  /* steps done; the step this launch resumed from (-1 before ready) */
    double unix_s;             /* wall-clock time of the beat */
    double first_step_unix_s;  /* when this launch finished its first step (0 before) */
    int pid, exit_code;
    char node[64];
    char slurm_step[32];       /* "JOB.STEP", or "-" outside Slurm */
    /* the last step done by this process (0 before one) */
    double step_s, step_unix_s;  /* its time; when it finished */
    double compute_s;            /* its time less the waits on peers */
    uint64_t rss_bytes;          /* at its end */
    double cpu_s, cpu_util;      /* process CPU seconds then; CPU use over the step, 0-1 */
    /* step times of this process: counts per bucket (cumulative, as Prometheus), their sum */
    uint64_t step_buckets[KEEL_STEP_BUCKETS + 1];
    double step_sum_s;
    /* progress: its last time; what the rank was doing then ("wait" while blocked on a
     * collective); the collectives it issued, the one its comm thread runs, the one it waits for */
    double progress_unix_s;
    char doing[16];
    uint64_t coll_issued, coll_running, coll_waiting;
    double ready_unix_s, restore_s; /* when its state was loaded (0 before); how long that took */
    char restore_source[16];        /* where the state came from: "disk", "none" (a fresh start) */
} keel_heartbeat_info;
/* false when rank's file is missing or caught mid-write. */
bool keel_heartbeat_read(const char *run_dir, int rank, keel_heartbeat_info *out);
void keel_heartbeat_clear(const char *run_dir, int ranks);

/* ---- watching ranks by their heartbeats (watch.c) ----------------------------------
 * One set of rules for whoever watches: the supervisor over every rank, and
 * in Slurm task mode (no supervisor) each rank over its peers. A rank that
 * stops beating is frozen or dead: it is named. Ranks that beat without
 * progress are stuck: the peers of a rank that never arrived run the
 * collective it never issued (the lowest one running anywhere); that rank is
 * named. The hang limit: resilience.hang_timeout_s, or once steps are steady
 * (KEEL_WATCH_STEADY timed steps of rank 0 in this launch) hang_factor x the
 * median step, at least hang_floor_s; before that, and while a rank
 * checkpoints or evaluates, 10 x the slowest progress gap seen, at least 60 s
 * (120 s before the first step). */
#define KEEL_WATCH_WINDOW 32 /* rank 0's newest step times kept for the median */
#define KEEL_WATCH_STEADY 3
typedef struct {
    const keel_resilience_config *rc;
    int nproc;
    keel_heartbeat_info *hb; /* (nproc) the last beat read of each rank */
    bool *have;              /* (nproc) a beat was read */
    double launched_unix;
    double slowest_gap_s;    /* the longest time between two progress marks of a training rank seen */
    double step_s[KEEL_WATCH_WINDOW]; /* rank 0's step times in this launch (its first, the warm-up, left out) */
    int n_step_s;
    int64_t last_step;
    char slurm_step[32];     /* non-empty: only beats of this Slurm step count (an earlier attempt's are stale) */
} keel_watch;

/* What a watch found: the rank to name, when it was last seen alive, why. */
typedef struct {
    int rank;
    double onset_unix;
    char cause[768];
} keel_watch_finding;

/* Watch nproc ranks launched at launched_unix; slowest_gap_s carries what an
 * earlier launch of the run saw (0: nothing). Free with keel_watch_free. */
void keel_watch_init(keel_watch *w, const keel_resilience_config *rc, int nproc, double launched_unix,
                     double slowest_gap_s);
void keel_watch_free(keel_watch *w);
/* Read every rank's heartbeat now. */
void keel_watch_read(keel_watch *w, const char *run_dir);
/* A rank gone without saying goodbye: its pid dead, judged only where the
 * pid is this machine's — every rank when `all_local`, else ranks whose node
 * is `node` (NULL: none) — while no rank has said it exits. */
bool keel_watch_dead(const keel_watch *w, bool all_local, const char *node, keel_watch_finding *f);
/* A hang at `now` (see above); `all_local`/`node` as for keel_watch_dead, to
 * name a stopped (SIGSTOP, debugger) process. */
bool keel_watch_hung(const keel_watch *w, double now, bool all_local, const char *node, keel_watch_finding *f);

/* ---- supervisor.json (state.c) -------------------------------------------------
 * What the supervisor decided that outlives one launch: written by the
 * supervisor, read by the workers (the data windows to skip) and by the next
 * supervisor of the same run. */
typedef struct {
    int restarts;
    int64_t *skip_steps;    /* (n_skips) ascending: steps (1-based, as events name them)
                               whose data window is skipped */
    int n_skips;
    char **excluded_nodes;  /* (n_excluded) drained or excluded after failed health checks */
    int n_excluded;
} keel_run_state;

/* Read RUN/supervisor.json; a run without one has the empty state. A damaged
 * file is an input error naming it. Free with keel_run_state_free. */
keel_status keel_run_state_read(const char *run_dir, keel_run_state *out);
keel_status keel_run_state_write(const char *run_dir, const keel_run_state *s);
void keel_run_state_free(keel_run_state *s);
/* Add step to the skipped windows (kept ascending, no duplicates). */
void keel_run_state_skip(keel_run_state *s, int64_t step);
/* The data window the step with 0-based index step_index (steps done before
 * it) trains on: step_index + the skipped steps up to and including it, so
 * a skipped step takes the next window and every later step shifts by one. */
uint64_t keel_run_data_window(const keel_run_state *s, int64_t step_index);

#endif
