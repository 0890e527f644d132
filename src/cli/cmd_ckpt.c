/* cli/cmd_ckpt.c: `keel ckpt list RUN` and `keel ckpt verify PATH`. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "keel/ckpt.h"

static void usage(FILE *out) {
    fprintf(out, "usage: keel ckpt list RUN_DIR      committed checkpoints: step, size, files, status\n"
                 "       keel ckpt verify PATH       checksums of one checkpoint (RUN/checkpoints/step_N)\n"
                 "                                   or of every checkpoint of a run; exit 1 on damage\n");
}

/* Open (manifest, sizes, headers) and, with `verify`, checksum every file;
 * *ck is open only on success. */
static keel_status check(const char *dir, bool verify, keel_ckpt *ck) {
    keel_status st = keel_ckpt_open(dir, ck);
    if (st != KEEL_OK) return st;
    for (int j = 0; st == KEEL_OK && verify && j < ck->shard_ranks; j++) st = keel_ckpt_verify_file(ck, j);
    if (st != KEEL_OK) keel_ckpt_close(ck);
    return st;
}

static int list(const char *run_dir) {
    int64_t *steps;
    int n = keel_ckpt_list(run_dir, &steps);
    printf("%-14s %10s %6s %6s  %s\n", "checkpoint", "MiB", "files", "ranks", "status");
    for (int i = 0; i < n; i++) {
        char dir[4096];
        keel_ckpt_dir(dir, sizeof dir, run_dir, steps[i], false);
        keel_ckpt ck;
        keel_error_capture(true);
        keel_status st = check(dir, false, &ck);
        keel_error_capture(false);
        if (st == KEEL_OK) {
            double bytes = 0;
            for (int j = 0; j < ck.shard_ranks; j++) bytes += (double)ck.files[j].bytes;
            printf("step_%08lld %10.1f %6d %6d  %s%s\n", (long long)steps[i], bytes / (1 << 20),
                   ck.shard_ranks, ck.world_size, i == 0 ? "LATEST, " : "", "committed");
            keel_ckpt_close(&ck);
        } else {
            printf("step_%08lld %10s %6s %6s  damaged: %s\n", (long long)steps[i], "-", "-", "-",
                   keel_last_error());
        }
    }
    if (n == 0) printf("(no committed checkpoints in %s/checkpoints)\n", run_dir);
    keel_free(steps);
    return 0;
}

static int verify(const char *path) {
    /* A checkpoint directory (step_N, or anything with a manifest), else a run. */
    char manifest[4200];
    snprintf(manifest, sizeof manifest, "%s/manifest.json", path);
    struct stat sb;
    int64_t *steps = NULL, one = 0;
    int n;
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    bool run = stat(manifest, &sb) != 0 && strncmp(base, "step_", 5) != 0;
    if (run) {
        n = keel_ckpt_list(path, &steps);
        if (n == 0) {
            keel_errorf("%s: neither a checkpoint (no manifest.json) nor a run with committed "
                        "checkpoints", path);
            return 2;
        }
    } else {
        n = 1;
        steps = &one;
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        char dir[4096];
        if (run) keel_ckpt_dir(dir, sizeof dir, path, steps[i], false);
        else snprintf(dir, sizeof dir, "%s", path);
        keel_ckpt ck;
        keel_error_capture(true);
        keel_status st = check(dir, true, &ck);
        keel_error_capture(false);
        if (st == KEEL_OK) {
            printf("ok      %s (step %lld, %d file(s), checksums match)\n", dir, (long long)ck.step,
                   ck.shard_ranks);
            keel_ckpt_close(&ck);
        } else {
            printf("DAMAGED %s: %s\n", dir, keel_last_error());
            bad++;
        }
    }
    if (run) keel_free(steps);
    return bad ? 1 : 0;
}

int keel_cmd_ckpt(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc != 3 || (strcmp(argv[1], "list") && strcmp(argv[1], "verify"))) {
        keel_errorf("usage: keel ckpt list RUN_DIR | keel ckpt verify PATH (see keel ckpt --help)");
        return 2;
    }
    return !strcmp(argv[1], "list") ? list(argv[2]) : verify(argv[2]);
}
