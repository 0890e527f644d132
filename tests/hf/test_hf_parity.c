/* test_hf_parity: checkpoints saved by transformers' save_pretrained import
 * into keel, and keel's forward gives transformers' loss on the fixture's
 * tokens, in fp32 and in bf16 (tests/reference/fixtures):
 *   hf_tiny         LlamaForCausalLM, bfloat16 safetensors, GQA, untied head,
 *                   intermediate_size 96 off Llama's rule
 *   hf_tiny_llama3  the same as Llama 3.x has it: rope_theta 500000,
 *                   rope_scaling of type llama3 (transformers 5's
 *                   rope_parameters) with RoPE's frequencies in all three of
 *                   its bands, tied embeddings; keel's inverse frequencies
 *                   equal transformers' bit for bit
 * keel's own export of each then re-imports bit-identically.
 * A missing fixture is a failure, never a skip: regenerate with
 *     /opt/keel-torch/bin/python tests/reference/make_hf_parity.py
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "keel/hf.h"
#include "keel/kernels.h"
#include "keel/model.h"

#include "../testlib.h"

#define LOSS_TOL 1e-4      /* relative */
#define BF16_LOSS_TOL 1e-2 /* relative: keel's bf16 forward against transformers' fp32 */

typedef struct {
    const char *name;
    int T;
    bool tied;
    double theta;
    bool scaled; /* rope_scaling llama3: factor 8, low 1, high 4, original 64 */
} fixture;

static cJSON *read_json(const char *dir, const char *name) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        EXPECT(false, "%s: missing (regenerate with tests/reference/make_hf_parity.py)", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    s[fread(s, 1, (size_t)n, f)] = '\0';
    fclose(f);
    cJSON *j = cJSON_Parse(s);
    free(s);
    if (!j) EXPECT(false, "%s: not JSON", path);
    return j;
}

static double forward_loss(const keel_model_config *cfg, const float *params, const int32_t *tokens, int B,
                           bool bf16) {
    keel_model_options o = {.own_params = true, .bf16 = bf16};
    keel_model *m;
    if (keel_model_build_with(cfg, B, &o, &m) != KEEL_OK) return NAN;
    const keel_model_layout *lay = keel_model_get_layout(m);
    memcpy(keel_model_params(m), params, sizeof(float) * (size_t)lay->n_params);
    keel_model_params_changed(m); /* bf16: its copy of the weights */
    double loss = keel_model_forward(m, tokens, NULL, B, 0.0f) / ((double)B * cfg->max_seq_len);
    keel_model_free(m);
    return loss;
}

