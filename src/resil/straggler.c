/* resil/straggler.c: naming a rank that is alive but slow — the commonest
 * silent loss on large clusters: synchronous training runs at the pace of
 * its slowest rank, and nothing fails. Compared with the median of the other
 * ranks (with two ranks: the other one), so one slow rank cannot raise the
 * yardstick it is held to. */
#include "keel/resil.h"

void keel_straggler_init(keel_straggler_watch *w, int nproc, double factor, int steps) {
    *w = (keel_straggler_watch){.nproc = nproc, .steps = steps > 0 ? steps : 1, .factor = factor, .last_step = -1};
    w->slow_run = keel_xcalloc(sizeof(int) * (size_t)nproc, "straggler counts");
    w->named = keel_xcalloc(sizeof(bool) * (size_t)nproc, "straggler flags");
}

void keel_straggler_free(keel_straggler_watch *w) {
    keel_free(w->slow_run);
    keel_free(w->named);
    w->slow_run = NULL;
    w->named = NULL;
}

int keel_straggler_observe(keel_straggler_watch *w, int64_t step, const double *compute_s, double *ratio,
                           double *median) {
    *ratio = *median = 0;
    if (w->factor <= 0 || w->nproc < 2 || step <= w->last_step) return -1;
    w->last_step = step;
    double *others = keel_xmalloc(sizeof(double) * (size_t)w->nproc, "straggler peers");
    int named = -1;
    for (int r = 0; r < w->nproc; r++) {
        int n = 0;
        for (int q = 0; q < w->nproc; q++)
            if (q != r) others[n++] = compute_s[q];
        double m = keel_median(others, n), x = m > 0 ? compute_s[r] / m : 0;
        if (x > w->factor && compute_s[r] - m > KEEL_STRAGGLER_MIN_GAP_S) {
            w->slow_run[r]++;
        } else {
            w->slow_run[r] = 0;
            w->named[r] = false;
        }
        if (w->slow_run[r] >= w->steps && !w->named[r] && x > *ratio) named = r, *ratio = x, *median = m;
    }
    if (named >= 0) w->named[named] = true;
    keel_free(others);
    return named;
}
