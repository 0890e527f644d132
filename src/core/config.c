/* core/config.c: the config schema as one table that drives parsing, --set,
 * the resolved config.json, validation of ranges, and the key table of docs/configuration.md. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/core.h"

/* K_ENUM: one name of `names`, held as its index (an int-sized enum);
 * K_ENUM_SET: a JSON array of such names, held as a bit mask (1u << index). */
/* K_BOOL_COUNT: true, false or a count, held as an int (true: -1). */
/* K_STRING_LIST: a JSON array of strings, held as a NULL-terminated char ** (NULL: empty). */
/* K_DOUBLE_AUTO: a number in [min, max] (min > 0), or null for "derived where it is used", held as 0. */
typedef enum {
    K_SECTION, K_INT, K_U64, K_DOUBLE, K_BOOL, K_BOOL_COUNT, K_STRING, K_ENUM, K_ENUM_SET, K_FLAG_SECTION,
    K_STRING_LIST, K_DOUBLE_AUTO, K_SOURCES
} key_type;

typedef struct {
    const char *key;  /* dotted path */
    key_type type;
    size_t offset;    /* into keel_config; for K_FLAG_SECTION the bool that marks presence */
    double min, max;  /* numeric range, inclusive */
    const char *doc;
    const char *const *names; /* K_ENUM, K_ENUM_SET: the names, NULL-terminated */
} key_spec;