static void check(const char *src, const fixture *fx) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/reference/fixtures/%s", src, fx->name);

    keel_model_config cfg;
    float *params = NULL;
    keel_status st = keel_hf_import(dir, &cfg, &params);
    EXPECT(st == KEEL_OK, "import %s", dir);
    cJSON *expected = read_json(dir, "expected.json"), *tokens_json = read_json(dir, "tokens.json");
    if (st != KEEL_OK || !expected || !tokens_json) goto out;

    const keel_rope_scaling *rs = &cfg.rope_scaling;
    EXPECT(cfg.dim == 64 && cfg.n_layers == 2 && cfg.n_heads == 4 && cfg.n_kv_heads == 2 &&
               cfg.vocab_size == 128 && cfg.max_seq_len == fx->T && cfg.tie_embeddings == fx->tied &&
               cfg.norm_eps == 1e-5 && cfg.rope_theta == fx->theta,
           "%s config: dim %d, %d layers, %d heads, %d kv heads, vocab %d, T %d, tied %d, eps %g, theta %g",
           fx->name, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.max_seq_len,
           cfg.tie_embeddings, cfg.norm_eps, cfg.rope_theta);
    EXPECT(rs->on == fx->scaled &&
               (!fx->scaled || (rs->type == KEEL_ROPE_SCALING_LLAMA3 && rs->factor == 8 && rs->low_freq_factor == 1 &&
                                rs->high_freq_factor == 4 && rs->original_max_position_embeddings == 64)),
           "%s rope_scaling: on %d, factor %g, low %g, high %g, original %d", fx->name, rs->on, rs->factor,
           rs->low_freq_factor, rs->high_freq_factor, rs->original_max_position_embeddings);
    EXPECT(keel_model_ffn_hidden(&cfg) == 96,
           "intermediate_size 96 as multiple_of %d, ffn_dim_multiplier %.17g -> %d", cfg.multiple_of,
           cfg.ffn_dim_multiplier, keel_model_ffn_hidden(&cfg));
    const cJSON *inv_freq = cJSON_GetObjectItem(expected, "inv_freq");
    if (inv_freq) {
        int HS = cfg.dim / cfg.n_heads, same = 0, n = cJSON_GetArraySize(inv_freq);
        for (int i = 0; i < n && i < HS / 2; i++)
            same += (float)cJSON_GetArrayItem(inv_freq, i)->valuedouble ==
                    keel_rope_inv_freq(i, HS, cfg.rope_theta, &cfg.rope_scaling);
        EXPECT(n == HS / 2 && same == n, "%s: %d of %d RoPE inverse frequencies equal transformers'", fx->name,
               same, n);
    }

    int B = cJSON_GetArraySize(tokens_json), T = cfg.max_seq_len;
    const cJSON *want_n = cJSON_GetObjectItem(expected, "n_seqs");
    const cJSON *want_T = cJSON_GetObjectItem(expected, "T");
    const cJSON *want_loss = cJSON_GetObjectItem(expected, "mean_loss");
    if (!cJSON_IsNumber(want_n) || !cJSON_IsNumber(want_T) || !cJSON_IsNumber(want_loss) ||
        want_n->valueint != B || want_T->valueint != T || B < 1) {
        EXPECT(false, "%s: expected.json/tokens.json: %d rows, want n_seqs, T = %d, mean_loss", dir, B, T);
        goto out;
    }
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)B * (size_t)(T + 1));
    bool shape_ok = true;
    for (int b = 0; b < B; b++) {
        const cJSON *row = cJSON_GetArrayItem(tokens_json, b);
        shape_ok &= cJSON_GetArraySize(row) == T + 1;
        for (int t = 0; shape_ok && t <= T; t++) {
            int id = cJSON_GetArrayItem(row, t)->valueint;
            shape_ok &= id >= 0 && id < cfg.vocab_size;
            tokens[b * (T + 1) + t] = id;
        }
    }
    EXPECT(shape_ok, "tokens.json is (%d, %d) ids below vocab %d", B, T + 1, cfg.vocab_size);
    if (shape_ok) {
        double want = want_loss->valuedouble;
        for (int bf16 = 0; bf16 <= 1; bf16++) {
            double loss = forward_loss(&cfg, params, tokens, B, bf16), rel = fabs(loss - want) / fabs(want);
            double tol = bf16 ? BF16_LOSS_TOL : LOSS_TOL;
            EXPECT(rel <= tol, "%s mean loss, keel %s: %.9f, transformers fp32 %.9f, rel_err %.2e (tol %.0e)",
                   fx->name, bf16 ? "bf16" : "fp32", loss, want, rel, tol);
        }
    }
    free(tokens);

    /* Full circle: keel's export of the imported checkpoint imports to the same. */
    char tmp[256];
    if (temp_dir_create(tmp, sizeof tmp, "hf-parity")) {
        char out_dir[300];
        snprintf(out_dir, sizeof out_dir, "%s/export", tmp);
        keel_model_config again;
        float *params2 = NULL;
        keel_model_layout lay;
        keel_model_layout_init(&lay, &cfg);
        bool ok = keel_hf_export(&cfg, keel_params_from_buffer, (void *)params, NULL, NULL, out_dir, 0) == KEEL_OK &&
                  keel_hf_import(out_dir, &again, &params2) == KEEL_OK &&
                  again.dim == cfg.dim && again.n_layers == cfg.n_layers &&
                  again.n_heads == cfg.n_heads && again.n_kv_heads == cfg.n_kv_heads &&
                  again.vocab_size == cfg.vocab_size && again.multiple_of == cfg.multiple_of &&
                  again.ffn_dim_multiplier == cfg.ffn_dim_multiplier &&
                  again.norm_eps == cfg.norm_eps && again.rope_theta == cfg.rope_theta &&
                  memcmp(&again.rope_scaling, &cfg.rope_scaling, sizeof cfg.rope_scaling) == 0 &&
                  again.max_seq_len == cfg.max_seq_len && again.tie_embeddings == cfg.tie_embeddings &&
                  memcmp(params2, params, sizeof(float) * (size_t)lay.n_params) == 0;
        EXPECT(ok, "%s: keel's export of the imported checkpoint re-imports to the same config and parameters",
               fx->name);
        keel_free(params2);
        keel_model_layout_free(&lay);
        remove_tree(tmp);
    }
out:
    cJSON_Delete(expected);
    cJSON_Delete(tokens_json);
    keel_free(params);
}

int main(void) {
    const char *src = getenv("KEEL_SRC");
    if (!src) {
        printf("FAIL KEEL_SRC (the repository root) is not set\n");
        return 1;
    }
    keel_log_set_level(KEEL_LOG_WARN);
    keel_kernels_init(2);
    static const fixture fixtures[] = {
        {"hf_tiny", 32, false, 10000.0, false},
        {"hf_tiny_llama3", 128, true, 500000.0, true},
    };
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) check(src, &fixtures[i]);
    keel_kernels_shutdown();
    return test_summary("test_hf_parity");
}
