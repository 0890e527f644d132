/* train/eval.c: `keel eval` — mean loss of a run's weights, or of a
 * checkpoint's (or a run's newest good checkpoint), over a token file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "keel/ckpt.h"
#include "keel/data.h"
#include "keel/kernels.h"
#include "keel/model.h"
#include "keel/run.h"
#include "keel/train.h"

/* A prepared directory is evaluated on its val split when it has one. */
static const char *eval_split(const char *data_path) {
    struct stat sb;
    char probe[4096];
    if (stat(data_path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return "train";
    snprintf(probe, sizeof probe, "%s/val-00000.bin", data_path);
    return stat(probe, &sb) == 0 ? "val" : "train";
}

/* The model to evaluate: a run's final weights (RUN/config.json +
 * RUN/weights.bin), else a checkpoint or a run's newest good checkpoint. */
static keel_status load_model(const char *path, keel_config *cfg, float **params) {
    char weights[4200];
    keel_run_path(weights, sizeof weights, path, KEEL_RUN_WEIGHTS);
    if (!keel_path_exists(weights)) return keel_ckpt_load_model(path, cfg, params, NULL);
    keel_status st = keel_run_load_config(path, cfg);
    if (st != KEEL_OK) return st;
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    *params = keel_xmalloc(sizeof(float) * (size_t)lay.n_params, "parameters");
    st = keel_weights_load(weights, *params, lay.n_params);
    keel_model_layout_free(&lay);
    return st;
}

keel_status keel_eval_run(const char *path, const char *data_path, double *mean_loss, uint64_t *tokens) {
    keel_config cfg;
    keel_data *data = NULL;
    keel_model *m = NULL;
    int32_t *buf = NULL;
    uint8_t *flags = NULL;
    float *params = NULL;
    keel_status st = load_model(path, &cfg, &params);
    if (st != KEEL_OK) goto done;
    int T = cfg.model.max_seq_len, B = cfg.train.micro_batch_size;
    st = keel_data_open_path(data_path, eval_split(data_path), T, cfg.model.vocab_size, cfg.train.seed, &data);
    if (st != KEEL_OK) goto done;
    /* a run trained with document masking is evaluated with it, as it was trained */
    bool document_mask = cfg.data.document_mask && keel_data_has_doc_starts(data);
    keel_kernels_init(cfg.train.threads);
    keel_model_build_with(&cfg.model, B, &(keel_model_options){.own_params = true, .document_mask = document_mask}, &m);
    const keel_model_layout *lay = keel_model_get_layout(m);
    memcpy(keel_model_params(m), params, sizeof(float) * (size_t)lay->n_params);
    keel_model_params_changed(m);
    uint64_t n = keel_data_n_samples(data);
    buf = keel_xmalloc(sizeof(int32_t) * (size_t)B * (T + 1), "tokens");
    if (keel_data_has_mask(data) || document_mask) flags = keel_xmalloc((size_t)B * (T + 1), "the tokens' flags");
    double loss = 0;
    uint64_t targets = 0;
    for (uint64_t first = 0; first < n; first += (uint64_t)B) {
        int rows = (int)(n - first < (uint64_t)B ? n - first : (uint64_t)B);
        keel_data_fetch(data, 0, n, first, rows, buf, flags);
        loss += keel_model_forward(m, buf, flags, rows, 0.0f);
        targets += flags ? keel_data_targets_in(flags, rows, T) : (uint64_t)rows * T;
    }
    *tokens = targets;
    *mean_loss = targets ? loss / (double)targets : 0.0;
done:
    keel_free(buf);
    keel_free(flags);
    keel_free(params);
    keel_model_free(m);
    keel_data_close(data);
    keel_config_free(&cfg);
    keel_kernels_shutdown();
    return st;
}