/* The one table of each name list (enums in keel/core.h follow their order). */
static const char *const STRATEGY_NAMES[] = {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard", NULL};
static const char *const DTYPE_NAMES[] = {"fp32", "bf16", NULL};
static const char *const UNIT_NAMES[] = {"block", "matrix", NULL};
static const char *const STRAGGLER_ACTION_NAMES[] = {"report", "drain", NULL};
static const char *const CHECK_NAMES[] = {"gemm", "memory", "checkpoint_dir", "mpi", "gpu", NULL};
static const char *const DEVICE_NAMES[] = {"cpu", "cuda", NULL};
static const char *const ROPE_SCALING_NAMES[] = {"llama3", NULL};
static const char *const LORA_TARGET_NAMES[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj", NULL};
_Static_assert(sizeof LORA_TARGET_NAMES / sizeof *LORA_TARGET_NAMES == KEEL_LORA_TARGETS + 1,
               "one name per keel_lora_target");

const char *keel_strategy_name(keel_fsdp_strategy s) { return STRATEGY_NAMES[s]; }
const char *keel_dtype_name(keel_dtype d) { return DTYPE_NAMES[d]; }
const char *keel_unit_kind_name(keel_unit_kind k) { return UNIT_NAMES[k]; }
const char *keel_health_check_name(keel_health_check c) { return CHECK_NAMES[c]; }
const char *keel_backend_kind_name(keel_backend_kind b) { return DEVICE_NAMES[b]; }
const char *keel_lora_target_name(keel_lora_target t) { return LORA_TARGET_NAMES[t]; }

#define OFF(field) offsetof(keel_config, field)
#define BIG 1e18

static const key_spec KEYS[] = {
    {"model", K_SECTION, 0, 0, 0, "model shape (Llama 2 architecture)", NULL},
    {"model.dim", K_INT, OFF(model.dim), 1, 1 << 20, "hidden size C", NULL},
    {"model.n_layers", K_INT, OFF(model.n_layers), 1, 4096, "transformer blocks L", NULL},
    {"model.n_heads", K_INT, OFF(model.n_heads), 1, 4096, "attention heads NH", NULL},
    {"model.n_kv_heads", K_INT, OFF(model.n_kv_heads), 0, 4096,
     "key/value heads NKV for grouped-query attention (0 = n_heads)", NULL},
    {"model.vocab_size", K_INT, OFF(model.vocab_size), 2, 1 << 24, "vocabulary size V", NULL},
    {"model.multiple_of", K_INT, OFF(model.multiple_of), 1, 1 << 20,
     "SwiGLU hidden size is rounded up to a multiple of this", NULL},
    {"model.ffn_dim_multiplier", K_DOUBLE, OFF(model.ffn_dim_multiplier), 0, 64,
     "Llama 2 ffn_dim_multiplier (0 = none)", NULL},
    {"model.norm_eps", K_DOUBLE, OFF(model.norm_eps), 1e-12, 1, "RMSNorm epsilon", NULL},
    {"model.rope_theta", K_DOUBLE, OFF(model.rope_theta), 1, 1e12, "RoPE base frequency", NULL},
    {"model.rope_scaling", K_FLAG_SECTION, OFF(model.rope_scaling.on), 0, 0,
     "RoPE frequency scaling as Hugging Face's rope_scaling (object, or false = none)", NULL},
    {"model.rope_scaling.type", K_ENUM, OFF(model.rope_scaling.type), 0, 0,
     "llama3 (Llama 3.1 and later: low frequencies divided by factor, a blended band)", ROPE_SCALING_NAMES},
    {"model.rope_scaling.factor", K_DOUBLE, OFF(model.rope_scaling.factor), 1, 1024,
     "how far the context is stretched", NULL},
    {"model.rope_scaling.low_freq_factor", K_DOUBLE, OFF(model.rope_scaling.low_freq_factor), 1e-6, 1e6,
     "wavelengths above original_max_position_embeddings / this are divided by factor", NULL},
    {"model.rope_scaling.high_freq_factor", K_DOUBLE, OFF(model.rope_scaling.high_freq_factor), 1e-6, 1e6,
     "wavelengths below original_max_position_embeddings / this are kept", NULL},
    {"model.rope_scaling.original_max_position_embeddings", K_INT,
     OFF(model.rope_scaling.original_max_position_embeddings), 1, 1 << 24,
     "the context length the model was pretrained on", NULL},
    {"model.max_seq_len", K_INT, OFF(model.max_seq_len), 1, 1 << 20,
     "training sequence length T", NULL},
    {"model.tie_embeddings", K_BOOL, OFF(model.tie_embeddings), 0, 0,
     "share the token embedding with the output head", NULL},

    {"train", K_SECTION, 0, 0, 0, "optimisation", NULL},
    {"train.steps", K_INT, OFF(train.steps), 0, 1e9, "optimizer steps", NULL},
    {"train.seed", K_U64, OFF(train.seed), 0, BIG, "seed for weights and data order", NULL},
    {"train.micro_batch_size", K_INT, OFF(train.micro_batch_size), 1, 1 << 20,
     "sequences per micro-batch per rank B", NULL},
    {"train.grad_accum_steps", K_INT, OFF(train.grad_accum_steps), 1, 1 << 20,
     "micro-batches accumulated per optimizer step", NULL},
    {"train.lr", K_DOUBLE, OFF(train.lr), 0, 10, "peak learning rate", NULL},
    {"train.min_lr", K_DOUBLE, OFF(train.min_lr), 0, 10, "floor of the cosine decay", NULL},
    {"train.warmup_steps", K_INT, OFF(train.warmup_steps), 0, 1e9, "linear warmup steps", NULL},
    {"train.weight_decay", K_DOUBLE, OFF(train.weight_decay), 0, 10, "AdamW decoupled weight decay", NULL},
    {"train.decay_norms_and_embeddings", K_BOOL, OFF(train.decay_norms_and_embeddings), 0, 0,
     "also apply weight decay to norm weights and the token embedding", NULL},
    {"train.beta1", K_DOUBLE, OFF(train.beta1), 0, 0.999999, "AdamW beta1", NULL},
    {"train.beta2", K_DOUBLE, OFF(train.beta2), 0, 0.999999, "AdamW beta2", NULL},
    {"train.adam_eps", K_DOUBLE, OFF(train.adam_eps), 0, 1, "AdamW epsilon", NULL},
    {"train.grad_clip", K_DOUBLE, OFF(train.grad_clip), 0, 1e9,
     "clip the global gradient norm to this (0 = off)", NULL},
    {"train.threads", K_INT, OFF(train.threads), 0, 64, "compute threads (0 = all cores)", NULL},
    {"train.eval_every", K_INT, OFF(train.eval_every), 0, 1e9,
     "validation loss every N steps when a val split exists (0 = never)", NULL},
    {"train.eval_batches", K_INT, OFF(train.eval_batches), 1, 1e6,
     "global batches (micro_batch_size x grad_accum_steps x ranks sequences) per validation pass", NULL},
    {"train.sample_every", K_INT, OFF(train.sample_every), 0, 1e9,
     "text samples from the model every N steps into RUN/samples.jsonl (0 = never; needs a tokenizer; the "
     "training's numbers do not change)", NULL},
    {"train.sample_prompts", K_STRING_LIST, OFF(train.sample_prompts), 0, 0,
     "the prompts sampled from (none: one sample from the BOS alone)", NULL},
    {"train.sample_max_tokens", K_INT, OFF(train.sample_max_tokens), 1, 1e5, "new tokens per sample at most", NULL},
    {"train.sample_temperature", K_DOUBLE, OFF(train.sample_temperature), 0, 1e6,
     "the samples' temperature (0 = greedy)", NULL},
    {"train.sample_seed", K_U64, OFF(train.sample_seed), 0, BIG,
     "prompt i of every sample draws from a generator seeded by (this, i)", NULL},
    {"train.profile_steps", K_INT, OFF(train.profile_steps), 0, 1e9,
     "time every backend call of this many steps after the launch's first: RUN/profile.json and a table "
     "(on a GPU each call is waited for, so those steps run slower; 0 = off)", NULL},
    {"train.lora", K_FLAG_SECTION, OFF(train.lora.on), 0, 0,
     "low-rank adapters (LoRA) trained on a frozen base: the base's weights get no gradients and no optimizer "
     "state; needs init_from, the base (object, or false = every weight trained; docs/lora.md)", NULL},
    {"train.lora.rank", K_INT, OFF(train.lora.rank), 1, 1 << 16,
     "r: each adapter is B (out, r) · A (r, in); at most the smaller side of every target", NULL},
    {"train.lora.alpha", K_DOUBLE, OFF(train.lora.alpha), 0, 1e6,
     "an adapter's output is scaled by alpha / rank (PEFT's lora_alpha)", NULL},
    {"train.lora.dropout", K_DOUBLE, OFF(train.lora.dropout), 0, 0.99,
     "dropout on an adapter's input while training, its mask drawn from train.seed, the step and the "
     "sequence (PEFT's lora_dropout)", NULL},
    {"train.lora.targets", K_ENUM_SET, OFF(train.lora.targets), 0, 0,
     "the matrices of every block that get adapters (Hugging Face module names)", LORA_TARGET_NAMES},
    {"train.lora.init_from", K_STRING, OFF(train.lora.init_from), 0, 0,
     "an adapter checkpoint (`keel ckpt import --from-peft`, or a LoRA run's) whose adapters start the run, of "
     "this rank and these targets, on init_from's base (null = new adapters)", NULL},

    {"data", K_SECTION, 0, 0, 0, "training data", NULL},
    {"data.path", K_STRING, OFF(data.path), 0, 0,
     "directory from `keel data prepare` (or one shard file); wins over synthetic", NULL},
    {"data.sources", K_SOURCES, OFF(data.sources), 0, 0,
     "a weighted mixture of prepared datasets instead of data.path: [{\"path\": DIR, \"weight\": w}, ...]; "
     "each draws weight / (sum of weights) of the sequences, in an order that depends on the seed alone "
     "(docs/data.md)", NULL},
    {"data.document_mask", K_BOOL, OFF(data.document_mask), 0, 0,
     "keep attention inside each document of a packed sequence (the document starts `keel data prepare` "
     "writes; CPU backend)", NULL},
    {"data.tokenizer", K_STRING, OFF(data.tokenizer), 0, 0,
     "SentencePiece .model or Hugging Face tokenizer.json (e.g. the one `keel ckpt import` carries); its vocabulary "
     "must fit model.vocab_size (equal, or smaller: a padded embedding)", NULL},
    {"data.synthetic", K_FLAG_SECTION, OFF(data.synthetic), 0, 0,
     "seeded learnable token source (object, or false)", NULL},
    {"data.synthetic.seed", K_U64, OFF(data.synthetic_seed), 0, BIG, "seed of the token chain", NULL},
    {"data.synthetic.branching", K_INT, OFF(data.synthetic_branching), 1, 1 << 20,
     "successor candidates per token (ideal loss = ln(branching))", NULL},
    {"data.synthetic.vocab", K_INT, OFF(data.synthetic_vocab), 0, 1 << 24,
     "tokens used (0 = min(model.vocab_size, 64))", NULL},

    {"fsdp", K_SECTION, 0, 0, 0, "sharding over ranks (keel train --nproc N)", NULL},
    {"fsdp.strategy", K_ENUM, OFF(fsdp.strategy), 0, 0,
     "full_shard, shard_grad_op, no_shard or hybrid_shard (DESIGN §3)", STRATEGY_NAMES},
    {"fsdp.shard_group_size", K_INT, OFF(fsdp.shard_group_size), 0, 4096,
     "hybrid_shard: ranks per shard group, a divisor of --nproc (0 = 2)", NULL},
    {"fsdp.prefetch", K_BOOL, OFF(fsdp.prefetch), 0, 0,
     "start the next unit's all-gather before computing the current one (forward and backward)", NULL},
    {"fsdp.node_windows", K_BOOL, OFF(fsdp.node_windows), 0, 0,
     "a shard group's ranks on one machine gather units into memory they all map: one copy on the "
     "machine, nothing copied (CPU; false: every rank its own copy, through the all-gathers)", NULL},
    {"fsdp.mixed_precision", K_ENUM, OFF(fsdp.mixed_precision), 0, 0,
     "fp32 or bf16: GEMMs on bf16 weights and inputs (gathered in bf16), fp32 master weights, "
     "optimizer and accumulation (any run; emulated on CPUs without bf16 instructions)", DTYPE_NAMES},
    {"fsdp.reduce_dtype", K_ENUM, OFF(fsdp.reduce_dtype), 0, 0,
     "fp32 or bf16: element type of the gradient reduce-scatter and all-reduce", DTYPE_NAMES},
    {"fsdp.unit", K_ENUM, OFF(fsdp.unit), 0, 0,
     "block or matrix: what one all-gather holds — a whole transformer block, or one weight "
     "matrix of it (5 units a block: less memory for wide layers, more collectives)", UNIT_NAMES},
    {"fsdp.activation_checkpointing", K_BOOL_COUNT, OFF(fsdp.activation_checkpointing), 0, 4096,
     "recompute blocks' forward in backward (less memory, same gradients; any run): true every block, "
     "N the first N (memory of L-N+1 blocks' activations, N-1 blocks recomputed), false none", NULL},

    {"init_from", K_STRING, OFF(init_from), 0, 0,
     "a checkpoint directory (e.g. from `keel ckpt import --from-hf`) whose parameters start the "
     "run instead of random ones; the model keys must match it (null = random init)", NULL},
    {"device", K_ENUM, OFF(device), 0, 0,
     "where the model runs: cpu, or cuda (NVIDIA GPUs, one rank per GPU; refused in one line where none can be used)",
     DEVICE_NAMES},
    {"checkpoint", K_SECTION, 0, 0, 0, "sharded checkpoints in RUN/checkpoints (resume: keel train again)", NULL},
    {"checkpoint.every_steps", K_INT, OFF(checkpoint.every_steps), 0, 1 << 30,
     "save every N optimizer steps (0 = not by steps)", NULL},
    {"checkpoint.every_seconds", K_DOUBLE, OFF(checkpoint.every_seconds), 0, 1e9,
     "save when this many seconds passed since the last save (0 = not by time)", NULL},
    {"checkpoint.keep_last", K_INT, OFF(checkpoint.keep_last), 0, 1 << 20,
     "committed checkpoints kept; older ones are deleted after a commit (0 = keep all)", NULL},
    {"checkpoint.async", K_BOOL, OFF(checkpoint.async), 0, 0,
     "copy the shard to a host buffer and write it on a background thread while training goes on", NULL},

    {"resilience", K_SECTION, 0, 0, 0, "what the supervisor (keel train --nproc N) does when ranks fail (DESIGN §6)", NULL},
    {"resilience.max_restarts", K_INT, OFF(resilience.max_restarts), 0, 1 << 20,
     "relaunches from the last checkpoint before the run is given up (0 = fail on the first failure)", NULL},
    {"resilience.hang_timeout_s", K_DOUBLE, OFF(resilience.hang_timeout_s), 0, 1e7,
     "a rank that makes no progress, or stops beating, for this long is hung (0 = automatic: once "
     "steps are steady, hang_factor x the median step, at least hang_floor_s; before that, and while "
     "a rank checkpoints or evaluates, 10 x the slowest progress gap seen, at least 60 s, before the "
     "first step at least 120 s)", NULL},
    {"resilience.hang_factor", K_DOUBLE, OFF(resilience.hang_factor), 1, 1e6,
     "automatic hang timeout once steps are steady: this many median step times without progress", NULL},
    {"resilience.hang_floor_s", K_DOUBLE, OFF(resilience.hang_floor_s), 0.5, 1e7,
     "automatic hang timeout once steps are steady: at least this many seconds", NULL},
    {"resilience.startup_timeout_s", K_DOUBLE_AUTO, OFF(resilience.startup_timeout_s), 1, 1e6,
     "a rank whose MPI start-up and first collective with the other ranks take longer than this exits "
     "with one line naming what it waited for and the transport settings to check (null = from the "
     "world size: 30 + 30 x log2(ranks) s, 60 s at 2 ranks)", NULL},
    {"resilience.snapshot_every_steps", K_INT, OFF(resilience.snapshot_every_steps), 0, 1 << 30,
     "under the supervisor (keel train --nproc N), every rank copies its shard (parameters, AdamW "
     "moments) into node-local shared memory (/dev/shm) after every N optimizer steps, alongside the "
     "next step, and over several nodes also to a buddy rank on another node; a relaunch resumes from "
     "the newest snapshot every rank can get when it is at least as new as the newest checkpoint "
     "(0 = off)", NULL},
    {"resilience.backoff_s", K_DOUBLE, OFF(resilience.backoff_s), 0, 3600,
     "least time from a failure to the relaunch when the failure made no progress (the same step "
     "failing again; the health checks run inside it), doubling with each more (at most 300 s); the "
     "first failure after progress relaunches as soon as the health checks pass", NULL},
    {"resilience.crash_loop", K_INT, OFF(resilience.crash_loop), 1, 1 << 20,
     "this many failures in a row, none in a later step than the first of them (the same step failing "
     "again, or an earlier one), stop the run with a report; a failure further on than every one before it "
     "is progress and starts the count again", NULL},
    {"resilience.max_loss", K_DOUBLE, OFF(resilience.max_loss), 0, 1e30,
     "a step whose mean loss exceeds this has diverged, like a NaN/Inf one: roll back, then skip "
     "its data once, then stop (0 = 3 x ln(model.vocab_size), three times a uniform guess)", NULL},
    {"resilience.spares", K_INT, OFF(resilience.spares), 0, 1 << 20,
     "nodes of a Slurm allocation held back to replace nodes that fail a health check", NULL},
    {"resilience.min_ranks", K_INT, OFF(resilience.min_ranks), 0, 1 << 20,
     "with no spare left the job may shrink down to this many ranks (0 = never shrink)", NULL},
    {"resilience.health_checks", K_ENUM_SET, OFF(resilience.health_checks), 0, 0,
     "checks run on every node after a failure, before relaunching: gemm, memory, "
     "checkpoint_dir, mpi, gpu (keel health; [] = none)", CHECK_NAMES},
    {"resilience.gemm_floor_gflops", K_DOUBLE, OFF(resilience.gemm_floor_gflops), 0, 1e12,
     "the gemm health check fails below this many GFLOP/s per core", NULL},
    {"resilience.straggler_factor", K_DOUBLE, OFF(resilience.straggler_factor), 0, 1000,
     "a rank whose compute time per step (its step less its waits on peers) exceeds this times the "
     "other ranks' median... (0 = no straggler detection)", NULL},
    {"resilience.straggler_steps", K_INT, OFF(resilience.straggler_steps), 1, 1 << 20,
     "...for this many steps in a row is a straggler: a `straggler` event and failure metric", NULL},
    {"resilience.straggler_action", K_ENUM, OFF(resilience.straggler_action), 0, 0,
     "report (the event and metric only) or drain (also treat its node as one that failed a "
     "health check: drained or excluded, the ranks relaunched on the others or a spare)", STRAGGLER_ACTION_NAMES},

    {"metrics", K_SECTION, 0, 0, 0, "the run's HTTP endpoint: Prometheus /metrics (keel train serves it)", NULL},
    {"metrics.port", K_INT, OFF(metrics.port), 0, 65535,
     "TCP port of /metrics and the dashboard (0 = none; default 9477, or $KEEL_METRICS_PORT when set). "
     "Left unset (not in the config, --set or $KEEL_METRICS_PORT), a busy port moves to the first free "
     "one of 9477-9508, and with all of them busy the run trains without an endpoint (one warning); set, "
     "a busy port is an error before training starts. The URL served is logged and written to "
     "RUN/endpoint.json", NULL},
    {"metrics.bind", K_STRING, OFF(metrics.bind), 0, 0,
     "address the endpoint listens on (null = 127.0.0.1, this machine only; 0.0.0.0 = every interface)", NULL},
    {"metrics.allowed_hosts", K_STRING_LIST, OFF(metrics.allowed_hosts), 0, 0,
     "host names or addresses, without a port, that the dashboard and /api/run also answer to beside "
     "localhost, 127.0.0.1, [::1] and metrics.bind (a request naming another Host gets 421: DNS rebinding); "
     "/metrics answers any Host", NULL},
};
#define N_KEYS ((int)(sizeof KEYS / sizeof KEYS[0]))
_Static_assert(N_KEYS <= KEEL_CONFIG_MAX_KEYS, "raise KEEL_CONFIG_MAX_KEYS (keel/core.h)");
_Static_assert(KEEL_METRICS_DEFAULT_PORT == 9477 && KEEL_METRICS_PORT_RANGE == 32,
               "metrics.port's help text names the range 9477-9508");

static const key_spec *find_key(const char *key);

/* $KEEL_METRICS_PORT replaces the default port (a config or --set still wins):
 * a job script or a test suite running many runs on one machine sets it once.
 * A value that is not a port is reported by keel_config_finalize. */
static const char *metrics_port_env(void) {
    const char *v = getenv("KEEL_METRICS_PORT");
    return v && *v ? v : NULL;
}

static bool parse_port(const char *text, int *port) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < 0 || v > 65535) return false;
    *port = (int)v;
    return true;
}

