/* tests/fuzz/fuzz_hf.c: Hugging Face directories — the first byte chooses
 * what the rest is:
 *   0  config.json (keel_hf_parse_config, what keel_hf_open reads it with)
 *   1  model.safetensors.index.json (safetensors_parse_index)
 *   2  a safetensors file (safetensors_parse_header over the whole input)
 *   3  model.safetensors beside tests/fuzz/data/hf/config.json, imported
 *      as `keel ckpt import` does it (keel_hf_open, keel_ckpt_write_model)
 *   4  model.safetensors.index.json beside that config.json and the two
 *      split files of tests/fuzz/data/hf, imported so
 *   5  generation_config.json (keel_hf_generation_config, what keel
 *      generate reads its stop ids with)
 *   6  a PEFT adapter_config.json (keel_hf_parse_peft_config, what keel
 *      ckpt import --from-peft reads it with)
 * Modes 3 and 4 run the shipped file readers over files in a scratch
 * directory; a failed import must leave no checkpoint and no .tmp behind. */
#include <cjson/cJSON.h>

#include "hf/safetensors.h"
#include "keel/ckpt.h"
#include "keel/hf.h"

#include "fuzz.h"

#ifndef KEEL_FUZZ_DATA
#error "KEEL_FUZZ_DATA: the directory of hf/ (tests/fuzz/CMakeLists.txt sets it)"
#endif

static char *slurp(const char *name, size_t *len) {
    char *text, path[512];
    snprintf(path, sizeof path, "%s/hf/%s", KEEL_FUZZ_DATA, name);
    if (keel_read_file(path, &text, len) != KEEL_OK) abort();
    return text;
}

static char *config_json, *split1, *split2;
static size_t config_len, split1_len, split2_len;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    config_json = slurp("config.json", &config_len);
    split1 = slurp("model-00001-of-00002.safetensors", &split1_len);
    split2 = slurp("model-00002-of-00002.safetensors", &split2_len);
    return 0;
}

/* `keel ckpt import --from-hf dir --out dir/ckpt` (src/cli/cmd_ckpt.c). */
static void import(const char *dir) {
    keel_config cfg;
    keel_config_defaults(&cfg);
    cfg.data.synthetic = true;
    keel_hf_reader *hf = NULL;
    char out[512], tmp[520];
    snprintf(out, sizeof out, "%s/ckpt", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    fuzz_quiet();
    keel_status st = keel_hf_open(dir, &cfg.model, &hf);
    fuzz_expect_error_line(st, "keel_hf_open");
    if (st == KEEL_OK) {
        st = keel_ckpt_write_model(out, &cfg, keel_hf_read, hf, NULL, 0);
        fuzz_expect_error_line(st, "keel_ckpt_write_model");
        if (st != KEEL_OK && (keel_path_exists(out) || keel_path_exists(tmp))) {
            fprintf(stderr, "a failed import left %s behind\n", keel_path_exists(out) ? out : tmp);
            abort();
        }
    }
    keel_hf_close(hf);
    keel_config_free(&cfg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fuzz_quiet();
    const uint8_t *body = data + 1;
    size_t n = size - 1;
    keel_status st;
    switch (data[0] % 7) {
    case 0: {
        keel_model_config cfg;
        st = keel_hf_parse_config((const char *)body, n, "config.json", &cfg);
        fuzz_expect_error_line(st, "keel_hf_parse_config");
        break;
    }
    case 1: {
        cJSON *index;
        st = safetensors_parse_index((const char *)body, n, "model.safetensors.index.json", &index);
        fuzz_expect_error_line(st, "safetensors_parse_index");
        cJSON_Delete(index);
        break;
    }
    case 2: {
        cJSON *header;
        int64_t data_start;
        st = safetensors_parse_header(body, n, (int64_t)n, "model.safetensors", &header, &data_start);
        fuzz_expect_error_line(st, "safetensors_parse_header");
        if (st == KEEL_OK && (data_start < 8 || data_start > (int64_t)n)) abort();
        cJSON_Delete(header);
        break;
    }
    case 3: {
        const char *dir = fuzz_dir();
        fuzz_write(dir, "config.json", config_json, config_len);
        fuzz_write(dir, SAFETENSORS_SINGLE, body, n);
        import(dir);
        break;
    }
    case 5: {
        int bos, n_eos;
        int32_t eos[KEEL_HF_MAX_EOS];
        st = keel_hf_generation_config((const char *)body, n, "generation_config.json", 32000, &bos, eos, &n_eos);
        fuzz_expect_error_line(st, "keel_hf_generation_config");
        if (st == KEEL_OK && (n_eos < 0 || n_eos > KEEL_HF_MAX_EOS || bos >= 32000)) abort();
        break;
    }
    case 6: {
        keel_lora_config lc;
        st = keel_hf_parse_peft_config((const char *)body, n, "adapter_config.json", &lc);
        fuzz_expect_error_line(st, "keel_hf_parse_peft_config");
        if (st == KEEL_OK && (lc.rank < 1 || lc.rank > 1 << 16 || !lc.targets || lc.targets >> KEEL_LORA_TARGETS ||
                              !(lc.alpha >= 0) || !(lc.dropout >= 0 && lc.dropout <= 0.99)))
            abort();
        break;
    }
    default: {
        const char *dir = fuzz_dir();
        fuzz_write(dir, "config.json", config_json, config_len);
        fuzz_write(dir, "model-00001-of-00002.safetensors", split1, split1_len);
        fuzz_write(dir, "model-00002-of-00002.safetensors", split2, split2_len);
        fuzz_write(dir, SAFETENSORS_INDEX, body, n);
        import(dir);
        break;
    }
    }
    return 0;
}
