/* The FSDP shard plan for any world size and model shape: padded equal
 * shards, every parameter owned by exactly one rank, the persistent-memory
 * formula, and AdamW on shard buffers equal bit for bit to AdamW on the whole
 * parameter vector (decay masks split correctly across shard boundaries). */
#include <stdlib.h>
#include <string.h>

#include "keel/fsdp.h"
#include "keel/kernels.h"
#include "../testlib.h"

static void check_plan(const keel_model_layout *lay, int W) {
    keel_fsdp_plan plan;
    keel_fsdp_plan_init(&plan, lay, W);
    bool padded_ok = true, cover_ok = true, offsets_ok = true;
    int64_t padded_total = 0, next_offset = 0;
    for (int u = 0; u < plan.n_units; u++) {
        const keel_fsdp_unit *x = &plan.units[u];
        padded_ok &= x->padded % ((int64_t)W * KEEL_FSDP_ALIGN) == 0 && x->padded >= x->logical &&
                     x->padded - x->logical < (int64_t)W * KEEL_FSDP_ALIGN && x->shard * W == x->padded;
        offsets_ok &= x->shard_offset == next_offset;
        next_offset += x->shard;
        padded_total += x->padded;
        int64_t expect = x->offset; /* ranks' ranges tile the unit in rank order */
        for (int r = 0; r < W; r++) {
            int64_t begin, len;
            keel_fsdp_shard_range(&plan, u, r, &begin, &len);
            if (len > 0) cover_ok &= begin == expect;
            expect += len;
        }
        cover_ok &= expect == x->offset + x->logical;
    }
    EXPECT(padded_ok, "W=%d: units padded to multiples of W*%d, shards equal", W, KEEL_FSDP_ALIGN);
    EXPECT(cover_ok, "W=%d: every parameter is owned by exactly one rank, in order", W);
    EXPECT(offsets_ok && plan.shard_total == next_offset, "W=%d: shard buffer offsets", W);
    EXPECT(keel_fsdp_persistent_bytes(&plan) * W == 16 * padded_total,
           "W=%d: FULL_SHARD persistent bytes = 16 x padded params / W (%lld)", W,
           (long long)keel_fsdp_persistent_bytes(&plan));
    keel_fsdp_plan_free(&plan);
}

/* AdamW over every rank's shard buffer gives the same bits as over the full vector. */
static void check_optimizer(const keel_model_layout *lay, int W) {
    keel_config cfg;
    keel_config_defaults(&cfg);
    cfg.train.weight_decay = 0.3; /* so a wrong decay mask shows */
    int64_t n = lay->n_params;
    float *p_full = keel_xmalloc(4 * (size_t)n, "p"), *g_full = keel_xmalloc(4 * (size_t)n, "g");
    uint64_t s = 99;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        p_full[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
        g_full[i] = 0.01f * p_full[(i * 7) % n];
    }
    float *p_ref = keel_xmalloc(4 * (size_t)n, "p");
    memcpy(p_ref, p_full, 4 * (size_t)n);
    keel_optim *full;
    keel_optim_build(&cfg.train, lay, 0, n, NULL, &full);
    for (int step = 0; step < 3; step++) keel_optim_update(full, p_ref, g_full, step, 1e-2, 0.5);

    keel_fsdp_plan plan;
    keel_fsdp_plan_init(&plan, lay, W);
    bool same = true;
    for (int r = 0; r < W; r++) {
        keel_param_range *ranges;
        int nr = keel_fsdp_param_ranges(&plan, r, &ranges);
        float *p = keel_xcalloc(4 * (size_t)plan.shard_total, "shard p");
        float *g = keel_xcalloc(4 * (size_t)plan.shard_total, "shard g");
        for (int i = 0; i < nr; i++) {
            memcpy(p + ranges[i].buffer_offset, p_full + ranges[i].begin, 4 * (size_t)ranges[i].len);
            memcpy(g + ranges[i].buffer_offset, g_full + ranges[i].begin, 4 * (size_t)ranges[i].len);
        }
        keel_optim *opt;
        keel_optim_build_ranges(&cfg.train, lay, ranges, nr, plan.shard_total, NULL, &opt);
        for (int step = 0; step < 3; step++) keel_optim_update(opt, p, g, step, 1e-2, 0.5);
        for (int i = 0; i < nr; i++)
            same &= !memcmp(p + ranges[i].buffer_offset, p_ref + ranges[i].begin, 4 * (size_t)ranges[i].len);
        keel_optim_free(opt);
        keel_free(p), keel_free(g), keel_free(ranges);
    }
    EXPECT(same, "W=%d: AdamW on the shards = AdamW on the whole vector, bit for bit", W);
    keel_fsdp_plan_free(&plan);
    keel_optim_free(full);
    keel_free(p_full), keel_free(g_full), keel_free(p_ref);
    keel_config_free(&cfg);
}

int main(void) {
    keel_kernels_init(2);
    /* Odd sizes everywhere: no unit is a multiple of any W * 16. */
    keel_model_config shapes[] = {
        {.dim = 36, .n_layers = 3, .n_heads = 6, .n_kv_heads = 2, .vocab_size = 101,
         .multiple_of = 5, .norm_eps = 1e-5, .rope_theta = 1e4, .max_seq_len = 8},
        {.dim = 36, .n_layers = 2, .n_heads = 6, .n_kv_heads = 6, .vocab_size = 97,
         .multiple_of = 5, .norm_eps = 1e-5, .rope_theta = 1e4, .max_seq_len = 8, .tie_embeddings = true},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        keel_model_layout lay;
        keel_model_layout_init(&lay, &shapes[i]);
        for (int W = 1; W <= 8; W++) {
            check_plan(&lay, W);
            check_optimizer(&lay, W);
        }
        keel_model_layout_free(&lay);
    }
    keel_kernels_shutdown();
    return test_summary("test_shard_plan");
}
