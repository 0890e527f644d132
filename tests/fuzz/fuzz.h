/* tests/fuzz/fuzz.h: what the harnesses share — errors kept quiet and held
 * to one line, NUL-ended copies of the input, a scratch directory for the
 * parsers that read a directory of files.
 *
 * Each harness is a libFuzzer target (LLVMFuzzerTestOneInput) that hands its
 * input to the product's own parser: the buffer entry points the file
 * readers use (keel_tokenizer_load_buffer, safetensors_parse_header,
 * keel_ckpt_parse_manifest, keel_shard_from_buffer, keel_config_load_string,
 * keel_node_config_parse, keel_cluster_spec_parse), or the file readers
 * themselves over files written into a scratch directory. A crash, a
 * sanitizer report, a leak, a timeout or a failure without exactly one error
 * line is a finding. */
#ifndef KEEL_FUZZ_H
#define KEEL_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include "keel/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Before each call into keel: warnings off, errors captured (not printed)
 * and the last one cleared. */
static inline void fuzz_quiet(void) {
    keel_log_set_level(KEEL_LOG_ERROR);
    keel_error_capture(true);
}

/* A failure must have said why, on one line (docs/testing.md: bad input is
 * exit 2 with one line naming the file, the field and the fix). */
static inline void fuzz_expect_error_line(keel_status st, const char *what) {
    static int verbose = -1; /* KEEL_FUZZ_VERBOSE=1: print each call's result (replaying one input) */
    if (verbose < 0) verbose = getenv("KEEL_FUZZ_VERBOSE") != NULL;
    if (verbose) fprintf(stderr, "%s: %s%s%s\n", what, keel_status_str(st), st ? ": " : "", st ? keel_last_error() : "");
    if (st == KEEL_OK) return;
    const char *e = keel_last_error();
    if (!e[0] || strchr(e, '\n')) {
        fprintf(stderr, "%s failed (%s) without one error line: '%s'\n", what, keel_status_str(st), e);
        abort();
    }
}

/* data[0, size) NUL-ended, in a new buffer (free). */
static inline char *fuzz_cstring(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* ---- a scratch directory (one per process, under /dev/shm when there is one) ---- */

static char fuzz_dir_path[64];

static int fuzz_remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag;
    if (ftw->level > 0) remove(path);
    return 0;
}

/* Empty the scratch directory (it stays). */
static inline void fuzz_dir_clear(void) {
    if (fuzz_dir_path[0]) nftw(fuzz_dir_path, fuzz_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void fuzz_dir_remove(void) {
    fuzz_dir_clear();
    rmdir(fuzz_dir_path);
}

/* The scratch directory, empty. */
static inline const char *fuzz_dir(void) {
    if (!fuzz_dir_path[0]) {
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/keel-fuzz-XXXXXX",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(fuzz_dir_path)) abort();
        atexit(fuzz_dir_remove);
    }
    fuzz_dir_clear();
    return fuzz_dir_path;
}

/* Write data[0, size) as dir/name (a subdirectory of the scratch one is made). */
static inline void fuzz_write(const char *dir, const char *name, const void *data, size_t size) {
    char path[512];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
}

#endif
