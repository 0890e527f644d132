/* Straggler detection (resil/straggler.c): a rank over factor x the other
 * ranks' median compute time for `steps` steps in a row is named once, at
 * the step it qualifies and not before; a step seen twice counts once; a
 * rank that recovers is named again only after a new run of slow steps; with
 * two ranks the yardstick is the other rank; ranks just under the factor, a
 * gap under the absolute floor, a single rank and factor 0 are never named. */
#include <math.h>

#include "keel/resil.h"

#include "../testlib.h"

int main(void) {
    keel_straggler_watch w;
    double ratio, median;
    keel_straggler_init(&w, 2, 1.3, 3);
    double slow[2] = {1.0, 2.0}, even[2] = {1.0, 1.1};
    int named[8];
    for (int s = 1; s <= 4; s++) named[s] = keel_straggler_observe(&w, s, slow, &ratio, &median);
    EXPECT(named[1] == -1 && named[2] == -1 && named[3] == 1 && named[4] == -1,
           "two ranks, rank 1 at 2x: named at its third slow step only (%d %d %d %d)", named[1], named[2], named[3],
           named[4]);
    keel_straggler_free(&w);
    keel_straggler_init(&w, 2, 1.3, 3);
    keel_straggler_observe(&w, 1, slow, &ratio, &median);
    keel_straggler_observe(&w, 1, slow, &ratio, &median); /* polled twice within one step */
    keel_straggler_observe(&w, 2, slow, &ratio, &median);
    EXPECT(keel_straggler_observe(&w, 2, slow, &ratio, &median) == -1, "a step seen again does not count twice");
    EXPECT(keel_straggler_observe(&w, 3, slow, &ratio, &median) == 1 && fabs(ratio - 2) < 1e-12 && median == 1.0,
           "ratio %g against the other rank's %g", ratio, median);
    keel_straggler_observe(&w, 4, even, &ratio, &median); /* recovers */
    keel_straggler_observe(&w, 5, slow, &ratio, &median);
    keel_straggler_observe(&w, 6, slow, &ratio, &median);
    EXPECT(keel_straggler_observe(&w, 7, slow, &ratio, &median) == 1,
           "slow again for 3 steps after recovering: named again");
    keel_straggler_free(&w);

    keel_straggler_init(&w, 4, 1.3, 2);
    double four[4] = {1.0, 1.05, 1.29, 0.95}, one_slow[4] = {1.0, 1.05, 3.0, 0.95};
    int got = -2;
    for (int s = 1; s <= 5; s++) got = keel_straggler_observe(&w, s, four, &ratio, &median);
    EXPECT(got == -1, "four ranks, the slowest at 1.29x the others' median: never named");
    keel_straggler_observe(&w, 6, one_slow, &ratio, &median);
    got = keel_straggler_observe(&w, 7, one_slow, &ratio, &median);
    EXPECT(got == 2 && fabs(median - 1.0) < 1e-12, "rank 2 at 3x among four: named (median of the others %g)", median);
    keel_straggler_free(&w);

    keel_straggler_init(&w, 2, 1.3, 1);
    double jitter[2] = {0.008, 0.017}; /* 2x, but 9 ms: scheduler noise on a millisecond step */
    EXPECT(keel_straggler_observe(&w, 1, jitter, &ratio, &median) == -1,
           "a 2x gap of 9 ms is under the %.2f s floor: not named", KEEL_STRAGGLER_MIN_GAP_S);
    keel_straggler_free(&w);
    keel_straggler_init(&w, 2, 0, 1);
    EXPECT(keel_straggler_observe(&w, 1, slow, &ratio, &median) == -1, "factor 0: detection off");
    keel_straggler_free(&w);
    keel_straggler_init(&w, 1, 1.3, 1);
    EXPECT(keel_straggler_observe(&w, 1, slow, &ratio, &median) == -1, "one rank: nothing to compare");
    keel_straggler_free(&w);
    return test_summary("test_straggler");
}
