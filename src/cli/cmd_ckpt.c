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
            "       keel ckpt export PATH --format safetensors --out DIR [--merge] [--tokenizer M] [--max-shard-mb N]\n"
            "                                   a checkpoint (or a run's newest good one) as a Hugging\n"
            "                                   Face LlamaForCausalLM directory: config.json, safetensors,\n"
            "                                   generation_config.json (the one the checkpoint carries,\n"
            "                                   else one from the BOS/EOS ids) and the tokenizer (M, else\n"
            "                                   the one the checkpoint carries, else the run's\n"
            "                                   data.tokenizer) with its tokenizer_config.json; --merge: a\n"
            "                                   LoRA checkpoint's adapters merged into its base\n"
            "       keel ckpt export PATH --format peft --out DIR\n"
            "                                   a LoRA checkpoint's adapters as PEFT saves them:\n"
            "                                   adapter_model.safetensors and adapter_config.json\n"
            "       keel ckpt import --from-peft DIR --base CKPT --out CKPT\n"
            "                                   PEFT LoRA adapters (adapter_config.json and\n"
            "                                   adapter_model.safetensors) on the base CKPT as a keel\n"
            "                                   adapter checkpoint: start a LoRA run from it with\n"
            "                                   \"train\": {\"lora\": {\"init_from\": CKPT}}\n"
            "       keel ckpt import --from-hf DIR --out CKPT\n"
            "                                   a Hugging Face Llama directory as a keel checkpoint, to\n"
            "                                   fine-tune from with \"init_from\": CKPT; CKPT carries the\n"
            "                                   directory's tokenizer.json (else tokenizer.model) with its\n"
            "                                   tokenizer_config.json, and generation_config.json, as\n"
            "                                   CKPT/<same name>, checked and checksummed in its manifest;\n"
            "                                   its config's data.tokenizer names CKPT's tokenizer\n");
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
            char carried[48] = "";
            if (ck.n_carried) snprintf(carried, sizeof carried, " and %d carried", ck.n_carried);
            printf("ok      %s (step %lld, %d file(s)%s, checksums match)\n", dir, (long long)ck.step,
                   ck.shard_ranks, carried);
            keel_ckpt_close(&ck);
        } else {
            printf("DAMAGED %s: %s\n", dir, keel_last_error());
            bad++;
        }
    }
    if (run) keel_free(steps);
    return bad ? 1 : 0;
}

/* The tokenizer an export copies when none is given (keel_ckpt_find_tokenizer;
 * a warning when there is none). */
static char *find_tokenizer(const keel_ckpt *ck, const keel_config *cfg) {
    char *path = keel_ckpt_find_tokenizer(ck, cfg);
    if (!path)
        keel_log_warn("no tokenizer exported (tokenizer.model or tokenizer.json): the checkpoint carries none and the "
                      "run's data.tokenizer (%s) is not readable here; pass --tokenizer FILE",
                      cfg->data.tokenizer ? cfg->data.tokenizer : "none");
    return path;
}

/* --format peft: the adapters as PEFT saves them. */
static keel_status export_peft(keel_ckpt *ck, const keel_config *cfg, const char *out) {
    if (!cfg->train.lora.on) {
        keel_errorf("%s holds a whole model, not LoRA adapters; export it with --format safetensors", ck->dir);
        return KEEL_ERR_INPUT;
    }
    keel_model_layout lay, lora;
    char why[256];
    keel_model_layout_init(&lay, &cfg->model);
    keel_status st = keel_lora_layout_init(&lora, &lay, &cfg->train.lora, why, sizeof why);
    if (st == KEEL_OK) {
        st = keel_hf_export_peft(&lora, keel_ckpt_read_params, ck, cfg->init_from, out);
        keel_model_layout_free(&lora);
    }
    keel_model_layout_free(&lay);
    return st;
}

