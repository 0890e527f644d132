/* cli/cmd_ckpt.c: `keel ckpt list | verify | export | import`. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "keel/ckpt.h"
#include "keel/hf.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: keel ckpt list RUN_DIR      committed checkpoints: step, size, files, status\n"
            "       keel ckpt verify PATH       checksums of one checkpoint (RUN/checkpoints/step_N)\n"
            "                                   or of every checkpoint of a run; exit 1 on damage\n"
            "       keel ckpt export PATH --format safetensors --out DIR [--tokenizer M] [--max-shard-mb N]\n"
            "                                   a checkpoint (or a run's newest good one) as a Hugging\n"
            "                                   Face LlamaForCausalLM directory\n"
            "       keel ckpt import --from-hf DIR --out CKPT\n"
            "                                   a Hugging Face Llama directory as a keel checkpoint, to\n"
            "                                   fine-tune from with \"init_from\": CKPT\n");
}

/* Open (manifest, sizes, headers), check that the manifest's config is a
 * model its units hold, and with `verify` checksum every file: what export,
 * eval and a resume need, so "ok" means they will work. *ck is open only on
 * success. */
static keel_status check(const char *dir, bool verify, keel_ckpt *ck) {
    keel_status st = keel_ckpt_open(dir, ck);
    if (st != KEEL_OK) return st;
    keel_config cfg;
    st = keel_ckpt_load_config(ck, &cfg);
    keel_config_free(&cfg);
    if (st == KEEL_OK && verify) st = keel_ckpt_verify_all(ck);
    if (st != KEEL_OK) keel_ckpt_close(ck);
    return st;
}

static int list(const char *run_dir) {
    int64_t *steps;
    int n = keel_ckpt_list(run_dir, &steps);
    int64_t latest = keel_ckpt_latest(run_dir);
    printf("%-14s %10s %6s %6s  %s\n", "checkpoint", "MiB", "files", "ranks", "status");
    for (int i = 0; i < n; i++) {
        char dir[4096];
        keel_ckpt_dir(dir, sizeof dir, run_dir, steps[i], false);
        keel_ckpt ck;
        keel_error_capture(true);
        keel_status st = check(dir, false, &ck);
        keel_error_capture(false);
        if (st == KEEL_OK) {
            double bytes = 0;
            for (int j = 0; j < ck.shard_ranks; j++) bytes += (double)ck.files[j].bytes;
            printf("step_%08lld %10.1f %6d %6d  %scommitted\n", (long long)steps[i], bytes / (1 << 20),
                   ck.shard_ranks, ck.world_size, steps[i] == latest ? "LATEST, " : "");
            keel_ckpt_close(&ck);
        } else {
            printf("step_%08lld %10s %6s %6s  damaged: %s\n", (long long)steps[i], "-", "-", "-",
                   keel_last_error());
        }
    }
    if (n == 0) printf("(no committed checkpoints in %s/checkpoints)\n", run_dir);
    keel_free(steps);
    return 0;
}

static int verify(const char *path) {
    /* A checkpoint directory (step_N, or anything with a manifest), else a run. */
    char manifest[4200];
    snprintf(manifest, sizeof manifest, "%s/manifest.json", path);
    struct stat sb;
    int64_t *steps = NULL, one = 0;
    int n;
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    bool run = stat(manifest, &sb) != 0 && strncmp(base, "step_", 5) != 0;
    if (run) {
        n = keel_ckpt_list(path, &steps);
        if (n == 0) {
            keel_errorf("%s: neither a checkpoint (no manifest.json) nor a run with committed "
                        "checkpoints", path);
            return 2;
        }
    } else {
        n = 1;
        steps = &one;
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        char dir[4096];
        if (run) keel_ckpt_dir(dir, sizeof dir, path, steps[i], false);
        else snprintf(dir, sizeof dir, "%s", path);
        keel_ckpt ck;
        keel_error_capture(true);
        keel_status st = check(dir, true, &ck);
        keel_error_capture(false);
        if (st == KEEL_OK) {
            printf("ok      %s (step %lld, %d file(s), checksums match)\n", dir, (long long)ck.step,
                   ck.shard_ranks);
            keel_ckpt_close(&ck);
        } else {
            printf("DAMAGED %s: %s\n", dir, keel_last_error());
            bad++;
        }
    }
    if (run) keel_free(steps);
    return bad ? 1 : 0;
}

