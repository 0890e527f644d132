/* In-memory snapshot segments: two slots committed in turn (the older one is
 * overwritten), a slot being written is never offered, a flipped byte fails
 * the checksum, a segment of another shape starts over, and removal by run
 * and of stale runs (directory gone) leaves nothing in /dev/shm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "keel/ckpt.h"

#include "../testlib.h"

#define FLOATS 1000

static void fill(float *x, int64_t step) {
    for (int i = 0; i < FLOATS; i++) x[i] = (float)step * 1000 + (float)i;
}

/* rank's segment of a world_size run, one shard per rank */
static keel_status open_seg(const char *dir, int rank, int world_size, uint64_t key, bool replica, keel_snap **s) {
    keel_snap_shape shape = {rank, world_size, world_size, rank, FLOATS};
    return keel_snap_open(dir, &shape, key, replica, s);
}

static void snapshot(keel_snap *s, int64_t step) {
    int slot;
    fill(keel_snap_begin(s, step, &slot), step);
    keel_snap_commit(s, slot, step);
}

int main(void) {
    char dir[256];
    if (!temp_dir_create(dir, sizeof dir, "snapshot")) return 1;
    keel_snap *s;
    EXPECT(open_seg(dir, 1, 2, 42, false, &s) == KEEL_OK, "segment created");
    int64_t steps[2];
    EXPECT(keel_snap_steps(s, steps) == 0, "a new segment has no snapshot");
    snapshot(s, 5);
    EXPECT(keel_snap_steps(s, steps) == 1 && steps[0] == 5, "step 5 committed");
    snapshot(s, 6);
    snapshot(s, 7);
    int n = keel_snap_steps(s, steps);
    EXPECT(n == 2 && steps[0] == 7 && steps[1] == 6, "two slots: the newest two steps (%d: %lld %lld)", n,
           (long long)steps[0], (long long)steps[1]);
    const float *got;
    float want[FLOATS];
    fill(want, 6);
    EXPECT(keel_snap_get(s, 6, &got) == KEEL_OK && !memcmp(got, want, sizeof want), "step 6 reads back");

    /* a copy that never commits (the process died in it) takes the older slot out, never the newer */
    int slot;
    float *dst = keel_snap_begin(s, 8, &slot);
    dst[3] = -1;
    keel_snap_close(s, false);
    EXPECT(open_seg(dir, 1, 2, 42, false, &s) == KEEL_OK, "reopened");
    n = keel_snap_steps(s, steps);
    EXPECT(n == 1 && steps[0] == 7, "after a torn write only step 7 is offered (%d)", n);
    fill(want, 7);
    EXPECT(keel_snap_get(s, 7, &got) == KEEL_OK && !memcmp(got, want, sizeof want), "step 7 intact");
    capture_begin();
    keel_status st = keel_snap_get(s, 6, &got);
    const char *err = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && strstr(err, "no committed snapshot of step 6"), "step 6 is gone: %s", err);

    /* a flipped byte in the committed slot */
    char path[512];
    snprintf(path, sizeof path, "%s", keel_snap_path(s));
    FILE *f = fopen(path, "r+b");
    float x;
    long at = -1;
    for (long off = 4096; off < 4096 + 2L * FLOATS * 4 && at < 0; off += 4) { /* find step 7's value 7003 */
        fseek(f, off, SEEK_SET);
        if (fread(&x, 4, 1, f) == 1 && x == 7003.0f) at = off;
    }
    fseek(f, at, SEEK_SET);
    x = 7003.5f;
    fwrite(&x, 4, 1, f);
    fclose(f);
    capture_begin();
    st = keel_snap_get(s, 7, &got);
    err = capture_end();
    EXPECT(at > 0 && st == KEEL_ERR_INPUT && strstr(err, "fails its checksum"), "a flipped value is caught: %s", err);
    keel_snap_close(s, false);

    /* another key (configuration) or world size: the segment starts over */
    EXPECT(open_seg(dir, 1, 2, 43, false, &s) == KEEL_OK && keel_snap_steps(s, steps) == 0,
           "a segment of another key is emptied");
    /* a relaunch resumed from step 7 of steps 8 and 7: its step 8 replaces the
     * abandoned one, and step 7 stays (no slot holds two copies of step 8) */
    snapshot(s, 7);
    snapshot(s, 8);
    snapshot(s, 8);
    n = keel_snap_steps(s, steps);
    EXPECT(n == 2 && steps[0] == 8 && steps[1] == 7, "step 8 again keeps step 7 (%d: %lld %lld)", n,
           (long long)steps[0], (long long)steps[1]);
    keel_snap_begin(s, 6, &slot); /* resumed from step 5 elsewhere: 8 and 7 are gone, even torn */
    EXPECT(keel_snap_steps(s, steps) == 0, "steps after a resumed one are dropped");
    snapshot(s, 8);
    keel_snap_close(s, false);
    keel_snap_shape other = {1, 2, 1, 0, FLOATS};
    EXPECT(keel_snap_open(dir, &other, 43, false, &s) == KEEL_OK && keel_snap_steps(s, steps) == 0,
           "a segment of another layout is emptied");
    snapshot(s, 8);
    keel_snap_close(s, false);
    EXPECT(access(path, F_OK) == 0, "closing keeps the segment");

    /* keel_snap_fill: pieces given out of order, at odd offsets, one larger than its
     * 64 KiB chunks, with padding between them that keeps its bytes: the slot holds
     * the pieces and passes keel_snap_get's checksum of the whole slot */
    enum { BIG = 40000 };
    keel_snap *big;
    keel_snap_shape big_shape = {3, 4, 4, 3, BIG};
    EXPECT(keel_snap_open(dir, &big_shape, 43, false, &big) == KEEL_OK, "a larger segment");
    float *src = keel_xmalloc(sizeof(float) * BIG, "src");
    for (int i = 0; i < BIG; i++) src[i] = (float)i * 0.5f - 7.0f;
    float *slot_data = keel_snap_begin(big, 3, &slot);
    for (int i = 0; i < BIG; i++) slot_data[i] = -1.0f; /* what the padding holds */
    keel_snap_piece pieces[] = {{30001, src + 30001, 9000}, {1, src + 1, 20003}, {20005, src + 20005, 9990}};
    keel_snap_fill(big, slot, 3, pieces, 3);
    bool same = keel_snap_get(big, 3, &got) == KEEL_OK;
    for (int i = 0; i < BIG && same; i++) {
        bool pad = i == 0 || i == 20004 || (i >= 29995 && i <= 30000) || i >= 39001;
        same = got[i] == (pad ? -1.0f : src[i]);
    }
    EXPECT(same, "filled in one pass: pieces in place, padding kept, checksum of the whole slot");
    keel_free(src);
    keel_snap_close(big, true);

    /* another world size is a segment of its own: the last world's stay for a relaunch to reshard from */
    keel_snap *w4, **found;
    EXPECT(open_seg(dir, 1, 4, 43, false, &w4) == KEEL_OK && keel_snap_steps(w4, steps) == 0 &&
               strstr(keel_snap_path(w4), "-w4-r1"), "world 4's segment: %s", keel_snap_path(w4));
    snapshot(w4, 9);
    n = keel_snap_open_others(dir, 4, 43, &found);
    EXPECT(n == 1 && keel_snap_get_shape(found[0]).world_size == 2 && keel_snap_get_shape(found[0]).shard_ranks == 1 &&
               keel_snap_get(found[0], 8, &got) == KEEL_OK, "world 4 finds world 2's segment, read-only (%d)", n);
    for (int i = 0; i < n; i++) keel_snap_close(found[i], false);
    keel_free(found);
    EXPECT(keel_snap_open_others(dir, 4, 44, &found) == 0, "another key: none");
    keel_free(found);
    EXPECT(keel_snap_remove_other_worlds(dir, 4) == 1 && access(path, F_OK) != 0 &&
               access(keel_snap_path(w4), F_OK) == 0, "world 2's removed, world 4's kept");
    keel_snap_close(w4, true);

    /* a replica of rank 1 that its buddy keeps: a segment of its own */
    keel_snap *rep;
    EXPECT(open_seg(dir, 1, 2, 42, true, &rep) == KEEL_OK && strstr(keel_snap_path(rep), "-b1") &&
               keel_snap_steps(rep, steps) == 0, "a replica segment: %s", keel_snap_path(rep));
    snapshot(rep, 11);
    keel_snap_close(rep, false);
    EXPECT(open_seg(dir, 1, 2, 42, false, &s) == KEEL_OK, "reopened");
    snprintf(path, sizeof path, "%s", keel_snap_path(s));
    keel_snap_close(s, false);
    EXPECT(keel_snap_remove_run(dir) == 2 && access(path, F_OK) != 0, "removed with its run (own and replica)");

    /* a rank whose run is over removes its own */
    EXPECT(open_seg(dir, 1, 2, 42, false, &s) == KEEL_OK, "reopened");
    snprintf(path, sizeof path, "%s", keel_snap_path(s));
    keel_snap_close(s, true);
    EXPECT(access(path, F_OK) != 0, "closed with remove: gone");

    /* stale: the run directory is gone */
    EXPECT(open_seg(dir, 0, 1, 42, false, &s) == KEEL_OK, "a segment of a run about to be deleted");
    snprintf(path, sizeof path, "%s", keel_snap_path(s));
    keel_snap_close(s, false);
    remove_tree(dir);
    EXPECT(keel_snap_remove_stale() >= 1 && access(path, F_OK) != 0, "a run directory gone: its segment is stale");
    return test_summary("test_snapshot");
}