/* The default port, or $KEEL_METRICS_PORT's, which counts as the user's:
 * recorded as the key's origin like a value from a file or --set. */
static void metrics_port_default(keel_config *cfg) {
    cfg->metrics.port = KEEL_METRICS_DEFAULT_PORT;
    const char *env = metrics_port_env();
    if (env && parse_port(env, &cfg->metrics.port))
        cfg->key_origin[find_key("metrics.port") - KEYS] = KEEL_FROM_ENV;
}

void keel_config_defaults(keel_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->model = (keel_model_config){.dim = 288, .n_layers = 6, .n_heads = 6, .n_kv_heads = 0,
                                     .vocab_size = 32000, .multiple_of = 32,
                                     .ffn_dim_multiplier = 0, .norm_eps = 1e-5,
                                     .rope_theta = 10000, .max_seq_len = 256,
                                     .tie_embeddings = false};
    /* Llama 3.1's values, used where a rope_scaling section leaves them out */
    cfg->model.rope_scaling = (keel_rope_scaling){.on = false, .type = KEEL_ROPE_SCALING_LLAMA3, .factor = 8,
                                                  .low_freq_factor = 1, .high_freq_factor = 4,
                                                  .original_max_position_embeddings = 8192};
    cfg->train = (keel_train_config){.steps = 100, .seed = 1337, .micro_batch_size = 4,
                                     .grad_accum_steps = 1, .lr = 3e-4, .min_lr = 3e-5,
                                     .warmup_steps = 10, .weight_decay = 0.1,
                                     .decay_norms_and_embeddings = false, .beta1 = 0.9,
                                     .beta2 = 0.95, .adam_eps = 1e-8, .grad_clip = 1.0,
                                     .threads = 0, .eval_every = 0, .eval_batches = 8,
                                     .profile_steps = 0, .sample_max_tokens = 64, .sample_temperature = 0.8};
    /* PEFT's LoraConfig defaults, and its default targets for Llama */
    cfg->train.lora = (keel_lora_config){.on = false, .rank = 8, .alpha = 8, .dropout = 0,
                                         .targets = 1u << KEEL_LORA_Q | 1u << KEEL_LORA_V};
    cfg->data.synthetic_seed = 1;
    cfg->fsdp.strategy = KEEL_FSDP_FULL_SHARD;
    cfg->fsdp.prefetch = true;
    cfg->fsdp.node_windows = true;
    cfg->checkpoint = (keel_checkpoint_config){.keep_last = 3, .async = true};
    cfg->fsdp.mixed_precision = cfg->fsdp.reduce_dtype = KEEL_DTYPE_FP32;
    cfg->data.synthetic_branching = 4;
    cfg->resilience = (keel_resilience_config){.max_restarts = 10, .backoff_s = 1, .crash_loop = 3,
                                               .hang_factor = 3, .hang_floor_s = 5, .snapshot_every_steps = 1,
                                               .gemm_floor_gflops = 10, .straggler_factor = 1.3,
                                               .straggler_steps = 5};
    cfg->resilience.health_checks = (1u << KEEL_CHECK_COUNT) - 1;
    metrics_port_default(cfg);
}

