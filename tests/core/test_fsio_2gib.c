/* Single transfers above 2 GiB through core/fsio.c's loops: write_all and
 * pwrite_all to /dev/null, pread_all from a sparse file, each in one call.
 * Needs 2.1 GiB of memory and, on a small VM, 5-15 s (page faults), so ctest
 * labels it heavy (`ctest -LE heavy` skips it). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "keel/core.h"

#include "../testlib.h"

static char tmpdir[128];

/* One call above 2 GiB: Linux moves at most 0x7ffff000 bytes per read or
 * write, so only a loop gets all of it. Writes go to /dev/null from a
 * mapping that is never touched (no memory); the read comes from a sparse
 * file with a marker in every GiB, into 2.1 GiB of real memory. */
int main(void) {
    if (!temp_dir_create(tmpdir, sizeof tmpdir, "fsio-2gib")) return 1;
    const size_t bytes = ((size_t)2 << 30) + (100u << 20);
    void *untouched = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    EXPECT(untouched != MAP_FAILED, "map 2.1 GiB");
    if (untouched == MAP_FAILED) return test_summary("test_fsio_2gib");
    int null = open("/dev/null", O_WRONLY);
    EXPECT(keel_write_all(null, untouched, bytes, "/dev/null") == KEEL_OK, "write_all of 2.1 GiB");
    EXPECT(keel_pwrite_all(null, untouched, bytes, 0, "/dev/null") == KEEL_OK, "pwrite_all of 2.1 GiB");
    close(null);
    munmap(untouched, bytes);

    char path[256];
    snprintf(path, sizeof path, "%s/sparse.bin", tmpdir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    const int64_t base = 4096; /* read from an offset: the offset must advance too */
    bool made = ftruncate(fd, base + (off_t)bytes) == 0;
    for (uint64_t at = 0; made && at < bytes; at += 1u << 30)
        made = pwrite(fd, &at, sizeof at, base + (off_t)at) == sizeof at;
    uint64_t end_mark = 0x5eed;
    made = made && pwrite(fd, &end_mark, 8, base + (off_t)bytes - 8) == 8;
    EXPECT(made, "a sparse %zu-byte file with markers", bytes);
    unsigned char *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                              -1, 0);
    EXPECT(buf != MAP_FAILED, "map 2.1 GiB to read into");
    if (buf == MAP_FAILED) return test_summary("test_fsio_2gib");
    double t0 = keel_now_s();
    keel_status st = keel_pread_all(fd, buf, bytes, base, path);
    bool marks = st == KEEL_OK;
    for (uint64_t at = 0; marks && at < bytes; at += 1u << 30) {
        uint64_t v;
        memcpy(&v, buf + at, 8);
        marks = v == at && buf[at + 8] == 0;
    }
    uint64_t last;
    memcpy(&last, buf + bytes - 8, 8);
    EXPECT(marks && last == end_mark, "pread_all of 2.1 GiB at offset %lld: every GiB marker in place (%.1f s)",
           (long long)base, keel_now_s() - t0);
    munmap(buf, bytes);
    close(fd);
    remove_tree(tmpdir);
    return test_summary("test_fsio_2gib");
}

