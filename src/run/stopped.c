/* run/stopped.c: the one line that ends a run stopped on a signal, and its
 * exit code (keel/run.h) — said by the supervisor, or by the rank that is the
 * whole run (one process, a Slurm task). */
#include <stdio.h>

#include "keel/run.h"

int keel_run_stopped(int64_t done, int64_t checkpoint, bool checkpointing, char *line, size_t n) {
    if (checkpoint > 0 && checkpoint >= done) {
        snprintf(line, n, "stopped on a signal after step %lld; state saved at step %lld: run the same keel train "
                 "command again to resume", (long long)done, (long long)checkpoint);
        return KEEL_EXIT_RESUME;
    }
    if (checkpoint > 0) {
        snprintf(line, n, "stopped on a signal after step %lld; the newest checkpoint is at step %lld (the save at "
                 "the stop did not commit): run the same keel train command again to resume from there",
                 (long long)done, (long long)checkpoint);
        return KEEL_EXIT_RESUME;
    }
    snprintf(line, n, "stopped on a signal after step %lld; nothing was saved to resume from (%s)", (long long)done,
             checkpointing ? "no checkpoint was committed"
                           : "checkpointing is off: set checkpoint.every_steps to make a stop resumable");
    return 1;
}
