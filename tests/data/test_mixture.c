/* The draw order of a mixture of datasets (data/mixture.h): each block of
 * KEEL_MIXTURE_BLOCK positions holds each source's apportioned count exactly
 * (largest remainder, a zero weight none); every source's sample numbers come
 * in order 0, 1, 2, ... with none skipped or repeated; a position found out of
 * order (a resume, any rank's slice) is the one found in order; the seed
 * changes the order and nothing else does; and weights that sum to 0, or a
 * weight too small for one slot of a block, are refused in one line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/mixture.h"

#define TESTLIB_QUIET
#include "../testlib.h"

enum { BLOCK = KEEL_MIXTURE_BLOCK, N_POS = 3 * BLOCK + 1234 };

static void counts_and_order(void) {
    const double weights[] = {3, 1, 0, 0.5};
    const char *names[] = {"a", "b", "c", "d"};
    keel_mixture *m, *again, *other;
    EXPECT(keel_mixture_new(weights, 4, 42, names, &m) == KEEL_OK, "a mixture of 4 (one of weight 0)");
    EXPECT(keel_mixture_new(weights, 4, 42, names, &again) == KEEL_OK, "the same again");
    EXPECT(keel_mixture_new(weights, 4, 43, names, &other) == KEEL_OK, "another seed");
    if (!m || !again || !other) return;
    /* 8192 * (3, 1, 0, 0.5) / 4.5 = 5461.33, 1820.44, 0, 910.22: the one slot left to the largest remainder */
    uint32_t want[4] = {5461, 1821, 0, 910};
    for (int i = 0; i < 4; i++)
        EXPECT(keel_mixture_block_count(m, i) == want[i], "source %d: %u slots a block, want %u", i,
               keel_mixture_block_count(m, i), want[i]);
    static int source[N_POS];
    static uint64_t sample[N_POS];
    uint64_t next[4] = {0}, in_block[4] = {0};
    int out_of_order = 0, wrong_block = 0, differs = 0, same_as_again = 0;
    for (uint64_t g = 0; g < N_POS; g++) {
        keel_mixture_locate(m, g, &source[g], &sample[g]);
        int s;
        uint64_t k;
        keel_mixture_locate(again, g, &s, &k);
        same_as_again += s == source[g] && k == sample[g];
        keel_mixture_locate(other, g, &s, &k);
        differs += s != source[g];
        out_of_order += sample[g] != next[source[g]]++;
        in_block[source[g]]++;
        if ((g + 1) % BLOCK == 0) {
            for (int i = 0; i < 4; i++) wrong_block += in_block[i] != want[i], in_block[i] = 0;
        }
    }
    EXPECT(out_of_order == 0, "every source's samples come as 0, 1, 2, ... (%d out of order)", out_of_order);
    EXPECT(wrong_block == 0, "every whole block holds the apportioned counts (%d wrong)", wrong_block);
    EXPECT(next[2] == 0, "a source of weight 0 is never drawn (%llu times)", (unsigned long long)next[2]);
    EXPECT(same_as_again == N_POS, "the same weights and seed give the same order (%d of %d)", same_as_again, N_POS);
    EXPECT(differs > N_POS / 4, "another seed gives another order (%d of %d positions differ)", differs, N_POS);
    /* a block is shuffled: the first 1000 positions are not all of one source */
    int first_a = 0;
    for (int g = 0; g < 1000; g++) first_a += source[g] == 0;
    EXPECT(first_a > 500 && first_a < 800, "source a takes %d of the first 1000 (2/3 expected)", first_a);
    /* any position, found out of order (each rank's slice of a step, a resume), is the same */
    int random_ok = 0;
    uint64_t x = 7;
    for (int i = 0; i < 5000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t g = (x >> 20) % N_POS;
        int s;
        uint64_t k;
        keel_mixture_locate(again, g, &s, &k);
        random_ok += s == source[g] && k == sample[g];
    }
    EXPECT(random_ok == 5000, "positions found out of order match (%d of 5000)", random_ok);
    keel_mixture_free(m);
    keel_mixture_free(again);
    keel_mixture_free(other);
}

static void refusals(void) {
    const char *names[] = {"dir/a", "dir/b"};
    keel_mixture *m = NULL;
    double zeros[] = {0, 0};
    capture_begin();
    keel_status st = keel_mixture_new(zeros, 2, 1, names, &m);
    const char *msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && !m && strstr(msg, "sum to 0") && count_lines(msg) == 1, "weights of 0: %s", msg);
    double tiny[] = {1, 1e-5};
    capture_begin();
    st = keel_mixture_new(tiny, 2, 1, names, &m);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && !m && strstr(msg, "dir/b") && strstr(msg, "weight 1e-05") && count_lines(msg) == 1,
           "a weight too small for one slot: %s", msg);
    double one[] = {2};
    EXPECT(keel_mixture_new(one, 1, 1, names, &m) == KEEL_OK && keel_mixture_block_count(m, 0) == BLOCK,
           "one source takes every slot");
    keel_mixture_free(m);
}

int main(void) {
    counts_and_order();
    refusals();
    return test_summary("test_mixture");
}
