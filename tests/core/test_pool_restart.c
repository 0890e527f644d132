/* The thread pool started again after it ran jobs (keel plan measures on
 * several thread counts in one process): the new workers run only the jobs
 * posted after they started — never the previous pool's last job again,
 * whose context is gone by then — and every job is whole. */
#include <stdatomic.h>

#include "keel/core.h"
#include "../testlib.h"

typedef struct {
    atomic_long calls;
    atomic_llong sum;
} job;

static void add_range(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    job *j = p;
    atomic_fetch_add(&j->calls, 1);
    long long s = 0;
    for (int64_t i = begin; i < end; i++) s += i;
    atomic_fetch_add(&j->sum, s);
}

int main(void) {
    const int64_t n = 1 << 20;
    const long long want = (long long)n * (n - 1) / 2;
    static job first; /* kept alive: a stale replay shows as extra calls, not a crash */
    keel_pool_init(2);
    for (int rep = 0; rep < 3; rep++) keel_pool_for(n, 1, add_range, &first);
    keel_pool_shutdown();
    long before = atomic_load(&first.calls);
    EXPECT(atomic_load(&first.sum) == 3 * want, "three jobs on the first pool: sum %lld", (long long)first.sum);
    for (int round = 0; round < 20; round++) {
        keel_pool_init(round % 3 + 2);
        job j = {0};
        keel_pool_for(n, 1, add_range, &j);
        EXPECT(atomic_load(&j.sum) == want && atomic_load(&j.calls) == round % 3 + 2,
               "restart %d (%d threads): the job is whole (sum %lld, %ld calls)", round, round % 3 + 2,
               (long long)j.sum, (long)j.calls);
        keel_pool_shutdown();
    }
    EXPECT(atomic_load(&first.calls) == before, "no restarted worker ran the first pool's job again (%ld calls, "
           "want %ld)", (long)first.calls, before);
    return test_summary("test_pool_restart");
}