static int export_hf(int argc, char **argv) {
    static const struct option options[] = {
        {"format", required_argument, NULL, 'f'}, {"out", required_argument, NULL, 'o'},
        {"tokenizer", required_argument, NULL, 't'}, {"max-shard-mb", required_argument, NULL, 'm'},
        {"merge", no_argument, NULL, 'M'}, {0, 0, 0, 0},
    };
    const char *format = NULL, *out = NULL, *tokenizer = NULL;
    double max_mb = 0;
    bool merge = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'f': format = optarg; break;
        case 'o': out = optarg; break;
        case 't': tokenizer = optarg; break;
        case 'M': merge = true; break;
        case 'm':
            if (!cli_parse_double("--max-shard-mb", optarg, 0, 1 << 30, &max_mb)) return 2;
            break;
        default: return 2;
        }
    }
    bool peft = format && !strcmp(format, "peft");
    if (format && strcmp(format, "safetensors") && !peft) {
        keel_errorf("--format %s: keel exports safetensors (a whole model, or a LoRA checkpoint with --merge) or "
                    "peft (a LoRA checkpoint's adapters)", format);
        return 2;
    }
    if (optind != argc - 1 || !out || !format || (peft && merge)) {
        keel_errorf("usage: keel ckpt export PATH --format safetensors --out DIR [--merge] [--tokenizer M] "
                    "[--max-shard-mb N], or PATH --format peft --out DIR (LoRA adapters as PEFT saves them)");
        return 2;
    }
    keel_ckpt ck;
    keel_config cfg;
    keel_config_defaults(&cfg);
    keel_status st = keel_ckpt_open_any(argv[optind], &ck);
    bool opened = st == KEEL_OK, merging = false;
    if (st == KEEL_OK) st = keel_ckpt_verify_all(&ck);
    if (st == KEEL_OK) keel_config_free(&cfg), st = keel_ckpt_load_config(&ck, &cfg);
    if (st == KEEL_OK && peft) {
        st = export_peft(&ck, &cfg, out);
        if (st == KEEL_OK) printf("exported %s (step %lld) to %s as PEFT LoRA adapters\n", ck.dir, (long long)ck.step, out);
        keel_ckpt_close(&ck);
        keel_config_free(&cfg);
        return keel_status_exit_code(st);
    }
    keel_ckpt_merged *ms = NULL;
    if (st == KEEL_OK && merge && (st = keel_ckpt_merged_open(&ck, &cfg, &ms)) == KEEL_OK) merging = true;
    if (st == KEEL_OK && !merging) st = keel_ckpt_need_model(&ck, &cfg);
    char *carried_tok = NULL, *gen = NULL;
    keel_ckpt *carrier = merging ? keel_ckpt_merged_base(ms) : &ck; /* an import's tokenizer travels with the base */
    if (st == KEEL_OK && !tokenizer) tokenizer = carried_tok = find_tokenizer(carrier, &cfg);
    /* the checkpoint's, else its init_from's (an import's), else one from the ids */
    if (st == KEEL_OK) gen = keel_ckpt_find_carried(carrier, &cfg, "generation_config.json");
    if (st == KEEL_OK)
        st = keel_hf_export(&cfg.model, merging ? keel_ckpt_merged_read : keel_ckpt_read_params, merging ? (void *)ms : &ck,
                            tokenizer, gen, out, (int64_t)(max_mb * (1 << 20)));
    keel_ckpt_merged_close(ms);
    if (st == KEEL_OK)
        printf("exported %s (step %lld) to %s as a LlamaForCausalLM directory (tokenizer: %s; "
               "generation_config.json: %s)\n", ck.dir, (long long)ck.step, out, tokenizer ? tokenizer : "none",
               gen ? gen : "from the BOS/EOS ids");
    keel_free(carried_tok);
    keel_free(gen);
    if (opened) keel_ckpt_close(&ck);
    keel_config_free(&cfg);
    return keel_status_exit_code(st);
}

/* path made absolute (a new string; trailing slashes dropped): what a
 * manifest records, so it names the same file from any directory. */
static char *absolute(const char *path) {
    char *cwd = path[0] == '/' ? NULL : getcwd(NULL, 0);
    while (cwd && path[0] == '.' && path[1] == '/') path += 2;
    char *abs = cwd ? keel_path_join(cwd, path) : keel_xstrdup(path);
    free(cwd);
    for (size_t n = strlen(abs); n > 1 && abs[n - 1] == '/'; n--) abs[n - 1] = '\0';
    return abs;
}

/* What a committed import lacks, said once: no tokenizer at all, or one with
 * fewer tokens than the vocabulary (a padded embedding). */
static void warn_import(const char *from, const char *out, const keel_model_config *model,
                        const keel_hf_carried *carried) {
    if (!carried->tokenizer)
        keel_log_warn("%s has no tokenizer.json or tokenizer.model: %s carries no tokenizer (export then needs "
                      "--tokenizer, a run data.tokenizer)", from, out);
    else if (carried->tokenizer_tokens < model->vocab_size)
        keel_log_warn("%s/%s has %d tokens, vocab_size is %d: the embedding's last %d rows are padding no token "
                      "uses", from, carried->tokenizer, carried->tokenizer_tokens, model->vocab_size,
                      model->vocab_size - carried->tokenizer_tokens);
}

/* What an import made and how to fine-tune from it: init_from, the model keys
 * and, when it carries a tokenizer, data.tokenizer. */
static void print_import(const char *from, const char *out, const keel_config *cfg, const keel_hf_carried *carried) {
    char *json = keel_config_to_json(cfg);
    cJSON *all = cJSON_Parse(json);
    char *model = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(all, "model"));
    printf("imported %s as %s", from, out);
    for (int i = 0; i < carried->n_files; i++) printf("%s%s", i ? ", " : " with ", carried->files[i].name);
    printf("; fine-tune with \"init_from\": \"%s\" and\n\"model\": %s\n", out, model);
    if (carried->tokenizer) {
        cJSON *tok = cJSON_CreateString(cfg->data.tokenizer);
        char *quoted = cJSON_PrintUnformatted(tok);
        printf("\"data\": {\"tokenizer\": %s}\n", quoted);
        free(quoted);
        cJSON_Delete(tok);
    }
    free(model);
    cJSON_Delete(all);
    free(json);
}

