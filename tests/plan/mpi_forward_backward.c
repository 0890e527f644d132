/* One sharded forward + backward of a config's model, no optimizer: for
 * shapes whose training state does not fit this machine but whose
 * gradients must still come out right (the 70B-width slice). Each rank fills
 * only its shard (counter-based init), runs a micro-batch of synthetic
 * tokens, reduce-scatters its gradients, then takes one small step along
 * the gradient on its master shard and runs the forward again: the global
 * loss must fall, which a wrong gradient (sign, unit, shard or offset mix-up)
 * would not do. Prints one JSON line from rank 0.
 * Usage: mpirun -np W mpi_forward_backward CONFIG [KEY=VALUE...] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "keel/data.h"
#include "keel/comm.h"
#include "keel/fsdp.h"
#include "keel/kernels.h"
#include "keel/model.h"

typedef struct {
    const keel_model_layout *lay;
    uint64_t seed;
} init_source;

static keel_status init_range(void *p, int64_t begin, int64_t len, float *dst) {
    init_source *s = p;
    keel_model_init_range(s->lay, s->seed, begin, len, dst);
    return KEEL_OK;
}

/* The global mean loss of this rank's micro-batch and every other's. */
static double global_loss(keel_model *m, keel_comm *world, const int32_t *tokens, int B, int T,
                          float grad_scale) {
    double loss = keel_model_forward(m, tokens, NULL, B, grad_scale);
    keel_comm_allreduce_scalar(world, &loss, KEEL_COMM_SUM);
    return loss / ((double)keel_comm_size(world) * B * T);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: mpi_forward_backward CONFIG [KEY=VALUE...]\n");
        return 2;
    }
    keel_comm *world;
    if (keel_comm_init(&world) != KEEL_OK) return 1;
    int rank = keel_comm_rank(world), W = keel_comm_size(world);
    keel_config cfg;
    keel_config_defaults(&cfg);
    if (keel_config_load_file(&cfg, argv[1]) != KEEL_OK) return 2;
    for (int i = 2; i < argc; i++)
        if (keel_config_set(&cfg, argv[i]) != KEEL_OK) return 2;
    if (keel_config_finalize(&cfg) != KEEL_OK) return 2;
    int local = keel_comm_local_size(world), cores = keel_cores_allowed();
    keel_kernels_init(cfg.train.threads ? cfg.train.threads : (cores / local > 1 ? cores / local : 1));

    int B = cfg.train.micro_batch_size, T = cfg.model.max_seq_len;
    keel_model_options opts = {.checkpoint_blocks = keel_config_checkpoint_blocks(&cfg),
                               .bf16 = cfg.fsdp.mixed_precision == KEEL_DTYPE_BF16,
                               .unit = cfg.fsdp.unit};
    keel_model *m;
    keel_model_build_with(&cfg.model, B, &opts, &m);
    keel_fsdp *f;
    if (keel_fsdp_build(m, world, cfg.fsdp.strategy, cfg.fsdp.shard_group_size, &f) != KEEL_OK) return 2;
    keel_fsdp_set_prefetch(f, cfg.fsdp.prefetch);
    keel_fsdp_set_reduce_bf16(f, cfg.fsdp.reduce_dtype == KEEL_DTYPE_BF16);
    init_source src = {keel_model_get_layout(m), cfg.train.seed};
    double t0 = keel_now_s();
    keel_fsdp_fill(f, init_range, &src);
    double init_s = keel_now_s() - t0;

    keel_data *data;
    if (keel_data_open(&cfg.data, "train", T, cfg.model.vocab_size, 1, &data) != KEEL_OK) return 1;
    int32_t *tokens = keel_xmalloc(sizeof(int32_t) * (size_t)B * (T + 1), "tokens");
    keel_data_fetch(data, 0, (uint64_t)B * W, (uint64_t)rank * B, B, tokens, NULL);

    t0 = keel_now_s();
    keel_fsdp_zero_grads(f);
    double loss = global_loss(m, world, tokens, B, T, 1.0f / (float)((double)W * B * T));
    keel_model_backward(m);
    keel_fsdp_finish_grads(f);
    double step_s = keel_now_s() - t0, sumsq;
    keel_fsdp_grad_sumsq(f, &sumsq);

    /* master -= eta g / |g|: a step of length eta in parameter space lowers
     * the loss by ~eta |g| when g is the true gradient. */
    double norm = sqrt(sumsq), eta = 0.05;
    float *master = keel_fsdp_master(f);
    const float *g = keel_fsdp_grads(f);
    const keel_fsdp_plan *plan = keel_fsdp_get_plan(f);
    for (int64_t i = 0; i < plan->shard_total && norm > 0; i++) master[i] -= (float)(eta * g[i] / norm);
    keel_fsdp_invalidate(f);
    double after = global_loss(m, world, tokens, B, T, 0.0f);

    keel_fsdp_memory plan_mem;
    keel_fsdp_memory_plan(&cfg, W, &plan_mem);
    /* what this program holds: the plan's rank without AdamW and a checkpoint buffer */
    int64_t planned = keel_fsdp_memory_total(&plan_mem) - plan_mem.optimizer - plan_mem.checkpoint_buffer -
                      plan_mem.snapshot;
    double peak = (double)keel_peak_rss_bytes(), peak_max = peak;
    keel_comm_allreduce_scalar(world, &peak_max, KEEL_COMM_MAX);
    if (rank == 0)
        printf("{\"ranks\": %d, \"n_params\": %lld, \"units\": %d, \"loss\": %.6f, \"loss_after_step\": %.6f, "
               "\"grad_norm\": %.6g, \"predicted_drop\": %.6g, \"init_s\": %.2f, \"fwd_bwd_s\": %.2f, "
               "\"peak_rss_bytes\": %.0f, \"planned_bytes\": %lld}\n",
               W, (long long)keel_model_get_layout(m)->n_params, plan->n_units, loss, after, norm,
               eta * norm, init_s, step_s, peak_max, (long long)planned);
    keel_free(tokens);
    keel_data_close(data);
    keel_fsdp_free(f);
    keel_model_free(m);
    keel_config_free(&cfg);
    keel_kernels_shutdown();
    keel_comm_finalize(world);
    return 0;
}
