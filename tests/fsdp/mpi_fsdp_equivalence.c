/* FULL_SHARD over W ranks follows the single-process run: every rank also
 * trains the unsharded model on the whole global batch (the reference), and
 * the sharded run must match its loss every step and its final parameters
 * (relative difference <= 1e-5: only the reduction order differs).
 * Usage: mpirun -np W mpi_fsdp_equivalence STEPS TIED STRATEGY [SHARD_GROUP_SIZE] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/data.h"
#include "keel/comm.h"
#include "keel/fsdp.h"
#include "keel/kernels.h"
#include "keel/model.h"
#include "keel/optim.h"

#define G 12 /* global batch in sequences: divisible by W = 1, 2, 3, 4 */

static double step_full(keel_model *m, keel_optim *opt, keel_data *d, const keel_train_config *tc,
                        int step, int32_t *tokens, int T) {
    keel_model_zero_grads(m);
    keel_data_fetch(d, (uint64_t)step, G, 0, G, tokens, NULL);
    double loss = keel_model_forward(m, tokens, NULL, G, 1.0f / (float)(G * T));
    keel_model_backward(m);
    const keel_model_layout *lay = keel_model_get_layout(m);
    double norm = sqrt(keel_sumsq(keel_model_grads(m), lay->n_params));
    keel_optim_update(opt, keel_model_params(m), keel_model_grads(m), step, keel_lr_at(tc, step),
                      keel_clip_scale(norm, tc->grad_clip));
    return loss / (G * T);
}

