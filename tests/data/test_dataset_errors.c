/* Opening a dataset that cannot serve the model fails with one line that
 * names the problem and the fix: vocabulary mismatch, missing or empty path,
 * too few tokens, mixed or missing shards, bad synthetic settings. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "keel/data.h"

#define TESTLIB_QUIET
#include "../testlib.h"

#define PATH_BYTES 256
static char tmpdir[64];

/* A fresh empty directory under tmpdir. */
static void fresh_dir(char *out, const char *name) {
    snprintf(out, PATH_BYTES, "%s/%s", tmpdir, name);
    remove_tree(out);
    mkdir(out, 0755);
}

static void write_shard(const char *dir, const char *name, uint64_t n, uint32_t vocab) {
    char path[PATH_BYTES * 2];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int32_t *tokens = malloc(n * sizeof *tokens + 1);
    for (uint64_t i = 0; i < n; i++) tokens[i] = (int32_t)(i % vocab);
    if (keel_shard_write(path, tokens, NULL, 0, n, vocab) != KEEL_OK) abort();
    free(tokens);
}

/* Open expecting an input error; returns the one-line message. */
static const char *open_fails(const keel_data_config *cfg, const char *split, int seq_len,
                              int vocab_size) {
    keel_data *d = (keel_data *)&failures; /* must be reset to NULL */
    capture_begin();
    keel_status st = keel_data_open(cfg, split, seq_len, vocab_size, 1, &d);
    const char *msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT, "status %d for %s", (int)st, cfg->path ? cfg->path : "-");
    EXPECT(d == NULL, "no dataset on failure");
    EXPECT(count_lines(msg) == 1, "one-line error, got: %s", msg);
    if (st == KEEL_OK) keel_data_close(d);
    return msg;
}

static void test_vocab_mismatch(void) {
    char dir[PATH_BYTES];
    fresh_dir(dir, "vocab");
    write_shard(dir, "train-00000.bin", 500, 1000);
    keel_data_config cfg = {.path = dir};
    const char *msg = open_fails(&cfg, "train", 16, 2000);
    EXPECT(strstr(msg, "1000") && strstr(msg, "2000") && strstr(msg, "model.vocab_size"),
           "names both sizes and model.vocab_size: %s", msg);
    msg = open_fails(&cfg, "train", 16, 999);
    EXPECT(strstr(msg, "1000") && strstr(msg, "999"), "smaller model vocab too: %s", msg);

    keel_data *d = NULL;
    EXPECT(keel_data_open(&cfg, "train", 16, 1000, 1, &d) == KEEL_OK && d, "matching vocab");
    keel_data_close(d);

    /* Shards from two tokenizers in one split. */
    write_shard(dir, "train-00001.bin", 500, 1200);
    msg = open_fails(&cfg, "train", 16, 1000);
    EXPECT(strstr(msg, "train-00000.bin") && strstr(msg, "train-00001.bin") &&
               strstr(msg, "1200"),
           "mixed vocab names both files: %s", msg);
}

static void test_missing_and_empty(void) {
    char dir[PATH_BYTES];
    snprintf(dir, sizeof dir, "%s/no-such-dir", tmpdir);
    keel_data_config cfg = {.path = dir};
    const char *msg = open_fails(&cfg, "train", 16, 100);
    EXPECT(strstr(msg, dir) && strstr(msg, "keel data prepare"), "missing path: %s", msg);

    fresh_dir(dir, "empty");
    msg = open_fails(&cfg, "train", 16, 100);
    EXPECT(strstr(msg, dir) && strstr(msg, "train-"), "empty directory: %s", msg);

    /* No val shards: not an error, just no val split. */
    write_shard(dir, "train-00000.bin", 100, 100);
    keel_data *d = (keel_data *)&failures;
    EXPECT(keel_data_open(&cfg, "val", 16, 100, 1, &d) == KEEL_OK && d == NULL, "no val split");

    /* A gap in the numbering means a lost file. */
    write_shard(dir, "train-00002.bin", 100, 100);
    msg = open_fails(&cfg, "train", 16, 100);
    EXPECT(strstr(msg, "train-00001.bin") != NULL, "gap names the missing file: %s", msg);

    /* A damaged shard inside a directory is reported with its name. */
    fresh_dir(dir, "damaged");
    write_shard(dir, "train-00000.bin", 100, 100);
    char path[PATH_BYTES * 2];
    snprintf(path, sizeof path, "%s/train-00000.bin", dir);
    FILE *f = fopen(path, "r+b");
    fseek(f, 100, SEEK_SET);
    fputc(0x55, f);
    fclose(f);
    msg = open_fails(&cfg, "train", 16, 100);
    EXPECT(strstr(msg, "train-00000.bin") && strstr(msg, "checksum"), "damaged shard: %s", msg);

    keel_data_config none = {0};
    msg = open_fails(&none, "train", 16, 100);
    EXPECT(strstr(msg, "data.path") != NULL, "no data source: %s", msg);
}