/* --from-peft DIR --base CKPT: PEFT's LoRA adapters as a keel adapter
 * checkpoint on that base (a whole model's checkpoint), to start a LoRA run
 * from (train.lora.init_from). */
static keel_status import_peft(const char *from, const char *base_path, const char *out) {
    keel_ckpt base;
    keel_config cfg;
    keel_config_defaults(&cfg);
    keel_status st = keel_ckpt_open_any(base_path, &base);
    if (st != KEEL_OK) return st;
    bool ok = (st = keel_ckpt_verify_all(&base)) == KEEL_OK;
    if (ok) keel_config_free(&cfg), ok = (st = keel_ckpt_load_config(&base, &cfg)) == KEEL_OK;
    if (ok) ok = (st = keel_ckpt_need_model(&base, &cfg)) == KEEL_OK;
    char *text = NULL, *config = keel_path_join(from, "adapter_config.json"), why[160], id[17];
    size_t len;
    if (ok && keel_read_regular(config, (size_t)1 << 20, &text, &len, why, sizeof why) != KEEL_OK) {
        keel_errorf("%s: cannot read the adapter config: %s", config, why);
        ok = false, st = KEEL_ERR_INPUT;
    }
    if (ok) ok = (st = keel_hf_parse_peft_config(text, len, config, &cfg.train.lora)) == KEEL_OK;
    keel_model_layout lay, lora;
    keel_model_layout_init(&lay, &cfg.model);
    if (ok && keel_lora_layout_init(&lora, &lay, &cfg.train.lora, why, sizeof why) != KEEL_OK) {
        keel_errorf("%s: %s (the adapter is for another model than %s)", config, why, base.dir);
        ok = false, st = KEEL_ERR_INPUT;
    }
    if (ok) {
        float *params = keel_xmalloc(sizeof(float) * (size_t)lora.n_params, "adapters");
        keel_error_capture(true);
        st = keel_hf_read_peft(from, &lora, params);
        keel_error_capture(false);
        if (st != KEEL_OK)
            keel_errorf("%s: the adapters do not fit %s's model (%s); import them on the base they were trained on",
                        from, base.dir, keel_last_error());
        free(cfg.init_from);
        cfg.init_from = absolute(base.dir); /* the base, by a path that holds from any directory */
        keel_ckpt_identity(&base, id);
        if (st == KEEL_OK) st = keel_ckpt_write_adapters(out, &cfg, id, keel_params_from_buffer, params);
        if (st == KEEL_OK)
            printf("imported %lld LoRA adapter parameters (rank %d, alpha %g) from %s onto %s as %s; train on with "
                   "--set init_from=%s --set train.lora.init_from=%s\n", (long long)lora.n_params, cfg.train.lora.rank,
                   cfg.train.lora.alpha, from, base.dir, out, cfg.init_from, out);
        keel_free(params);
        keel_model_layout_free(&lora);
    }
    keel_model_layout_free(&lay);
    keel_free(text);
    keel_free(config);
    keel_config_free(&cfg);
    keel_ckpt_close(&base);
    return st;
}

static int import_hf(int argc, char **argv) {
    static const struct option options[] = {
        {"from-hf", required_argument, NULL, 'f'}, {"out", required_argument, NULL, 'o'},
        {"from-peft", required_argument, NULL, 'p'}, {"base", required_argument, NULL, 'b'}, {0, 0, 0, 0},
    };
    const char *from = NULL, *out = NULL, *peft = NULL, *base = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        if (c == 'f') from = optarg;
        else if (c == 'o') out = optarg;
        else if (c == 'p') peft = optarg;
        else if (c == 'b') base = optarg;
        else return 2;
    }
    if (optind != argc || !out || !from == !peft || !peft != !base) {
        keel_errorf("usage: keel ckpt import --from-hf DIR --out CKPT, or --from-peft DIR --base CKPT --out CKPT");
        return 2;
    }
    if (peft) return keel_status_exit_code(import_peft(peft, base, out));
    keel_config cfg;
    keel_config_defaults(&cfg);
    cfg.data.synthetic = true; /* a manifest carries a complete config; an import has no data */
    keel_hf_reader *hf = NULL;
    keel_hf_carried carried = {0};
    keel_status st = keel_hf_open(from, &cfg.model, &hf);
    if (st == KEEL_OK) st = keel_hf_read_carried(from, &cfg.model, &carried);
    keel_ckpt_carry carry[3];
    for (int i = 0; i < carried.n_files; i++)
        carry[i] = (keel_ckpt_carry){carried.files[i].name, carried.files[i].data, carried.files[i].bytes};
    if (carried.tokenizer) { /* the copy the checkpoint carries, by a path that holds from any directory */
        char *dir = absolute(out);
        cfg.data.tokenizer = keel_path_join(dir, carried.tokenizer);
        keel_free(dir);
    }
    if (st == KEEL_OK) st = keel_ckpt_write_model(out, &cfg, keel_hf_read, hf, carry, carried.n_files);
    if (st == KEEL_OK) warn_import(from, out, &cfg.model, &carried), print_import(from, out, &cfg, &carried);
    keel_hf_carried_free(&carried);
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
