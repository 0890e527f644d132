/* resil: starting ranks, watching them, and deciding what to do when they
 * fail (DESIGN §6): the launchers and process plumbing (launch.c), node
 * health checks (health.c), the policy — pure functions from what happened
 * to what to do next (policy.c) — and the supervisor that `keel train
 * --nproc N` runs (supervisor.c). The supervisor meets the workers only in
 * the run directory (keel/run.h).
 *
 *     int code;
 *     keel_run_prepare(&cfg, "runs/x", 4);        // validate and create the run directory
 *     keel_supervise(&cfg, "runs/x", 4, &code);   // keel worker runs/x on 4 ranks, relaunched
 *                                                 // from the last checkpoint after failures
 */
#ifndef KEEL_RESIL_H
#define KEEL_RESIL_H

#include "keel/core.h"
#include "keel/run.h"

/* ---- launching (launch.c) ------------------------------------------------------ */

typedef struct {
    int nproc;
    const char *nodelist; /* Slurm: the nodes to run on (srun -w), NULL = srun's choice */
    int nodes;            /* Slurm: how many (srun -N), 0 = srun's choice */
} keel_launch_spec;

/* True inside a Slurm allocation (SLURM_JOB_ID set): ranks start with srun. */
bool keel_launch_in_slurm(void);
/* True when KEEL_LAUNCHER=local (keel train --launcher local): ranks start
 * with keel's own launcher and talk over Gloo, no MPI launcher involved. */
bool keel_launch_is_local(void);
/* True when the ranks are this machine's processes, to watch and signal by
 * pid: keel's own launcher, or mpirun with no Slurm allocation and no
 * default hostfile. Over a hostfile (a Kubeflow MPIJob's launcher pod) and
 * in Slurm the ranks run on other hosts. */
bool keel_launch_ranks_here(void);
/* The command that starts spec->nproc ranks of `keel ARGS...`: mpirun on
 * loopback (as root, oversubscribed), in a Slurm allocation srun --mpi=pmix,
 * or with KEEL_LAUNCHER=local `keel launch -n N --`. argv is NULL-terminated,
 * malloc'd; free with keel_launch_argv_free. */
char **keel_launch_argv(const char *keel_path, const keel_launch_spec *spec, const char *const *args);
void keel_launch_argv_free(char **argv);
/* Ranks of keel's own starting (spawn.c): n children running argv, world
 * ranks first_rank.. of world_size, each with KEEL_TRANSPORT=gloo,
 * KEEL_RANK, KEEL_WORLD_SIZE, KEEL_STORE, KEEL_STORE_PREFIX and (host not
 * NULL) KEEL_HOST. */
typedef struct {
    int n, first_rank, world_size;
    const char *store, *prefix, *host;
    char *const *argv;
} keel_ranks_spec;
typedef struct keel_ranks keel_ranks;
keel_status keel_ranks_start(const keel_ranks_spec *spec, keel_ranks **out);
/* Reap the ranks that exited (never blocks); true once all are gone. A
 * failed rank is named on stderr as mpirun names it, the others get GRACE
 * (3 s) before SIGKILL; *exit_code is the first failure's (0: none so far). */
bool keel_ranks_poll(keel_ranks *r, int *exit_code);
/* The world rank that failed first, or -1. */
int keel_ranks_failed(const keel_ranks *r);
void keel_ranks_signal(keel_ranks *r, int sig);
/* SIGKILL and reap what is left; free r. */
void keel_ranks_free(keel_ranks *r);
/* `keel launch -n N -- PROGRAM ARGS...`: N ranks of PROGRAM here, on
 * loopback, with a file store of this launch's own; waits for all.
 * *exit_code is the first failure's (0 when all succeeded). */
keel_status keel_launch_local(int n, char *const *argv, int *exit_code);
/* This executable's path (/proc/self/exe). */
keel_status keel_self_path(char *out, size_t n);
/* Environment for launched ranks: KEEL_TTY, and OpenMPI on loopback only
 * unless the ranks span hosts (a Slurm allocation, or mpirun's default
 * hostfile set as an MPIJob's launcher has it). */
void keel_launch_env(void);
/* OpenMPI's shared-memory files of the local ranks (btl vader) go to a
 * directory of this supervisor's, /dev/shm/keel-mpi-<pid> (unless the user set
 * OMPI_MCA_btl_vader_backing_directory, or ranks span hosts): ranks killed by a failure never
 * remove theirs, the supervisor does after each launch. dir[0] = 0: not ours. */