static void free_list(char ***list) {
    for (char **s = *list; s && *s; s++) free(*s);
    free(*list);
    *list = NULL;
}

static void free_sources(keel_data_sources *s) {
    for (int i = 0; i < s->n; i++) free(s->v[i].path);
    free(s->v);
    s->v = NULL;
    s->n = 0;
}

void keel_config_free(keel_config *cfg) {
    for (int i = 0; i < N_KEYS; i++)
        if (KEYS[i].type == K_STRING) {
            char **s = (char **)((char *)cfg + KEYS[i].offset);
            free(*s);
            *s = NULL;
        } else if (KEYS[i].type == K_STRING_LIST) {
            free_list((char ***)((char *)cfg + KEYS[i].offset));
        } else if (KEYS[i].type == K_SOURCES) {
            free_sources((keel_data_sources *)((char *)cfg + KEYS[i].offset));
        }
    free(cfg->source);
    cfg->source = NULL;
}

static const key_spec *find_key(const char *key) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(KEYS[i].key, key) == 0) return &KEYS[i];
    return NULL;
}

keel_config_origin keel_config_key_origin(const keel_config *cfg, const char *key) {
    const key_spec *k = find_key(key);
    KEEL_CHECK(k, "keel_config_key_origin: no config key '%s'", key);
    return (keel_config_origin)cfg->key_origin[k - KEYS];
}

