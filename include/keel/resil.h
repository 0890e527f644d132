/* resil: starting and watching ranks. Today: the launchers (local mpirun, or
 * srun inside a Slurm allocation). The supervisor, health checks and failure
 * policy of DESIGN §6 land here next.
 *
 *     int code;
 *     keel_launch_ranks("runs/x", 4, &code);   // runs `keel worker runs/x` on 4 ranks
 */
#ifndef KEEL_RESIL_H
#define KEEL_RESIL_H

#include "keel/core.h"

/* The command that starts `nproc` ranks of `keel worker run_dir`: mpirun on
 * loopback (as root, oversubscribed) or, when SLURM_JOB_ID is set, srun
 * --mpi=pmix. argv is NULL-terminated, malloc'd; free with keel_launch_argv_free. */
char **keel_launch_argv(const char *keel_path, const char *run_dir, int nproc);
void keel_launch_argv_free(char **argv);

/* Start the ranks, wait for them, and report: *exit_code is the launcher's
 * exit status (0 when every rank succeeded). A failed job is reported in one
 * line naming the first rank that failed, when the launcher says which. */
keel_status keel_launch_ranks(const char *run_dir, int nproc, int *exit_code);

#endif