void keel_launch_shm_begin(char *dir, size_t n);
/* Remove the files in dir (every rank of the launch is gone); and dir itself if `last`. */
void keel_launch_shm_clear(const char *dir, bool last);
/* Run argv (execvp, never a shell), keep up to n-1 bytes of its stdout in out
 * (NUL-ended; the rest is read and dropped), kill it after timeout_s (0 =
 * no limit). Returns its exit status, 128+signal, 124 when it timed out, or
 * -1 when it could not start. */
int keel_run_capture(char *const *argv, double timeout_s, char *out, size_t n);
/* What keel_run_collect kept of a command's streams. */
#define KEEL_RUN_STDOUT 1u
#define KEEL_RUN_STDERR 2u
typedef struct {
    char *out, *err;       /* stdout, stderr: NUL-ended, malloc'd ("" for a stream not kept) */
    bool out_cut, err_cut; /* more came than max_bytes: the rest was read and dropped */
    int exec_errno;        /* != 0: argv[0] could not be run (ENOENT: not found); the exit code is 127 */
} keel_run_output;
/* Run argv (execvp, never a shell) to its end, keeping up to max_bytes of each
 * stream named in `keep` (KEEL_RUN_STDOUT | KEEL_RUN_STDERR; a stream not kept
 * stays ours: `keel k8s logs` streams kubectl's stdout and keeps its stderr
 * for the error line). With timeout_s > 0 the command runs in a process group
 * of its own, killed when the time is up; with 0 (no limit) it stays in ours,
 * so a terminal's Ctrl-C ends it with us. Returns its exit status, 128+signal,
 * 124 when it timed out, or -1 when it could not fork; *o is the caller's to
 * free with keel_run_output_free (also after -1). */
int keel_run_collect(char *const *argv, double timeout_s, unsigned keep, size_t max_bytes, keel_run_output *o);
void keel_run_output_free(keel_run_output *o);
/* The rank a launcher's stderr line blames, or -1 (mpirun: "process rank N",
 * srun: "task N"); *sig becomes the signal it names, or 0. */
int keel_launch_blamed_rank(const char *line, int *sig);

/* A child process in a process group of its own (a terminal's Ctrl-C reaches
 * the supervisor only), its stderr piped to us line by line. */
typedef struct keel_proc keel_proc;
typedef void (*keel_line_fn)(void *ctx, const char *line);
/* Start argv; on failure to fork the status is KEEL_ERR_IO (an exec failure
 * is the child's exit code 127 with a line on its stderr). */
keel_status keel_proc_start(char *const *argv, keel_proc **out);
/* Wait up to timeout_ms for stderr output and pass each complete line to fn;
 * returns at once when the pipe has closed. */
void keel_proc_read_lines(keel_proc *p, int timeout_ms, keel_line_fn fn, void *ctx);
/* Reap without blocking: true once it exited; *exit_code its status or 128+signal. */
bool keel_proc_exited(keel_proc *p, int *exit_code);
/* Signal the whole process group. */
void keel_proc_kill(keel_proc *p, int sig);
/* Pass what is left of its stderr to fn, kill anything left in its group,
 * reap it if keel_proc_exited has not, and free p. Returns its exit code. */
int keel_proc_finish(keel_proc *p, keel_line_fn fn, void *ctx);

/* ---- health checks: keel health (health.c) -------------------------------------- */

/* The gpu check's limits (health_gpu.c): the node config's "gpu" object, each
 * key defaulting to keel_gpu_limits_defaults's value (docs/auto-resume.md, "Health checks").
 * A GPU fails on any one of them. */