static double step_sharded(keel_model *m, keel_fsdp *f, keel_optim *opt, keel_comm *world,
                           keel_data *d, const keel_train_config *tc, int step, int32_t *tokens,
                           int T, int rank, int B) {
    keel_fsdp_zero_grads(f);
    keel_data_fetch(d, (uint64_t)step, G, (uint64_t)rank * B, B, tokens, NULL);
    double loss = keel_model_forward(m, tokens, NULL, B, 1.0f / (float)(G * T));
    keel_model_backward(m);
    keel_fsdp_finish_grads(f);
    double sumsq;
    keel_fsdp_grad_sumsq(f, &sumsq);
    keel_optim_update(opt, keel_fsdp_master(f), keel_fsdp_grads(f), step, keel_lr_at(tc, step),
                      keel_clip_scale(sqrt(sumsq), tc->grad_clip));
    keel_fsdp_invalidate(f);
    keel_comm_allreduce_scalar(world, &loss, KEEL_COMM_SUM);
    return loss / (G * T);
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 10;
    bool tied = argc > 2 && atoi(argv[2]) != 0;
    int group_size = argc > 4 ? atoi(argv[4]) : 0;
    keel_comm *world;
    if (keel_comm_init(&world) != KEEL_OK) return 1;
    int rank = keel_comm_rank(world), W = keel_comm_size(world), B = G / W;
    keel_kernels_init(1);

    keel_config cfg;
    keel_config_defaults(&cfg);
    char assignment[64];
    snprintf(assignment, sizeof assignment, "fsdp.strategy=%s", argc > 3 ? argv[3] : "full_shard");
    if (keel_config_set(&cfg, assignment) != KEEL_OK) return 2;
    for (int i = 5; i < argc; i++) /* more KEY=VALUE: fsdp.unit, fsdp.activation_checkpointing */
        if (keel_config_set(&cfg, argv[i]) != KEEL_OK) return 2;
    keel_fsdp_strategy strategy = cfg.fsdp.strategy;
    cfg.model = (keel_model_config){.dim = 48, .n_layers = 3, .n_heads = 6, .n_kv_heads = 2,
                                    .vocab_size = 97, .multiple_of = 7, .norm_eps = 1e-5,
                                    .rope_theta = 10000, .max_seq_len = 16, .tie_embeddings = tied};
    cfg.train.steps = steps, cfg.train.lr = 3e-3, cfg.train.min_lr = 3e-4, cfg.train.warmup_steps = 2;
    cfg.data.synthetic = true;
    int T = cfg.model.max_seq_len;
    keel_data *data;
    if (keel_data_open(&cfg.data, "train", T, cfg.model.vocab_size, 1, &data) != KEEL_OK) return 1;
    int32_t *tokens = malloc(sizeof(int32_t) * G * (T + 1));

    keel_model *full;
    keel_model_build(&cfg.model, G, &full);
    keel_model_init_weights(full, 42);
    const keel_model_layout *lay = keel_model_get_layout(full);
    keel_optim *full_opt;
    keel_optim_build(&cfg.train, lay, 0, lay->n_params, NULL, &full_opt);

    keel_model *m;
    keel_model_options opts = {.unit = cfg.fsdp.unit,
                               .checkpoint_blocks = keel_config_checkpoint_blocks(&cfg)};
    keel_model_build_with(&cfg.model, B, &opts, &m);
    keel_fsdp *f;
    if (keel_fsdp_build(m, world, strategy, group_size, &f) != KEEL_OK) return 2;
    bool window = keel_fsdp_set_node_windows(f, cfg.fsdp.node_windows); /* on by default, as in keel train */
    keel_fsdp_fill(f, keel_params_from_buffer, keel_model_params(full));
    const keel_fsdp_plan *plan = keel_fsdp_get_plan(f);
    keel_param_range *ranges;
    int nr = keel_fsdp_param_ranges(plan, keel_fsdp_shard_rank(f), &ranges);
    keel_optim *opt;
    keel_optim_build_ranges(&cfg.train, lay, ranges, nr, plan->shard_total, NULL, &opt);

    int failures = 0;
    double worst = 0;
    for (int s = 0; s < steps; s++) {
        double ref = step_full(full, full_opt, data, &cfg.train, s, tokens, T);
        double got = step_sharded(m, f, opt, world, data, &cfg.train, s, tokens, T, rank, B);
        double rel = fabs(got - ref) / fabs(ref);
        worst = fmax(worst, rel);
        if (!(rel <= 1e-5)) failures++;
        if (rank == 0) printf("W=%d step %2d loss sharded %.7f full %.7f rel %.1e\n", W, s + 1, got, ref, rel);
    }
    float *gathered = malloc(sizeof(float) * (size_t)lay->n_params);
    for (int u = 0; u < plan->n_units; u++) {
        const float *unit;
        keel_fsdp_gather_unit(f, u, &unit);
        memcpy(gathered + plan->units[u].offset, unit, sizeof(float) * (size_t)plan->units[u].logical);
    }
    const float *want = keel_model_params(full);
    /* Parameters by norm: Adam turns rounding-level differences in a near-zero
     * gradient into lr-sized steps of either sign for a few elements, so the
     * largest single difference says little; the relative L2 distance is the
     * meaningful measure. */
    double sq_err = 0, sq_ref = 0, max_err = 0;
    for (int64_t i = 0; i < lay->n_params; i++) {
        double e = (double)gathered[i] - want[i];
        sq_err += e * e, sq_ref += (double)want[i] * want[i];
        max_err = fmax(max_err, fabs(e));
    }
    double rel_l2 = sqrt(sq_err / sq_ref);
    uint64_t fnv = 1469598103934665603ull; /* the gathered parameters' bytes: windows on and off agree bit for bit */
    for (size_t i = 0; i < sizeof(float) * (size_t)lay->n_params; i++)
        fnv = (fnv ^ ((const unsigned char *)gathered)[i]) * 1099511628211ull;
    if (!(rel_l2 <= 1e-5)) failures++;
    keel_fsdp_stats st;
    keel_fsdp_get_stats(f, &st);
    /* What this rank really allocated for persistent state = 16 x padded
     * params / ranks in the shard group (W for FULL_SHARD). */
    int64_t padded_total = 0;
    for (int u = 0; u < plan->n_units; u++) padded_total += plan->units[u].padded;
    int64_t persistent = st.master_bytes + st.grad_bytes + keel_optim_state_bytes(opt);
    int shard_ranks = plan->shard_ranks;
    bool memory_ok = persistent * shard_ranks == 16 * padded_total &&
                     persistent == keel_fsdp_persistent_bytes(plan) &&
                     (strategy != KEEL_FSDP_FULL_SHARD || shard_ranks == W);
    if (!memory_ok) failures++;
    double total_failures = failures;
    keel_comm_allreduce_scalar(world, &total_failures, KEEL_COMM_SUM);
    if (rank == 0) {
        printf("W=%d tied=%d %s: worst loss rel %.1e (tol 1e-5); final params |dp|/|p| %.1e (tol 1e-5), "
               "max |dp| %.1e; persistent bytes per rank %lld = 16 x %lld padded params / %d: %s\n",
               W, tied, argc > 3 ? argv[3] : "full_shard", worst, rel_l2, max_err,
               (long long)keel_fsdp_persistent_bytes(plan), (long long)padded_total, shard_ranks,
               memory_ok ? "ok" : "MISMATCH");
        printf("node window: %s; parameters fnv 0x%016llx\n", window ? "yes" : "no", (unsigned long long)fnv);
        printf("%s: %d failures\n", total_failures ? "FAILED" : "PASSED", (int)total_failures);
    }
    free(gathered), free(tokens), keel_free(ranges);
    keel_optim_free(opt), keel_optim_free(full_opt);
    keel_fsdp_free(f);
    keel_model_free(m), keel_model_free(full);
    keel_data_close(data);
    keel_config_free(&cfg);
    keel_kernels_shutdown();
    keel_comm_finalize(world);
    return total_failures != 0;
}