static int export_hf(int argc, char **argv) {
    static const struct option options[] = {
        {"format", required_argument, NULL, 'f'}, {"out", required_argument, NULL, 'o'},
        {"tokenizer", required_argument, NULL, 't'}, {"max-shard-mb", required_argument, NULL, 'm'},
        {0, 0, 0, 0},
    };
    const char *format = NULL, *out = NULL, *tokenizer = NULL;
    double max_mb = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'f': format = optarg; break;
        case 'o': out = optarg; break;
        case 't': tokenizer = optarg; break;
        case 'm':
            if (!cli_parse_double("--max-shard-mb", optarg, 0, 1 << 30, &max_mb)) return 2;
            break;
        default: return 2;
        }
    }
    if (optind != argc - 1 || !out || !format || strcmp(format, "safetensors")) {
        keel_errorf("usage: keel ckpt export PATH --format safetensors --out DIR [--tokenizer M] "
                    "[--max-shard-mb N] (safetensors is the one format)");
        return 2;
    }
    keel_ckpt ck;
    keel_config cfg;
    keel_config_defaults(&cfg);
    keel_status st = keel_ckpt_open_any(argv[optind], &ck);
    bool opened = st == KEEL_OK;
    if (st == KEEL_OK) st = keel_ckpt_verify_all(&ck);
    if (st == KEEL_OK) keel_config_free(&cfg), st = keel_ckpt_load_config(&ck, &cfg);
    /* the run's tokenizer, unless given or gone */
    if (!tokenizer && cfg.data.tokenizer && access(cfg.data.tokenizer, R_OK) == 0) tokenizer = cfg.data.tokenizer;
    else if (!tokenizer && st == KEEL_OK)
        keel_log_warn("no tokenizer exported (tokenizer.model or tokenizer.json): the run's data.tokenizer (%s) is not readable here; "
                      "pass --tokenizer FILE", cfg.data.tokenizer ? cfg.data.tokenizer : "none");
    if (st == KEEL_OK)
        st = keel_hf_export(&cfg.model, keel_ckpt_read_params, &ck, tokenizer, out, (int64_t)(max_mb * (1 << 20)));
    if (st == KEEL_OK)
        printf("exported %s (step %lld) to %s as a LlamaForCausalLM directory\n", ck.dir, (long long)ck.step, out);
    if (opened) keel_ckpt_close(&ck);
    keel_config_free(&cfg);
    return keel_status_exit_code(st);
}

static int import_hf(int argc, char **argv) {
    static const struct option options[] = {
        {"from-hf", required_argument, NULL, 'f'}, {"out", required_argument, NULL, 'o'}, {0, 0, 0, 0},
    };
    const char *from = NULL, *out = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        if (c == 'f') from = optarg;
        else if (c == 'o') out = optarg;
        else return 2;
    }
    if (optind != argc || !from || !out) {
        keel_errorf("usage: keel ckpt import --from-hf DIR --out CKPT");
        return 2;
    }
    keel_config cfg;
    keel_config_defaults(&cfg);
    cfg.data.synthetic = true; /* a manifest carries a complete config; an import has no data */
    keel_hf_reader *hf = NULL;
    keel_status st = keel_hf_open(from, &cfg.model, &hf);
    if (st == KEEL_OK) st = keel_ckpt_write_model(out, &cfg, keel_hf_read, hf);
    if (st == KEEL_OK) {
        char *json = keel_config_to_json(&cfg);
        cJSON *all = cJSON_Parse(json);
        char *model = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(all, "model"));
        printf("imported %s as %s; fine-tune with \"init_from\": \"%s\" and\n\"model\": %s\n", from, out,
               out, model);
        free(model);
        cJSON_Delete(all);
        free(json);
    }
    keel_hf_close(hf);
    keel_config_free(&cfg);
    return keel_status_exit_code(st);
}

int keel_cmd_ckpt(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "export")) return export_hf(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "import")) return import_hf(argc - 1, argv + 1);
    if (argc != 3 || (strcmp(argv[1], "list") && strcmp(argv[1], "verify"))) {
        keel_errorf("usage: keel ckpt list RUN_DIR | verify PATH | export PATH ... | import ... "
                    "(see keel ckpt --help)");
        return 2;
    }
    return !strcmp(argv[1], "list") ? list(argv[2]) : verify(argv[2]);
}