#define KEEL_GPU_BASELINE_DEFAULT "/var/lib/keel/gpu-baseline.json"
#define KEEL_GPU_XID_IGNORE_MAX 32
typedef struct {
    char baseline[1024];          /* the XID baseline file; "" = KEEL_GPU_BASELINE_DEFAULT */
    double xid_max;               /* XIDs per GPU since the baseline (kernel log) or during the check (NVML) */
    unsigned xid_ignore[KEEL_GPU_XID_IGNORE_MAX]; /* application XIDs (13, 31, 43, 45, 68): not counted */
    int n_xid_ignore;
    double temp_max_c;
    double ecc_uncorrected_max;   /* volatile (since the driver loaded) uncorrected ECC errors */
    double remapped_rows_uncorrectable_max;
    bool fail_on_row_remap_pending, fail_on_row_remap_failure;
    unsigned clock_events_fail;   /* KEEL_GPU_CLOCKS_* bits that fail a GPU */
    double sm_clock_min_fraction; /* of the max SM clock, judged while the GPU is busy: */
    double sm_clock_busy_util_pct;/* utilization >= this */
} keel_gpu_limits;
void keel_gpu_limits_defaults(keel_gpu_limits *l);
/* The name of one KEEL_GPU_CLOCKS_* bit (NVML's, in snake case: "hw_slowdown"),
 * NULL for none; and back (0 for a name that is not one). */
const char *keel_gpu_clock_event_name(unsigned bit);
unsigned keel_gpu_clock_event_bit(const char *name);
/* Every name, comma-separated, for error messages. */
const char *keel_gpu_clock_event_names(void);

typedef struct {
    const keel_config *cfg; /* the job (memory need, checkpoint size, GEMM floor); NULL = none */
    const char *dir;        /* checkpoint directory to probe (created if missing) */
    int nproc;              /* ranks: the mpi check's size; on one machine also the memory need */
    const char *nodelist;   /* Slurm: the mpi check's nodes (NULL = srun's choice) */
    int nodes;              /* Slurm: how many */
    unsigned checks;        /* mask of (1u << keel_health_check) */
    double gemm_floor_gflops;
    double memory_floor_gib;  /* no job: the memory check fails below this MemAvailable (0 = any) */
    const keel_gpu_limits *gpu; /* the gpu check's limits; NULL = the defaults */
} keel_health_options;

typedef struct {
    keel_health_check check;
    enum { KEEL_HEALTH_PASS, KEEL_HEALTH_FAIL, KEEL_HEALTH_SKIPPED } status;
    double value, limit;    /* measured, and the floor or need it is held to (0 = none) */
    char unit[16];
    char detail[1024];
} keel_health_result;

/* Run the checks in mask order on this node; returns how many results (<= KEEL_CHECK_COUNT). */
int keel_health_run(const keel_health_options *o, keel_health_result *out);
bool keel_health_all_ok(const keel_health_result *r, int n);
/* {"node": ..., "ok": ..., "checks": [{"name", "status", "value", "limit", "unit", "detail"}]} */
char *keel_health_json(const char *node, const keel_health_result *r, int n);
/* This machine's node-local checks of resilience.health_checks (not mpi's),
 * in process, each an event in run_dir naming `node` (NULL: the host's name;
 * a failure also "node_excluded"); false names the first failed check in
 * failed. No checks: true. */
bool keel_health_here(const keel_config *cfg, const char *run_dir, const char *node, int nproc, char *failed,
                      size_t n);
/* The gpu check alone (health_gpu.c; keel_health_run calls it). */
void keel_health_check_gpu(const keel_health_options *o, keel_health_result *r);
/* One rank of the mpi check as a job of its own (`keel health --mpi-probe`):
 * rank 0 prints one JSON line. */
keel_status keel_health_mpi_probe(void);
/* `keel health --epilog` (epilog.c): carry this node's results r out in
 * Slurm — a failed check drains the node with reason "keel: <check>"; all
 * passing returns it to service if keel drained it (another reason's drain
 * stays). *said gets what was done, in words. KEEL_ERR_IO (one line) when
 * scontrol does not answer in 30 s or does not know the node. */
keel_status keel_health_epilog(const char *node, const keel_health_result *r, int n, char *said, size_t said_n);
/* A node's own checks and thresholds (`keel health --node-config NODE.json`,
 * a cluster spec's HealthCheck): {"checks": [...], "gemm_floor_gflops": X,
 * "memory_floor_gib": Y, "dir": "PATH", "gpu": {...keel_gpu_limits...}},
 * every key optional, no other key. path names the text in errors. Free dir
 * with keel_free. */
typedef struct {
    unsigned checks;
    bool has_checks;
    double gemm_floor, memory_floor; /* < 0: not set */
    char *dir;
    keel_gpu_limits gpu;             /* the defaults where the config does not say */
} keel_node_config;
keel_status keel_node_config_parse(const char *text, const char *path, keel_node_config *nc);
keel_status keel_node_config_load(const char *path, keel_node_config *nc);

