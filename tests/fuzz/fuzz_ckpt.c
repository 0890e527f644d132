/* tests/fuzz/fuzz_ckpt.c: keel checkpoints — the first byte chooses what the
 * rest is:
 *   0  manifest.json (keel_ckpt_parse_manifest, what keel_ckpt_open reads it
 *      with), then its config and the model its units hold
 *      (keel_ckpt_load_config), as `keel ckpt verify` checks them
 *   1  a u32 (little-endian) manifest length, the manifest, then shard file
 *      0: written into a scratch directory and opened, verified and read
 *      whole through the file readers (keel_ckpt_open, keel_ckpt_verify_all,
 *      keel_ckpt_read), the read attempted even when the checksum fails
 *      (a read must stay inside the files whatever they hold) */
#include "keel/ckpt.h"

#include "fuzz.h"

static void check_model(const keel_ckpt *ck, bool read_all) {
    keel_config cfg;
    fuzz_quiet();
    keel_status st = keel_ckpt_load_config(ck, &cfg);
    fuzz_expect_error_line(st, "keel_ckpt_load_config");
    if (st == KEEL_OK && read_all) {
        keel_model_layout lay;
        keel_model_layout_init(&lay, &cfg.model);
        fuzz_quiet();
        keel_ckpt_verify_all(ck);
        float *params = malloc(sizeof(float) * (size_t)lay.n_params);
        for (int a = 0; a < KEEL_CKPT_ARRAYS; a++) {
            fuzz_quiet();
            st = keel_ckpt_read(ck, a, 0, lay.n_params, params);
            fuzz_expect_error_line(st, "keel_ckpt_read");
        }
        free(params);
        keel_model_layout_free(&lay);
    }
    keel_config_free(&cfg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fuzz_quiet();
    keel_ckpt ck;
    keel_status st;
    if (data[0] % 2 == 0) {
        st = keel_ckpt_parse_manifest((const char *)data + 1, size - 1, "fuzz-ckpt", &ck);
        fuzz_expect_error_line(st, "keel_ckpt_parse_manifest");
        if (st == KEEL_OK) {
            check_model(&ck, false);
            keel_ckpt_close(&ck);
        }
        return 0;
    }
    if (size < 5) return 0;
    uint32_t m = data[1] | (uint32_t)data[2] << 8 | (uint32_t)data[3] << 16 | (uint32_t)data[4] << 24;
    if (m > size - 5) m = (uint32_t)(size - 5);
    const char *dir = fuzz_dir();
    char ckpt[256];
    snprintf(ckpt, sizeof ckpt, "%s/step_00000000", dir);
    fuzz_write(ckpt, "manifest.json", data + 5, m);
    fuzz_write(ckpt, "shard-00000-of-00001.bin", data + 5 + m, size - 5 - m);
    st = keel_ckpt_open(ckpt, &ck);
    fuzz_expect_error_line(st, "keel_ckpt_open");
    if (st == KEEL_OK) {
        check_model(&ck, true);
        keel_ckpt_close(&ck);
    }
    return 0;
}