static int edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

static keel_status unknown_key(const char *origin, const char *key) {
    const char *best = NULL;
    int best_d = 4;
    for (int i = 0; i < N_KEYS; i++) {
        int dist = edit_distance(key, KEYS[i].key);
        if (dist < best_d) best_d = dist, best = KEYS[i].key;
    }
    if (best)
        keel_errorf("%s: unknown config key '%s'; did you mean '%s'? (`keel config keys` lists all)",
                    origin, key, best);
    else
        keel_errorf("%s: unknown config key '%s' (`keel config keys` lists all)", origin, key);
    return KEEL_ERR_INPUT;
}

static const char *type_name(key_type t) {
    switch (t) {
    case K_INT: case K_U64: return "an integer";
    case K_DOUBLE: return "a number";
    case K_DOUBLE_AUTO: return "a number or null";
    case K_BOOL: return "true or false";
    case K_BOOL_COUNT: return "true, false or a count";
    case K_STRING: return "a string";
    case K_ENUM: return "a string";
    case K_ENUM_SET: case K_STRING_LIST: return "a list of strings";
    case K_SOURCES: return "a list of {\"path\", \"weight\"} objects";
    default: return "an object";
    }
}

static keel_status bad_value(const char *origin, const key_spec *k, const cJSON *v, const char *why) {
    char *text = cJSON_PrintUnformatted(v);
    keel_errorf("%s: key '%s' %s, got %s", origin, k->key, why, text ? text : "?");
    free(text);
    return KEEL_ERR_INPUT;
}

static keel_status parse_object(keel_config *cfg, const cJSON *obj, const char *prefix,
                                const char *origin, keel_config_origin from);

/* The index of value in names, or -1. */
static int find_name(const char *value, const char *const *names) {
    for (int i = 0; names[i]; i++)
        if (!strcmp(value, names[i])) return i;
    return -1;
}

/* names, ", "-separated. */
static void list_names(const char *const *names, char *out, size_t n) {
    out[0] = 0;
    for (int i = 0; names[i]; i++) snprintf(out + strlen(out), n - strlen(out), "%s%s", i ? ", " : "", names[i]);
}

/* The index of value in names; otherwise one error line naming the choices. */
static bool name_index(const char *origin, const char *what, const char *value, const char *const *names,
                       int *index) {
    if ((*index = find_name(value, names)) >= 0) return true;
    char list[256];
    list_names(names, list, sizeof list);
    keel_errorf("%s: %s '%s' is not one of %s", origin, what, value, list);
    return false;
}

keel_status keel_health_checks_parse(const char *list, const char *origin, unsigned *mask) {
    char *copy = keel_xstrdup(list), *save = NULL;
    keel_status st = KEEL_OK;
    *mask = 0;
    for (char *name = strtok_r(copy, ",", &save); name && st == KEEL_OK; name = strtok_r(NULL, ",", &save)) {
        int index = find_name(name, CHECK_NAMES);
        if (index >= 0) {
            *mask |= 1u << index;
            continue;
        }
        char names[256];
        list_names(CHECK_NAMES, names, sizeof names);
        keel_errorf("%s: unknown check '%s'; the checks are %s", origin, name, names);
        st = KEEL_ERR_INPUT;
    }
    keel_free(copy);
    return st;
}

/* The names of a mask's bits, comma-separated. */
static void format_set(unsigned mask, const char *const *names, char *out, size_t n) {
    out[0] = 0;
    for (int i = 0; names[i]; i++)
        if (mask & (1u << i)) snprintf(out + strlen(out), n - strlen(out), "%s%s", out[0] ? "," : "", names[i]);
}

void keel_health_checks_format(unsigned mask, char *out, size_t n) { format_set(mask, CHECK_NAMES, out, n); }
void keel_lora_targets_format(unsigned mask, char *out, size_t n) { format_set(mask, LORA_TARGET_NAMES, out, n); }

/* Store one JSON value into the field of spec k, checking type and range;
 * `from` is recorded as where it came from (keel_config_key_origin). */