static void test_too_short(void) {
    char dir[PATH_BYTES];
    fresh_dir(dir, "short");
    write_shard(dir, "train-00000.bin", 10, 100);
    keel_data_config cfg = {.path = dir};
    const char *msg = open_fails(&cfg, "train", 16, 100);
    EXPECT(strstr(msg, "10 tokens") && strstr(msg, "17") && strstr(msg, "model.max_seq_len"),
           "too short names the counts and the key: %s", msg);

    /* Exactly seq_len + 1 tokens make one sample; the split may span files. */
    fresh_dir(dir, "exact");
    write_shard(dir, "train-00000.bin", 10, 100);
    write_shard(dir, "train-00001.bin", 7, 100);
    keel_data *d = NULL;
    EXPECT(keel_data_open(&cfg, "train", 16, 100, 1, &d) == KEEL_OK && d, "17 tokens open");
    if (d) {
        EXPECT(keel_data_n_samples(d) == 1, "one sample");
        int32_t row[17];
        keel_data_fetch(d, 5, 1, 0, 1, row, NULL); /* step 5 = epoch 5, same single sample */
        EXPECT(row[0] == 0 && row[9] == 9 && row[10] == 0 && row[16] == 6, "the whole stream");
        keel_data_close(d);
    }

    /* A single file is the train split; it has no val split. */
    char file[PATH_BYTES * 2];
    snprintf(file, sizeof file, "%s/train-00000.bin", dir);
    d = NULL;
    EXPECT(keel_data_open_path(file, "train", 4, 100, 1, &d) == KEEL_OK && d, "single file");
    EXPECT(d && keel_data_n_samples(d) == 2, "(10 - 1) / 4 = 2 samples");
    keel_data_close(d);
    d = (keel_data *)&failures;
    EXPECT(keel_data_open_path(file, "val", 4, 100, 1, &d) == KEEL_OK && d == NULL,
           "single file has no val");
}

static void test_synthetic_settings(void) {
    keel_data_config cfg = {.synthetic = true, .synthetic_seed = 1, .synthetic_vocab = 600};
    const char *msg = open_fails(&cfg, "train", 16, 500);
    EXPECT(strstr(msg, "data.synthetic.vocab") && strstr(msg, "600") && strstr(msg, "500"),
           "synthetic vocab > model vocab: %s", msg);
    cfg = (keel_data_config){.synthetic = true, .synthetic_vocab = 3, .synthetic_branching = 4};
    msg = open_fails(&cfg, "train", 16, 500);
    EXPECT(strstr(msg, "data.synthetic.branching") != NULL, "branching > vocab: %s", msg);
    /* Defaults (vocab 0 = min(model, 64), branching 0 = 4) fit an 8-token model. */
    cfg = (keel_data_config){.synthetic = true};
    keel_data *d = NULL;
    EXPECT(keel_data_open(&cfg, "train", 16, 8, 1, &d) == KEEL_OK && d, "defaults, V = 8");
    if (d) {
        int32_t row[17];
        keel_data_fetch(d, 0, 1, 0, 1, row, NULL);
        bool in_range = true;
        for (int i = 0; i < 17; i++) in_range &= row[i] >= 0 && row[i] < 8;
        EXPECT(in_range, "tokens below the model's 8");
    }
    keel_data_close(d);
}

static void test_tokenizer_check(void) {
    char dir[PATH_BYTES];
    fresh_dir(dir, "tok");
    write_shard(dir, "train-00000.bin", 100, 100);
    char missing[PATH_BYTES * 2];
    snprintf(missing, sizeof missing, "%s/no-such.model", dir);
    keel_data_config cfg = {.path = dir, .tokenizer = missing};
    const char *msg = open_fails(&cfg, "train", 16, 100);
    EXPECT(strstr(msg, "no-such.model") != NULL, "unreadable tokenizer: %s", msg);
}

int main(void) {
    if (!temp_dir_create(tmpdir, sizeof tmpdir, "dataerr")) return 1;
    test_vocab_mismatch();
    test_missing_and_empty();
    test_too_short();
    test_synthetic_settings();
    test_tokenizer_check();
    remove_tree(tmpdir);
    return test_summary("test_dataset_errors");
}
