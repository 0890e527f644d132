/* resil: starting ranks, watching them, and deciding what to do when they
 * fail (DESIGN §6): the launchers (local mpirun, or srun inside a Slurm
 * allocation), each rank's heartbeat, node health checks, and the
 * supervisor that `keel train --nproc N` runs.
 *
 *     int code;
 *     keel_supervise(&cfg, "runs/x", 4, &code);   // keel worker runs/x on 4 ranks, relaunched
 *                                                 // from the last checkpoint after failures
 */
#ifndef KEEL_RESIL_H
#define KEEL_RESIL_H

#include "keel/core.h"

/* ---- launching ------------------------------------------------------------ */

typedef struct {
    int nproc;
    const char *nodelist; /* Slurm: the nodes to run on (srun -w), NULL = srun's choice */
    int nodes;            /* Slurm: how many (srun -N), 0 = srun's choice */
} keel_launch_spec;

/* True inside a Slurm allocation (SLURM_JOB_ID set): ranks start with srun. */
bool keel_launch_in_slurm(void);
/* The command that starts spec->nproc ranks of `keel ARGS...`: mpirun on
 * loopback (as root, oversubscribed) or, in a Slurm allocation, srun
 * --mpi=pmix. argv is NULL-terminated, malloc'd; free with keel_launch_argv_free. */
char **keel_launch_argv(const char *keel_path, const keel_launch_spec *spec, const char *const *args);
void keel_launch_argv_free(char **argv);
/* This executable's path (/proc/self/exe). */
keel_status keel_self_path(char *out, size_t n);
/* Environment for launched ranks: loopback-only OpenMPI, KEEL_TTY. */
void keel_launch_env(void);
/* Run argv (execvp), keep up to n-1 bytes of its stdout in out (NUL-ended);
 * returns its exit status, 128+signal, or -1 when it could not start. */
int keel_run_capture(char *const *argv, char *out, size_t n);
/* The rank a launcher's stderr line blames, or -1 (mpirun: "process rank N",
 * srun: "task N"); *sig becomes the signal it names, or 0. */
int keel_launch_blamed_rank(const char *line, int *sig);

/* ---- heartbeats: RUN/heartbeats/rank-R -------------------------------------
 * Written by each rank (phase, steps done, time, pid, node), read by the
 * supervisor. Phases: "init" (started), "ready" (state loaded; step = the
 * checkpoint's step), "train" (step = steps done), "exit" (exit_code set).
 * A step < 0 repeats the last one. */
typedef struct keel_heartbeat keel_heartbeat;
keel_heartbeat *keel_heartbeat_open(const char *run_dir, int rank); /* NULL: could not (warned) */
void keel_heartbeat_beat(keel_heartbeat *hb, const char *phase, int64_t step, int exit_code);
void keel_heartbeat_close(keel_heartbeat *hb);

typedef struct {
    char phase[16];
    int64_t step, start_step;  /* steps done; the step this launch resumed from (-1 before ready) */
    double unix_s;             /* wall-clock time of the beat */
    double first_step_unix_s;  /* when this launch finished its first step (0 before) */
    int pid, exit_code;
    char node[64];
    char slurm_step[32];       /* "JOB.STEP", or "-" outside Slurm */
} keel_heartbeat_info;
/* false when rank's file is missing or caught mid-write. */
bool keel_heartbeat_read(const char *run_dir, int rank, keel_heartbeat_info *out);
void keel_heartbeat_clear(const char *run_dir, int ranks);

/* ---- health checks: keel health -------------------------------------------- */

typedef struct {
    const keel_config *cfg; /* the job (memory need, checkpoint size, GEMM floor); NULL = none */
    const char *dir;        /* checkpoint directory to probe (created if missing) */
    int nproc;              /* ranks: the mpi check's size; on one machine also the memory need */
    const char *nodelist;   /* Slurm: the mpi check's nodes (NULL = srun's choice) */
    int nodes;              /* Slurm: how many */
    const char *checks;     /* comma-separated: gemm, memory, checkpoint_dir, mpi, gpu */
    double gemm_floor_gflops;
} keel_health_options;

typedef struct {
    char name[24];
    enum { KEEL_HEALTH_PASS, KEEL_HEALTH_FAIL, KEEL_HEALTH_SKIPPED } status;
    double value, limit;    /* measured, and the floor or need it is held to (0 = none) */
    char unit[16];
    char detail[512];
} keel_health_result;

#define KEEL_HEALTH_MAX 8
/* Run the checks on this node; returns how many results (<= KEEL_HEALTH_MAX). */
int keel_health_run(const keel_health_options *o, keel_health_result *out);
bool keel_health_all_ok(const keel_health_result *r, int n);
/* {"node": ..., "ok": ..., "checks": [{"name", "status", "value", "limit", "unit", "detail"}]} */
char *keel_health_json(const char *node, const keel_health_result *r, int n);
/* One rank of the mpi check (`keel health --mpi-probe`): all-reduce known
 * values, check the sum exactly, time it; rank 0 prints one JSON line. */
keel_status keel_health_mpi_probe(void);
/* This node's name: SLURMD_NODENAME (emulated nodes share a hostname) or the hostname. */
void keel_node_name(char *out, size_t n);

/* ---- the supervisor ---------------------------------------------------------- */

/* Run RUN (prepared: config.json, logs/) on nproc ranks and keep it going
 * through failures as cfg->resilience says: crashes and hangs relaunch from
 * the newest checkpoint after health checks, a non-finite loss rolls back
 * (then skips that step's data once, then stops), a crash loop stops, SIGTERM
 * or SIGUSR1 checkpoints and exits KEEL_EXIT_RESUME. Every decision is a line
 * in RUN/events.jsonl; summary.json gains restarts, lost_steps, recovery_s,
 * goodput. *exit_code: keel train's exit code. */
keel_status keel_supervise(const keel_config *cfg, const char *run_dir, int nproc, int *exit_code);

/* Steps whose data window the supervisor skipped (RUN/supervisor.json),
 * ascending: step s then trains on window s + (skips <= s). *out is
 * malloc'd (NULL when none); returns the count. */
int keel_resil_skipped_steps(const char *run_dir, int64_t **out);

#endif