static keel_status store(keel_config *cfg, const key_spec *k, const cJSON *v, const char *origin,
                         keel_config_origin from) {
    void *field = (char *)cfg + k->offset;
    char why[128];
    cfg->key_origin[k - KEYS] = (unsigned char)from;
    switch (k->type) {
    case K_SECTION:
        if (!cJSON_IsObject(v)) return bad_value(origin, k, v, "must be an object");
        return parse_object(cfg, v, k->key, origin, from);
    case K_FLAG_SECTION:
        if (cJSON_IsBool(v)) {
            *(bool *)field = cJSON_IsTrue(v);
            return KEEL_OK;
        }
        if (!cJSON_IsObject(v)) return bad_value(origin, k, v, "must be an object or false");
        *(bool *)field = true;
        return parse_object(cfg, v, k->key, origin, from);
    case K_BOOL:
        if (!cJSON_IsBool(v)) return bad_value(origin, k, v, "must be true or false");
        *(bool *)field = cJSON_IsTrue(v);
        return KEEL_OK;
    case K_BOOL_COUNT: /* true: all (KEEL_CHECKPOINT_ALL), false: 0, or a count */
        if (cJSON_IsBool(v)) {
            *(int *)field = cJSON_IsTrue(v) ? KEEL_CHECKPOINT_ALL : 0;
            return KEEL_OK;
        }
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || !(v->valuedouble >= k->min) ||
            !(v->valuedouble <= k->max)) {
            snprintf(why, sizeof why, "must be true, false or a count in [%.0f, %.0f]", k->min, k->max);
            return bad_value(origin, k, v, why);
        }
        *(int *)field = (int)v->valuedouble;
        return KEEL_OK;
    case K_STRING:
        if (cJSON_IsNull(v)) {
            free(*(char **)field);
            *(char **)field = NULL;
            return KEEL_OK;
        }
        if (!cJSON_IsString(v)) return bad_value(origin, k, v, "must be a string");
        free(*(char **)field);
        *(char **)field = keel_xstrdup(v->valuestring);
        return KEEL_OK;
    case K_ENUM: {
        int index;
        if (!cJSON_IsString(v)) return bad_value(origin, k, v, "must be a string");
        if (!name_index(origin, k->key, v->valuestring, k->names, &index)) return KEEL_ERR_INPUT;
        *(int *)field = index;
        return KEEL_OK;
    }
    case K_ENUM_SET: {
        if (!cJSON_IsArray(v)) return bad_value(origin, k, v, "must be a list of names");
        unsigned mask = 0;
        const cJSON *x;
        char what[160];
        snprintf(what, sizeof what, "%s entry", k->key);
        cJSON_ArrayForEach(x, v) {
            int index;
            if (!cJSON_IsString(x)) return bad_value(origin, k, v, "must be a list of names");
            if (!name_index(origin, what, x->valuestring, k->names, &index)) return KEEL_ERR_INPUT;
            mask |= 1u << index;
        }
        *(unsigned *)field = mask;
        return KEEL_OK;
    }
    case K_STRING_LIST: {
        if (!cJSON_IsArray(v) && !cJSON_IsNull(v)) return bad_value(origin, k, v, "must be a list of strings");
        int n = cJSON_IsNull(v) ? 0 : cJSON_GetArraySize(v);
        const cJSON *x;
        cJSON_ArrayForEach(x, v) {
            if (!cJSON_IsString(x)) return bad_value(origin, k, v, "must be a list of strings");
        }
        free_list((char ***)field);
        if (n == 0) return KEEL_OK;
        char **list = keel_xcalloc(((size_t)n + 1) * sizeof *list, k->key);
        int i = 0;
        cJSON_ArrayForEach(x, v) list[i++] = keel_xstrdup(x->valuestring);
        *(char ***)field = list;
        return KEEL_OK;
    }
    case K_SOURCES: { /* [{"path": DIR, "weight": w}, ...]; null or [] = none */
        if (!cJSON_IsArray(v) && !cJSON_IsNull(v))
            return bad_value(origin, k, v, "must be a list of {\"path\": DIR, \"weight\": w} objects");
        const cJSON *x;
        cJSON_ArrayForEach(x, v) {
            const cJSON *path = cJSON_GetObjectItemCaseSensitive(x, "path");
            const cJSON *weight = cJSON_GetObjectItemCaseSensitive(x, "weight");
            if (!cJSON_IsObject(x) || !cJSON_IsString(path) || !path->valuestring[0])
                return bad_value(origin, k, x, "entries need \"path\": a prepared directory");
            if (!cJSON_IsNumber(weight) || !(weight->valuedouble >= 0) || !(weight->valuedouble <= 1e12))
                return bad_value(origin, k, x, "entries need \"weight\": a number >= 0 (their share is "
                                               "weight / sum of weights)");
            for (const cJSON *m = x->child; m; m = m->next)
                if (strcmp(m->string, "path") && strcmp(m->string, "weight")) {
                    snprintf(why, sizeof why, "entries hold \"path\" and \"weight\" only, not \"%.40s\"",
                             m->string);
                    return bad_value(origin, k, x, why);
                }
        }
        keel_data_sources *list = field;
        free_sources(list);
        list->n = cJSON_IsNull(v) ? 0 : cJSON_GetArraySize(v);
        if (list->n == 0) return KEEL_OK;
        list->v = keel_xcalloc(sizeof *list->v * (size_t)list->n, k->key);
        int i = 0;
        cJSON_ArrayForEach(x, v) {
            list->v[i].path = keel_xstrdup(cJSON_GetObjectItemCaseSensitive(x, "path")->valuestring);
            list->v[i++].weight = cJSON_GetObjectItemCaseSensitive(x, "weight")->valuedouble;
        }
        return KEEL_OK;
    }
    case K_DOUBLE_AUTO:
        if (cJSON_IsNull(v)) {
            *(double *)field = 0;
            return KEEL_OK;
        }
        __attribute__((fallthrough)); /* a number, checked as K_DOUBLE */
    case K_INT: case K_U64: case K_DOUBLE: {
        if (!cJSON_IsNumber(v)) {
            snprintf(why, sizeof why, "must be %s", type_name(k->type));
            return bad_value(origin, k, v, why);
        }
        double x = v->valuedouble;
        bool real = k->type == K_DOUBLE || k->type == K_DOUBLE_AUTO;
        if (!real && x != floor(x)) return bad_value(origin, k, v, "must be an integer");
        if (!(x >= k->min && x <= k->max)) {
            if (k->type == K_DOUBLE_AUTO) snprintf(why, sizeof why, "must be in [%g, %g], or null", k->min, k->max);
            else if (real) snprintf(why, sizeof why, "must be in [%g, %g]", k->min, k->max);
            else snprintf(why, sizeof why, "must be in [%.0f, %.0f]", k->min, k->max);
            return bad_value(origin, k, v, why);
        }
        if (k->type == K_INT) *(int *)field = (int)x;
        else if (k->type == K_U64) *(uint64_t *)field = (uint64_t)x;
        else *(double *)field = x;
        return KEEL_OK;
    }
    }
    return KEEL_ERR_INTERNAL;
}

static keel_status parse_object(keel_config *cfg, const cJSON *obj, const char *prefix,
                                const char *origin, keel_config_origin from) {
    for (const cJSON *child = obj->child; child; child = child->next) {
        char key[256];
        if (prefix[0]) snprintf(key, sizeof key, "%s.%s", prefix, child->string);
        else snprintf(key, sizeof key, "%s", child->string);
        const key_spec *k = find_key(key);
        if (!k) return unknown_key(origin, key);
        keel_status st = store(cfg, k, child, origin, from);
        if (st != KEEL_OK) return st;
    }
    return KEEL_OK;
}

keel_status keel_config_load_string(keel_config *cfg, const char *json, const char *origin) {
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        int line = 1;
        for (const char *p = json; at && p < at; p++) line += *p == '\n';
        keel_errorf("%s: invalid JSON near line %d; fix the syntax", origin, line);
        return KEEL_ERR_INPUT;
    }
    keel_status st = KEEL_OK;
    if (!cJSON_IsObject(root)) {
        keel_errorf("%s: the config must be a JSON object", origin);
        st = KEEL_ERR_INPUT;
    } else {
        st = parse_object(cfg, root, "", origin, KEEL_FROM_FILE);
    }
    cJSON_Delete(root);
    return st;
}

