/* train/eval.c: `keel eval` — mean loss of a run's weights, or of a
 * checkpoint's, over a token file. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "keel/ckpt.h"
#include "keel/data.h"
#include "keel/kernels.h"
#include "keel/model.h"
#include "keel/train.h"

/* A prepared directory is evaluated on its val split when it has one. */
static const char *eval_split(const char *data_path) {
    struct stat sb;
    char probe[4096];
    if (stat(data_path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return "train";
    snprintf(probe, sizeof probe, "%s/val-00000.bin", data_path);
    return stat(probe, &sb) == 0 ? "val" : "train";
}

keel_status keel_eval_run(const char *run_dir, const char *data_path, double *mean_loss,
                          uint64_t *tokens) {
    char path[4096];
    keel_config cfg;
    keel_config_defaults(&cfg);
    keel_data *data = NULL;
    keel_model *m = NULL;
    int32_t *buf = NULL;
    keel_ckpt ck = {0};
    struct stat sb;
    snprintf(path, sizeof path, "%s/manifest.json", run_dir);
    bool checkpoint = stat(path, &sb) == 0;
    keel_status st;
    if (checkpoint) { /* a checkpoint directory: its manifest holds the config */
        st = keel_ckpt_open(run_dir, &ck);
        char *json = st == KEEL_OK ? keel_ckpt_config_json(&ck) : NULL;
        if (st == KEEL_OK && !json) {
            keel_errorf("%s: the manifest has no config", path);
            st = KEEL_ERR_INPUT;
        }
        if (st == KEEL_OK) st = keel_config_load_string(&cfg, json, path);
        free(json);
    } else {
        snprintf(path, sizeof path, "%s/config.json", run_dir);
        st = keel_config_load_file(&cfg, path);
    }
    if (st == KEEL_OK) st = keel_config_finalize(&cfg);
    if (st != KEEL_OK) goto done;
    int T = cfg.model.max_seq_len, B = cfg.train.micro_batch_size;
    st = keel_data_open_path(data_path, eval_split(data_path), T, cfg.model.vocab_size,
                             cfg.train.seed, &data);
    if (st != KEEL_OK) goto done;
    keel_kernels_init(cfg.train.threads);
    keel_model_build(&cfg.model, B, &m);
    const keel_model_layout *lay = keel_model_get_layout(m);
    snprintf(path, sizeof path, "%s/weights.bin", run_dir);
    st = checkpoint ? keel_ckpt_load_params(&ck, lay, keel_model_params(m))
                    : keel_weights_load(path, keel_model_params(m), lay->n_params);
    if (st != KEEL_OK) goto done;
    keel_model_params_changed(m);
    uint64_t n = keel_data_n_samples(data);
    buf = keel_xmalloc(sizeof(int32_t) * (size_t)B * (T + 1), "tokens");
    double loss = 0;
    for (uint64_t first = 0; first < n; first += (uint64_t)B) {
        int rows = (int)(n - first < (uint64_t)B ? n - first : (uint64_t)B);
        keel_data_fetch(data, 0, n, first, rows, buf);
        loss += keel_model_forward(m, buf, rows, 0.0f);
    }
    *tokens = n * (uint64_t)T;
    *mean_loss = loss / (double)*tokens;
done:
    keel_free(buf);
    keel_model_free(m);
    keel_data_close(data);
    keel_config_free(&cfg);
    if (checkpoint && ck.manifest) keel_ckpt_close(&ck);
    keel_kernels_shutdown();
    return st;
}