/* ---- the policy (policy.c): pure functions, no I/O ------------------------------- */

/* How a launch ended. */
typedef enum { KEEL_END_COMPLETED, KEEL_END_STOPPED, KEEL_END_CRASHED, KEEL_END_HUNG, KEEL_END_DIVERGED,
               KEEL_END_INPUT, KEEL_END_STRAGGLER, KEEL_END_UNHEALTHY } keel_end;
/* completed, stopped, crash, hang, diverged, input_error, straggler (killed to
 * drain its node), unhealthy (the ranks' mpi check failed) */
const char *keel_end_name(keel_end e);

typedef struct {
    keel_end kind;
    int64_t done;           /* steps done when it ended */
    int64_t checkpoint;     /* the newest committed checkpoint's step (0: none) */
    bool stop_requested;    /* the supervisor was asked to stop (SIGTERM, SIGUSR1, SIGINT) */
    bool checkpointing;     /* checkpoint.every_steps or every_seconds is set (a stop saves) */
    const char *cause;      /* what happened, in words (for the report) */
} keel_outcome;

/* The policy's memory across launches of one supervisor. */
typedef struct {
    int restarts;           /* relaunches so far */
    int64_t fail_step;      /* the furthest step a crash or hang of the streak failed in (-1: none yet) */
    int fail_streak;        /* crashes and hangs in a row, none in a later step than fail_step's */
    int64_t diverged_step;  /* the last step that diverged (-1: none) */
    int64_t skipped_step;   /* the step whose data window was skipped (0: none): the next divergence stops */
} keel_policy_history;
void keel_policy_history_init(keel_policy_history *h);

typedef enum {
    KEEL_ACT_FINISH,        /* done: exit 0 */
    KEEL_ACT_STOP,          /* stopped on request: exit KEEL_EXIT_RESUME with a checkpoint to resume from, else 1 */
    KEEL_ACT_GIVE_UP,       /* stop with a report (exit_code) */
    KEEL_ACT_RELAUNCH,      /* health-check the nodes, back off, relaunch from the newest checkpoint */
} keel_action_kind;

typedef struct {
    keel_action_kind kind;
    const char *event;      /* events.jsonl type of the decision, or NULL when the relaunch says it */
    char reason[1024];      /* the decision in words (event detail, the final report line) */
    int exit_code;          /* keel train's exit code for FINISH, STOP, GIVE_UP */
    int64_t skip_step;      /* > 0: skip this step's data window from now on */
    double backoff_s;       /* RELAUNCH: no sooner than this after the failure was detected */
} keel_action;

/* A stop on request after `done` steps, with the newest checkpoint at step
 * `checkpoint` (0: none): the one line that ends the run says what is saved,
 * and the exit code is KEEL_EXIT_RESUME only when there is state to resume. */
keel_action keel_policy_stopped(int64_t done, int64_t checkpoint, bool checkpointing);

/* o's checkpoint and checkpointing, from the run directory and the config. */
void keel_outcome_run_state(keel_outcome *o, const keel_config *cfg, const char *run_dir);

/* The next action after a launch ended as o, given the history before it;
 * *after is the history to keep if the action is carried out. A divergence
 * rolls back, the same step diverging again skips its data window once, a
 * divergence after that stops; resilience.crash_loop crashes or hangs in a
 * row, none in a later step than the first, stop; so does exceeding
 * max_restarts. A relaunch after progress (the first failure of a streak, a
 * rollback) has no backoff; each failure more without progress waits
 * resilience.backoff_s, doubling. */
keel_action keel_policy_decide(const keel_resilience_config *rc, const keel_policy_history *before,
                               const keel_outcome *o, keel_policy_history *after);

/* Nodes after a round of health checks. */
typedef struct {
    bool local;             /* one machine, no other node to move to */
    int nodes;              /* nodes in the allocation */
    int active;             /* nodes that ran ranks */
    int usable;             /* nodes not excluded, after this round */
    int failed;             /* nodes that failed this round */
    int nproc;              /* ranks now */
    int min_ranks;          /* resilience.min_ranks (0: never shrink) */
    const char *first_failed_node, *first_failed_check; /* for the report */
} keel_node_situation;