keel_status keel_config_load_file(keel_config *cfg, const char *path) {
    /* A cap, so that a data file passed by mistake is an error, not 10 GB of RAM. */
    enum { MAX_CONFIG_BYTES = 64 << 20 };
    char *buf;
    if (keel_read_file_quiet(path, MAX_CONFIG_BYTES, &buf, NULL) != KEEL_OK) {
        if (errno == EFBIG)
            keel_errorf("%s: not a config file (larger than %d MiB)", path, MAX_CONFIG_BYTES >> 20);
        else
            keel_errorf("%s: cannot open config: %s", path, strerror(errno));
        return KEEL_ERR_INPUT;
    }
    keel_status st = keel_config_load_string(cfg, buf, path);
    keel_free(buf);
    if (st == KEEL_OK) {
        free(cfg->source);
        cfg->source = keel_xstrdup(path);
    }
    return st;
}

keel_status keel_config_set(keel_config *cfg, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        keel_errorf("--set '%s': expected key=value, e.g. --set train.steps=100", assignment);
        return KEEL_ERR_INPUT;
    }
    char key[256];
    size_t klen = (size_t)(eq - assignment);
    if (klen >= sizeof key) klen = sizeof key - 1;
    memcpy(key, assignment, klen);
    key[klen] = 0;
    const key_spec *k = find_key(key);
    if (!k) return unknown_key("--set", key);
    const char *text = eq + 1;
    cJSON *v = cJSON_Parse(text);
    /* A string or name key takes the raw text unless it is a JSON string or null. */
    if ((k->type == K_STRING || k->type == K_ENUM) && (!v || !(cJSON_IsString(v) || cJSON_IsNull(v)))) {
        cJSON_Delete(v);
        v = cJSON_CreateString(text);
    }
    /* A list key also takes bare comma-separated names: --set resilience.health_checks=gemm,mpi */
    if ((k->type == K_ENUM_SET && !cJSON_IsArray(v)) ||
        (k->type == K_STRING_LIST && !cJSON_IsArray(v) && !cJSON_IsNull(v))) {
        cJSON_Delete(v);
        v = cJSON_CreateArray();
        char *copy = keel_xstrdup(text), *save = NULL;
        for (char *name = strtok_r(copy, ",", &save); name; name = strtok_r(NULL, ",", &save))
            cJSON_AddItemToArray(v, cJSON_CreateString(name));
        keel_free(copy);
    }
    if (!v) {
        keel_errorf("--set %s: value '%s' must be %s", key, text, type_name(k->type));
        return KEEL_ERR_INPUT;
    }
    keel_status st = store(cfg, k, v, "--set", KEEL_FROM_SET);
    /* Setting a key inside a section that can be off (data.synthetic, train.lora) turns it on. */
    for (int i = 0; st == KEEL_OK && i < N_KEYS; i++) {
        size_t n = strlen(KEYS[i].key);
        if (KEYS[i].type == K_FLAG_SECTION && strncmp(key, KEYS[i].key, n) == 0 && key[n] == '.')
            *(bool *)((char *)cfg + KEYS[i].offset) = true;
    }
    cJSON_Delete(v);
    return st;
}

int keel_config_checkpoint_blocks(const keel_config *cfg) {
    int n = cfg->fsdp.activation_checkpointing, L = cfg->model.n_layers;
    return n == KEEL_CHECKPOINT_ALL || n > L ? L : n;
}

void keel_config_format_checkpointing(int n, char *out, size_t size) {
    if (n == KEEL_CHECKPOINT_ALL || n == 0) snprintf(out, size, "%s", n ? "true" : "false");
    else snprintf(out, size, "%d", n);
}

