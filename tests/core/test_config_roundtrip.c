/* The config table: defaults, file + --set merging, the resolved JSON
 * round-trips to the same config, and type/range/unknown-key errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/core.h"

#include "../testlib.h"

int main(void) {
    keel_config a;
    keel_config_defaults(&a);
    EXPECT(keel_config_load_string(&a, "{\"model\": {\"dim\": 96, \"n_heads\": 4, \"n_kv_heads\": 0},"
                                        " \"data\": {\"synthetic\": {\"branching\": 3}}}", "t") == KEEL_OK,
           "load nested object");
    EXPECT(keel_config_set(&a, "train.steps=7") == KEEL_OK && a.train.steps == 7, "--set int");
    EXPECT(keel_config_set(&a, "train.lr=0.01") == KEEL_OK && a.train.lr == 0.01, "--set double");
    EXPECT(keel_config_set(&a, "model.tie_embeddings=true") == KEEL_OK && a.model.tie_embeddings, "--set bool");
    EXPECT(keel_config_set(&a, "data.tokenizer=some/path.model") == KEEL_OK &&
               !strcmp(a.data.tokenizer, "some/path.model"), "--set bare string");
    EXPECT(keel_config_set(&a, "train.seed=18446744073709") == KEEL_OK && a.train.seed == 18446744073709ull,
           "--set u64");
    EXPECT(keel_config_set(&a, "resilience.health_checks=mpi,gemm") == KEEL_OK &&
               a.resilience.health_checks == (1u << KEEL_CHECK_GEMM | 1u << KEEL_CHECK_MPI),
           "--set list from bare names");
    EXPECT(keel_config_set(&a, "fsdp.strategy=hybrid_shard") == KEEL_OK && a.fsdp.strategy == KEEL_FSDP_HYBRID_SHARD,
           "--set a name");
    EXPECT(keel_config_set(&a, "metrics.allowed_hosts=dash.example,10.0.0.7") == KEEL_OK && a.metrics.allowed_hosts &&
               !strcmp(a.metrics.allowed_hosts[0], "dash.example") && !strcmp(a.metrics.allowed_hosts[1], "10.0.0.7") &&
               !a.metrics.allowed_hosts[2],
           "--set a list of strings from bare comma-separated values");
    EXPECT(keel_config_set(&a, "fsdp.mixed_precision=\"bf16\"") == KEEL_OK &&
               a.fsdp.mixed_precision == KEEL_DTYPE_BF16, "--set a JSON string name");
    EXPECT(keel_config_set(&a, "fsdp.activation_checkpointing=true") == KEEL_OK &&
               keel_config_checkpoint_blocks(&a) == a.model.n_layers, "checkpointing true: every block");
    EXPECT(keel_config_set(&a, "fsdp.activation_checkpointing=3") == KEEL_OK &&
               keel_config_checkpoint_blocks(&a) == 3, "checkpointing a count: the first blocks");
    /* a number of seconds, or null: derived where it is used (held as 0); 0, below and words are errors */
    EXPECT(a.resilience.startup_timeout_s == 0, "startup_timeout_s defaults to null");
    EXPECT(keel_config_set(&a, "resilience.startup_timeout_s=45") == KEEL_OK && a.resilience.startup_timeout_s == 45,
           "--set a number-or-null key to a number");
    EXPECT(keel_config_set(&a, "resilience.startup_timeout_s=0") == KEEL_ERR_INPUT &&
               keel_config_set(&a, "resilience.startup_timeout_s=-5") == KEEL_ERR_INPUT &&
               keel_config_set(&a, "resilience.startup_timeout_s=abc") == KEEL_ERR_INPUT &&
               a.resilience.startup_timeout_s == 45,
           "startup_timeout_s <= 0 or a word is refused and changes nothing");
    EXPECT(keel_config_set(&a, "resilience.startup_timeout_s=null") == KEEL_OK && a.resilience.startup_timeout_s == 0,
           "--set a number-or-null key to null");
    EXPECT(keel_config_finalize(&a) == KEEL_OK && a.model.n_kv_heads == 4, "finalize fills n_kv_heads");
    EXPECT(a.data.synthetic && a.data.synthetic_branching == 3, "synthetic section parsed");

    char *json = keel_config_to_json(&a);
    keel_config b;
    keel_config_defaults(&b);
    EXPECT(keel_config_load_string(&b, json, "resolved") == KEEL_OK && keel_config_finalize(&b) == KEEL_OK,
           "resolved JSON loads");
    char *json2 = keel_config_to_json(&b);
    EXPECT(!strcmp(json, json2), "resolved JSON round-trips exactly");
    EXPECT(strstr(json, "\"health_checks\":\t[\"gemm\", \"mpi\"]") != NULL, "a list is a JSON array of names");
    EXPECT(strstr(json, "\"strategy\":\t\"hybrid_shard\"") != NULL, "a name is a JSON string");
    EXPECT(strstr(json, "\"allowed_hosts\":\t[\"dash.example\", \"10.0.0.7\"]") != NULL,
           "a list of strings is a JSON array");
    EXPECT(strstr(json, "\"activation_checkpointing\":\t3") != NULL, "a checkpointing count is a JSON number");
    EXPECT(strstr(json, "\"startup_timeout_s\":\tnull") != NULL, "a derived number is JSON null");
    /* a section that is off stays off (its keys' defaults are not written into it) */
    EXPECT(!a.model.rope_scaling.on && !b.model.rope_scaling.on && strstr(json, "\"rope_scaling\":\tfalse") != NULL,
           "a section that is off (model.rope_scaling) reads back off");
    free(json);
    free(json2);
    EXPECT(keel_config_set(&a, "model.rope_scaling={\"type\": \"llama3\", \"factor\": 32}") == KEEL_OK &&
               a.model.rope_scaling.on && a.model.rope_scaling.factor == 32 &&
               a.model.rope_scaling.original_max_position_embeddings == 8192,
           "--set a section: given keys set, the others keep their defaults");
    json = keel_config_to_json(&a);
    keel_config on;
    keel_config_defaults(&on);
    EXPECT(keel_config_load_string(&on, json, "resolved") == KEEL_OK && keel_config_finalize(&on) == KEEL_OK &&
               on.model.rope_scaling.on && on.model.rope_scaling.factor == 32,
           "a section that is on reads back on, with its values");
    free(json);
    keel_config_free(&on);

    EXPECT(keel_config_set(&b, "data.path=/data/x") == KEEL_OK && keel_config_finalize(&b) == KEEL_OK &&
               !b.data.synthetic, "data.path wins over synthetic");

    keel_config c;
    keel_config_defaults(&c);
    fprintf(stderr, "(the following error lines are expected)\n");
    EXPECT(keel_config_set(&c, "train.stepz=1") == KEEL_ERR_INPUT, "unknown key rejected");
    EXPECT(keel_config_set(&c, "train.steps=1.5") == KEEL_ERR_INPUT, "fraction for int rejected");
    EXPECT(keel_config_set(&c, "train.steps=-1") == KEEL_ERR_INPUT, "negative steps rejected");
    EXPECT(keel_config_set(&c, "model.tie_embeddings=1") == KEEL_ERR_INPUT, "number for bool rejected");
    EXPECT(keel_config_set(&c, "fsdp.activation_checkpointing=-1") == KEEL_ERR_INPUT &&
               keel_config_set(&c, "fsdp.activation_checkpointing=2.5") == KEEL_ERR_INPUT &&
               keel_config_set(&c, "fsdp.activation_checkpointing=all") == KEEL_ERR_INPUT,
           "checkpointing: a negative, a fraction or a name rejected");
    EXPECT(keel_config_set(&c, "fsdp.activation_checkpointing=false") == KEEL_OK &&
               keel_config_checkpoint_blocks(&c) == 0, "checkpointing false: none");
    EXPECT(keel_config_load_string(&c, "[1,2]", "t") == KEEL_ERR_INPUT, "non-object rejected");
    EXPECT(keel_config_load_string(&c, "{\"resilience\": {\"health_checks\": [1]}}", "t") == KEEL_ERR_INPUT,
           "list of numbers rejected");
    EXPECT(keel_config_load_string(&c, "{\"resilience\": {\"health_checks\": \"gemm\"}}", "t") == KEEL_ERR_INPUT,
           "string for list rejected");
    EXPECT(keel_config_set(&c, "resilience.health_checks=[]") == KEEL_OK && c.resilience.health_checks == 0,
           "empty list");
    EXPECT(keel_config_load_string(&c, "{\"metrics\": {\"allowed_hosts\": [1]}}", "t") == KEEL_ERR_INPUT &&
               keel_config_load_string(&c, "{\"metrics\": {\"allowed_hosts\": \"a\"}}", "t") == KEEL_ERR_INPUT,
           "a list of strings: a number or a bare string rejected");
    EXPECT(keel_config_load_string(&c, "{\"metrics\": {\"allowed_hosts\": [\"a\"]}}", "t") == KEEL_OK &&
               keel_config_set(&c, "metrics.allowed_hosts=[]") == KEEL_OK && !c.metrics.allowed_hosts,
           "a list of strings emptied");
    EXPECT(keel_config_set(&c, "resilience.health_checks=gemm,gpus") == KEEL_ERR_INPUT, "unknown check rejected");
    EXPECT(keel_config_set(&c, "fsdp.strategy=full") == KEEL_ERR_INPUT, "unknown strategy rejected");
    EXPECT(keel_config_load_string(&c, "{\"fsdp\": {\"reduce_dtype\": 16}}", "t") == KEEL_ERR_INPUT,
           "number for a name rejected");
    unsigned mask;
    char names[64];
    EXPECT(keel_health_checks_parse("gpu,memory", "t", &mask) == KEEL_OK &&
               mask == (1u << KEEL_CHECK_GPU | 1u << KEEL_CHECK_MEMORY), "check names parse to a mask");
    keel_health_checks_format(mask, names, sizeof names);
    EXPECT(!strcmp(names, "memory,gpu"), "a mask formats in table order");
    EXPECT(keel_health_checks_parse("gemm,nope", "t", &mask) == KEEL_ERR_INPUT, "unknown check name rejected");
    EXPECT(!strcmp(keel_strategy_name(KEEL_FSDP_SHARD_GRAD_OP), "shard_grad_op") &&
               !strcmp(keel_dtype_name(KEEL_DTYPE_BF16), "bf16") &&
               !strcmp(keel_health_check_name(KEEL_CHECK_CHECKPOINT_DIR), "checkpoint_dir"),
           "enum names come from the tables");
    EXPECT(keel_config_load_string(&c, "{\"model\": 3}", "t") == KEEL_ERR_INPUT, "section must be object");
    EXPECT(keel_config_load_string(&c, "{\"model\": {\"dim\": 100, \"n_heads\": 3}}", "t") == KEEL_OK &&
               keel_config_finalize(&c) == KEEL_ERR_INPUT, "dim %% n_heads rejected");
    keel_config_free(&c);
    keel_config_defaults(&c);
    EXPECT(keel_config_set(&c, "fsdp.activation_checkpointing=7") == KEEL_OK &&
               keel_config_set(&c, "model.n_layers=6") == KEEL_OK && keel_config_finalize(&c) == KEEL_ERR_INPUT,
           "checkpointing more blocks than model.n_layers rejected");
    keel_config_free(&c);

    /* where a value came from: metrics.port moves past a busy port only when
     * nobody set it (src/monitor/http.c) */
    unsetenv("KEEL_METRICS_PORT");
    keel_config d;
    keel_config_defaults(&d);
    EXPECT(keel_config_key_origin(&d, "metrics.port") == KEEL_FROM_DEFAULT &&
               d.metrics.port == KEEL_METRICS_DEFAULT_PORT, "a default is the default's");
    EXPECT(keel_config_load_string(&d, "{\"train\": {\"steps\": 5}}", "t") == KEEL_OK &&
               keel_config_key_origin(&d, "train.steps") == KEEL_FROM_FILE &&
               keel_config_key_origin(&d, "train.lr") == KEEL_FROM_DEFAULT &&
               keel_config_key_origin(&d, "metrics.port") == KEEL_FROM_DEFAULT,
           "a file's keys are the file's, the others stay default");
    EXPECT(keel_config_set(&d, "train.steps=6") == KEEL_OK &&
               keel_config_key_origin(&d, "train.steps") == KEEL_FROM_SET, "--set after the file wins, and says so");
    EXPECT(keel_config_load_string(&d, "{\"metrics\": {\"port\": 9477}}", "t") == KEEL_OK &&
               keel_config_key_origin(&d, "metrics.port") == KEEL_FROM_FILE,
           "a file that names the default port has set it");
    keel_config_free(&d);
    keel_config_defaults(&d);
    EXPECT(keel_config_set(&d, "metrics={\"port\": 0}") == KEEL_OK &&
               keel_config_key_origin(&d, "metrics.port") == KEEL_FROM_SET, "a section by --set: its keys are --set's");
    keel_config_free(&d);
    setenv("KEEL_METRICS_PORT", "9600", 1);
    keel_config_defaults(&d);
    EXPECT(d.metrics.port == 9600 && keel_config_key_origin(&d, "metrics.port") == KEEL_FROM_ENV,
           "$KEEL_METRICS_PORT counts as the user's");
    EXPECT(keel_config_set(&d, "metrics.port=9601") == KEEL_OK &&
               keel_config_key_origin(&d, "metrics.port") == KEEL_FROM_SET, "--set wins over $KEEL_METRICS_PORT");
    keel_config_free(&d);
    setenv("KEEL_METRICS_PORT", "abc", 1);
    keel_config_defaults(&d);
    EXPECT(keel_config_key_origin(&d, "metrics.port") == KEEL_FROM_DEFAULT,
           "a $KEEL_METRICS_PORT that is not a port sets nothing (finalize rejects it)");
    keel_config_free(&d);
    unsetenv("KEEL_METRICS_PORT");

    keel_config_free(&a);
    keel_config_free(&b);
    return test_summary("test_config_roundtrip");
}