typedef enum { KEEL_NODES_KEEP, KEEL_NODES_SPARE, KEEL_NODES_SHRINK, KEEL_NODES_STOP } keel_node_action;
typedef struct {
    keel_node_action kind;  /* SPARE: a spare took a failed node's place */
    int nproc, active;      /* ranks and nodes to run on next */
    char reason[256];       /* STOP: why */
} keel_node_plan;

/* Replace failed nodes with spares, else shrink to the usable nodes (same
 * ranks per node) if resilience.min_ranks allows, else stop. */
keel_node_plan keel_policy_nodes(const keel_node_situation *s);

/* ---- stragglers (straggler.c): pure, no I/O ---------------------------------------- *
 * A rank whose compute time for a step (its step less the time it waited on
 * peers: each rank reports it in its heartbeat) exceeds factor x the median
 * of the other ranks' — and that median by more than KEEL_STRAGGLER_MIN_GAP_S:
 * steps of milliseconds jitter by more than any factor — for `steps` steps
 * in a row is a straggler. Steps are compared only when every rank has
 * reported the same one. */
#define KEEL_STRAGGLER_MIN_GAP_S 0.05
typedef struct {
    int nproc, steps;
    double factor;
    int64_t last_step;  /* the last step compared */
    int *slow_run;      /* (nproc) steps in a row over the factor */
    bool *named;        /* (nproc) reported in this run of slow steps */
} keel_straggler_watch;
void keel_straggler_init(keel_straggler_watch *w, int nproc, double factor, int steps);
void keel_straggler_free(keel_straggler_watch *w);
/* The ranks' compute seconds for `step`: the rank newly named a straggler
 * (the slowest relative to its peers if several), or -1; *ratio its compute
 * over the other ranks' median, *median that median. A step already seen,
 * factor 0 or a single rank compare nothing. */
int keel_straggler_observe(keel_straggler_watch *w, int64_t step, const double *compute_s, double *ratio,
                           double *median);

/* Every rank of w at the same step in training: their compute times to s; a
 * rank newly named a straggler is an event in run_dir (its detail ending in
 * `then`) and a warning, and is returned (else -1) with its *ratio to the
 * others' median. compute_s: (s->nproc) scratch. supervisor.c. */
int keel_straggler_report(keel_straggler_watch *s, const keel_watch *w, const char *run_dir, const char *then,
                          double *compute_s, double *ratio);

/* ---- the supervisor (supervisor.c) --------------------------------------------------- */

/* Run RUN (prepared by keel_run_prepare) on nproc ranks and keep it going
 * through failures as cfg->resilience says (the policy above): every
 * decision is a line in RUN/events.jsonl; summary.json gains restarts,
 * lost_steps, recovery_s, goodput. *exit_code: keel train's exit code. */
keel_status keel_supervise(const keel_config *cfg, const char *run_dir, int nproc, int *exit_code);

/* ---- keel agent (agent.c): ranks that no launcher started, meeting in etcd ---- */

typedef struct {
    int min_nodes, max_nodes; /* PET_NNODES "N" or "MIN:MAX" */
    int nproc;                /* ranks on this node (PET_NPROC_PER_NODE) */
    char endpoint[256];       /* etcd's host:port (PET_RDZV_ENDPOINT) */
    char run_id[128];         /* the job's name in etcd (PET_RDZV_ID): its keys are /keel/<run_id>/ */
    char node[128];           /* this node's name among the others (default: the host name) */
    char host[256];           /* the address its ranks listen on for the others ("": the host name's) */
    int64_t max_restarts;     /* failures a job survives (PET_MAX_RESTARTS; -1: resilience.max_restarts) */
    double last_call_s;       /* with min nodes joined, wait this long for more before a round starts */
    double rdzv_timeout_s;    /* how long an etcd that does not answer is retried */
} keel_agent_options;

/* Join the job's rounds until its ranks are done (*exit_code 0), stopped on
 * a signal (75: run the agent again to go on), refused their input (2), or
 * the supervisor's policy stopped the job or this node failed a health check
 * after a failure (1). Other statuses: etcd could not be reached, or holds a
 * finished or stopped job of this run id (one line). */
keel_status keel_agent_run(const keel_config *cfg, const char *run_dir, const keel_agent_options *o, int *exit_code);
/* Delete the job's keys (/keel/<run_id>/ and nothing else) from etcd. */
keel_status keel_agent_reset(const keel_agent_options *o);

#endif