keel_status keel_config_finalize(keel_config *cfg) {
    const char *src = cfg->source ? cfg->source : "config";
    keel_model_config *m = &cfg->model;
    if (m->n_kv_heads == 0) m->n_kv_heads = m->n_heads;
    if (cfg->data.path && cfg->data.sources.n) {
        keel_errorf("%s: data.path and data.sources are both set; use data.sources alone (a source of weight 1 "
                    "is one dataset)", src);
        return KEEL_ERR_INPUT;
    }
    if (cfg->data.path || cfg->data.sources.n) cfg->data.synthetic = false;
    int port;
    const char *env = metrics_port_env();
    if (env && !parse_port(env, &port)) {
        keel_errorf("KEEL_METRICS_PORT=%s is not a port: set it to 0-65535 (0 = no metrics endpoint) or unset it",
                    env);
        return KEEL_ERR_INPUT;
    }
    if (m->dim % m->n_heads != 0) {
        keel_errorf("%s: model.dim %d is not divisible by model.n_heads %d; pick a dim that is a "
                    "multiple of n_heads", src, m->dim, m->n_heads);
        return KEEL_ERR_INPUT;
    }
    if ((m->dim / m->n_heads) % 2 != 0) {
        keel_errorf("%s: head size model.dim/model.n_heads = %d must be even for RoPE", src,
                    m->dim / m->n_heads);
        return KEEL_ERR_INPUT;
    }
    if (m->n_kv_heads > m->n_heads || m->n_heads % m->n_kv_heads != 0) {
        keel_errorf("%s: model.n_heads %d is not a multiple of model.n_kv_heads %d; use a "
                    "divisor of n_heads", src, m->n_heads, m->n_kv_heads);
        return KEEL_ERR_INPUT;
    }
    const keel_rope_scaling *rs = &m->rope_scaling;
    if (rs->on && !(rs->high_freq_factor > rs->low_freq_factor)) {
        keel_errorf("%s: model.rope_scaling.high_freq_factor %g must be above low_freq_factor %g (Llama 3.1: 4 "
                    "and 1)", src, rs->high_freq_factor, rs->low_freq_factor);
        return KEEL_ERR_INPUT;
    }
    int ac = cfg->fsdp.activation_checkpointing;
    if (ac > m->n_layers) {
        keel_errorf("%s: fsdp.activation_checkpointing %d is more than model.n_layers %d; use true to "
                    "checkpoint every block", src, ac, m->n_layers);
        return KEEL_ERR_INPUT;
    }
    const keel_lora_config *lora = &cfg->train.lora;
    if (lora->on && !lora->targets) {
        keel_errorf("%s: train.lora.targets is empty; name the matrices to adapt, e.g. [\"q_proj\", \"v_proj\"], "
                    "or set train.lora to false", src);
        return KEEL_ERR_INPUT;
    }
    if (cfg->train.min_lr > cfg->train.lr) {
        keel_errorf("%s: train.min_lr %g exceeds train.lr %g; the floor must be at most the peak",
                    src, cfg->train.min_lr, cfg->train.lr);
        return KEEL_ERR_INPUT;
    }
    if (!cfg->data.path && !cfg->data.sources.n && !cfg->data.synthetic) {
        keel_errorf("%s: no training data: set data.path (from `keel data prepare`), data.sources or "
                    "data.synthetic", src);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

/* Add v under the dotted key, creating the intermediate objects. */
static void put(cJSON *root, const char *key, cJSON *v) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", key);
    cJSON *obj = root;
    char *name = buf;
    for (char *dot; (dot = strchr(name, '.')); name = dot + 1) {
        *dot = 0;
        cJSON *next = cJSON_GetObjectItemCaseSensitive(obj, name);
        if (!next || !cJSON_IsObject(next)) {
            if (next) cJSON_DeleteItemFromObjectCaseSensitive(obj, name);
            next = cJSON_AddObjectToObject(obj, name);
        }
        obj = next;
    }
    cJSON_AddItemToObject(obj, name, v);
}

/* Whether k lies inside a section that is off (data.synthetic: false): its
 * keys are then not written, so that the section reads back as off. */
static bool inside_section_off(const keel_config *cfg, const key_spec *k) {
    for (int i = 0; i < N_KEYS; i++) {
        const key_spec *s = &KEYS[i];
        size_t n = strlen(s->key);
        if (s->type == K_FLAG_SECTION && strncmp(k->key, s->key, n) == 0 && k->key[n] == '.' &&
            !*(const bool *)((const char *)cfg + s->offset))
            return true;
    }
    return false;
}

char *keel_config_to_json(const keel_config *cfg) {
    cJSON *root = cJSON_CreateObject();
    for (int i = 0; i < N_KEYS; i++) {
        const key_spec *k = &KEYS[i];
        const void *field = (const char *)cfg + k->offset;
        if (inside_section_off(cfg, k)) continue;
        switch (k->type) {
        case K_SECTION: break;
        case K_FLAG_SECTION:
            if (!*(const bool *)field) put(root, k->key, cJSON_CreateFalse());
            break;
        case K_INT: put(root, k->key, cJSON_CreateNumber(*(const int *)field)); break;
        case K_U64: put(root, k->key, cJSON_CreateNumber((double)*(const uint64_t *)field)); break;
        case K_DOUBLE: put(root, k->key, cJSON_CreateNumber(*(const double *)field)); break;
        case K_DOUBLE_AUTO: {
            double x = *(const double *)field;
            put(root, k->key, x > 0 ? cJSON_CreateNumber(x) : cJSON_CreateNull());
            break;
        }
        case K_BOOL: put(root, k->key, cJSON_CreateBool(*(const bool *)field)); break;
        case K_BOOL_COUNT: {
            int n = *(const int *)field;
            put(root, k->key, n == KEEL_CHECKPOINT_ALL ? cJSON_CreateTrue()
                              : n == 0                ? cJSON_CreateFalse()
                                                      : cJSON_CreateNumber(n));
            break;
        }
        case K_STRING: {
            const char *s = *(char *const *)field;
            put(root, k->key, s ? cJSON_CreateString(s) : cJSON_CreateNull());
            break;
        }
        case K_ENUM: put(root, k->key, cJSON_CreateString(k->names[*(const int *)field])); break;
        case K_ENUM_SET: {
            cJSON *a = cJSON_CreateArray();
            for (int j = 0; k->names[j]; j++)
                if (*(const unsigned *)field & (1u << j)) cJSON_AddItemToArray(a, cJSON_CreateString(k->names[j]));
            put(root, k->key, a);
            break;
        }
        case K_STRING_LIST: {
            cJSON *a = cJSON_CreateArray();
            for (char *const *s = *(char **const *)field; s && *s; s++)
                cJSON_AddItemToArray(a, cJSON_CreateString(*s));
            put(root, k->key, a);
            break;
        }
        case K_SOURCES: {
            const keel_data_sources *list = field;
            cJSON *a = cJSON_CreateArray();
            for (int j = 0; j < list->n; j++) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "path", list->v[j].path);
                cJSON_AddNumberToObject(o, "weight", list->v[j].weight);
                cJSON_AddItemToArray(a, o);
            }
            put(root, k->key, a);
            break;
        }
        }
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

void keel_config_print_keys(void) {
    keel_config d;
    keel_config_defaults(&d);
    printf("| key | type | default | meaning |\n|---|---|---|---|\n");
    for (int i = 0; i < N_KEYS; i++) {
        const key_spec *k = &KEYS[i];
        const void *field = (const char *)&d + k->offset;
        char def[64] = "";
        switch (k->type) {
        case K_SECTION: continue;
        case K_FLAG_SECTION: snprintf(def, sizeof def, "off"); break;
        case K_INT: snprintf(def, sizeof def, "%d", *(const int *)field); break;
        case K_U64: snprintf(def, sizeof def, "%llu", (unsigned long long)*(const uint64_t *)field); break;
        case K_DOUBLE: snprintf(def, sizeof def, "%g", *(const double *)field); break;
        case K_DOUBLE_AUTO:
            if (*(const double *)field > 0) snprintf(def, sizeof def, "%g", *(const double *)field);
            else snprintf(def, sizeof def, "null");
            break;
        case K_BOOL: snprintf(def, sizeof def, "%s", *(const bool *)field ? "true" : "false"); break;
        case K_BOOL_COUNT: keel_config_format_checkpointing(*(const int *)field, def, sizeof def); break;
        case K_STRING: {
            const char *v = *(char *const *)field;
            snprintf(def, sizeof def, "%s", v ? v : "none");
            break;
        }
        case K_ENUM: snprintf(def, sizeof def, "%s", k->names[*(const int *)field]); break;
        case K_ENUM_SET: format_set(*(const unsigned *)field, k->names, def, sizeof def); break;
        case K_STRING_LIST: case K_SOURCES: snprintf(def, sizeof def, "none"); break;
        }
        const char *type = k->type == K_FLAG_SECTION ? "object/false"
                           : k->type == K_BOOL       ? "bool"
                           : k->type == K_BOOL_COUNT ? "bool or count"
                                                     : type_name(k->type);
        if (strncmp(type, "a ", 2) == 0) type += 2;
        if (strncmp(type, "an ", 3) == 0) type += 3;
        printf("| `%s` | %s | %s | %s |\n", k->key, type, def, k->doc);
    }
    keel_config_free(&d);
}
