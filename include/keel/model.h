/* model: the Llama 2 architecture — parameter layout, forward, backward; fp32,
 * or with bf16 GEMMs (keel_model_options.bf16).
 *
 *     keel_model *m;
 *     keel_model_build(&cfg.model, B, &m);          // params, grads, activations
 *     keel_model_init_weights(m, seed);
 *     double loss_sum = keel_model_forward(m, tokens, NULL, B, 1.0f / (B * T)); // tokens (B, T+1)
 *     keel_model_backward(m);                        // grads += d(loss)/d(params)
 *     keel_model_free(m);
 *
 * Parameters live in one flat fp32 vector in the canonical order below, which
 * is also the order of summary.json's params_xxh3 and of FSDP units:
 *   unit 0      model.embed_tokens.weight (V, C)
 *   unit 1+l    model.layers.l.{input_layernorm (C), self_attn.q_proj (NH*HS, C),
 *               k_proj (NKV*HS, C), v_proj (NKV*HS, C), o_proj (C, NH*HS),
 *               post_attention_layernorm (C), mlp.gate_proj (F, C), mlp.up_proj (F, C),
 *               mlp.down_proj (C, F)}            for l = 0 .. L-1
 *   unit L+1    model.norm.weight (C), lm_head.weight (V, C) (absent when tied)
 * Names are Hugging Face LlamaForCausalLM's. With matrix units (fsdp.unit)
 * each block is 5 units instead: {input_layernorm, q, k, v}, {o,
 * post_attention_layernorm}, {gate}, {up}, {down}; the head is unit
 * n_units - 1. The canonical order is the same either way.
 */
#ifndef KEEL_MODEL_H
#define KEEL_MODEL_H

#include "keel/backend.h"
#include "keel/core.h"

typedef struct {
    char name[64];   /* Hugging Face parameter name */
    int unit;        /* 0 embedding, then the blocks' units, n_units - 1 head */
    int64_t offset;  /* in the flat parameter vector */
    int64_t rows, cols; /* (rows, cols) matrix, or (rows, 1) vector */
    bool is_norm_or_embedding; /* excluded from weight decay by default */
} keel_tensor_info;

#define KEEL_BLOCK_TENSORS 9
#define KEEL_BLOCK_MATRIX_UNITS 5

typedef struct keel_model_layout {
    keel_model_config cfg;
    int C, L, NH, NKV, HS, F, V, T;
    int n_tensors;
    keel_tensor_info *tensors;
    int units_per_block;   /* 1, or KEEL_BLOCK_MATRIX_UNITS with matrix units */
    int n_units;           /* L * units_per_block + 2 */
    int64_t *unit_offset;  /* (n_units) */
    int64_t *unit_size;    /* (n_units) parameters in each unit */
    int64_t n_params;
    /* on: this is an adapter set's layout (keel_lora_layout_init), not a model's */
    keel_lora_config lora;
    int *lora_a; /* (L * KEEL_LORA_TARGETS) in an adapter layout: the tensor index of block l's
                    target t's A (its B is the next), or -1 */
} keel_model_layout;

/* Where a parameter set comes from, range by range: writes canonical
 * parameters [begin, begin + len) to dst (an initialisation, a checkpoint's
 * files, a Hugging Face directory, a buffer). Streaming through one of these
 * keeps a whole model out of memory. */
typedef keel_status (*keel_param_source)(void *ctx, int64_t begin, int64_t len, float *dst);
/* The source of a full canonical vector in memory (ctx: the const float *). */
keel_status keel_params_from_buffer(void *params, int64_t begin, int64_t len, float *dst);

/* Llama 2's SwiGLU hidden size for this config. */
int keel_model_ffn_hidden(const keel_model_config *cfg);
/* ---- LoRA adapters (train.lora; docs/lora.md) -----------------------------
 * A targeted matrix W (out, in) of a block computes x Wᵀ + (alpha / r) ·
 * dropout(x) Aᵀ Bᵀ, with A (r, in) and B (out, r) trained and W frozen. The
 * adapters are a parameter set of their own with a layout like a model's:
 * tensors, offsets and units, unit u holding the adapters of the matrices in
 * the base's unit u (the embedding's and head's units are empty). Block l's
 * come in the block's order, A then B of each target, named as PEFT names
 * them without its "base_model.model." prefix:
 * "model.layers.l.self_attn.q_proj.lora_A.weight". */
/* The adapter layout of `base` for cfg (on). A rank above the smaller side of
 * a target is KEEL_ERR_INPUT with `why` naming the key, the target and the
 * largest rank that fits; nothing is printed. */
keel_status keel_lora_layout_init(keel_model_layout *lora, const keel_model_layout *base, const keel_lora_config *cfg,
                                  char *why, size_t why_n);
/* PEFT's initialisation of adapters [begin, begin + len): every A uniform in
 * ±1/sqrt(in) (kaiming_uniform_ with a = sqrt(5)), every B zero (a new
 * adapter changes nothing). Counter-based like keel_model_init_range: any
 * slice on its own, the same for any world size. */
void keel_lora_init_range(const keel_model_layout *lora, uint64_t seed, int64_t begin, int64_t len, float *out);
/* Merge unit u's adapters into the base: W += (alpha / r) · B · A for each
 * target in the unit. base_unit is the base's unit u (its canonical
 * parameters from unit_offset[u]), lora_unit the adapters' unit u; both in
 * host memory (plain loops on this thread: r is small, and tools without
 * keel's kernels — the fuzz harnesses' parsers — link it). */
void keel_lora_merge_unit(const keel_model_layout *base, const keel_model_layout *lora, int u, float *base_unit,
                          const float *lora_unit);
/* Build the layout of cfg (finalized config). Free with keel_model_layout_free. */
void keel_model_layout_init(keel_model_layout *lay, const keel_model_config *cfg);
/* The same with a unit granularity: blocks (keel_model_layout_init) or
 * matrices. Tensors, offsets and names do not change, only units. */
void keel_model_layout_init_units(keel_model_layout *lay, const keel_model_config *cfg, keel_unit_kind kind);
/* Block l's first unit. */
static inline int keel_model_block_unit(const keel_model_layout *lay, int l) {
    return 1 + l * lay->units_per_block;
}
void keel_model_layout_free(keel_model_layout *lay);
/* Training FLOPs per token (forward + backward): 6 × matmul params +
 * 12 × L × C × T for attention (PaLM's convention, no causal discount). */
double keel_model_flops_per_token(const keel_model_layout *lay);
/* Per-token FLOPs of each unit's forward and backward (n_units each) as keel
 * computes them. A matrix: 2 x its size forward and twice that backward —
 * under LoRA (lora: the adapters' layout, else NULL) once, the input's
 * gradient and not the frozen weight's; attention 4 C T forward, 8 C T
 * backward; an adapter's A 2 forward and 6 backward (its z recomputed), B 2
 * and 4, per element. */
void keel_model_unit_flops(const keel_model_layout *lay, const keel_model_layout *lora, double *fwd, double *bwd);
/* Their sum: training FLOPs per token, keel_model_flops_per_token's without
 * LoRA; with it 4 x matmul params + 12 L C T + 8 |A| + 6 |B|. */
double keel_model_train_flops_per_token(const keel_model_layout *lay, const keel_model_layout *lora);
typedef struct keel_model keel_model;

/* Allocate parameters, gradients and activations for micro-batches of B
 * sequences of cfg->max_seq_len tokens. Caller owns *out. */
keel_status keel_model_build(const keel_model_config *cfg, int B, keel_model **out);
typedef struct {
    /* Allocate the flat parameter and gradient vectors. Without them every
     * unit's buffers must be set with keel_model_set_unit_buffers (FSDP). */
    bool own_params;
    /* Activation checkpointing of the first checkpoint_blocks blocks (0
     * none, negative or >= L every block): they keep only their input and
     * share one set of activations, which the last of them leaves in place
     * for its backward; backward recomputes the others' forward first.
     * Gradients are bit-identical; activation memory drops from L blocks'
     * worth to L - K + 1 blocks' plus K inputs. */
    int checkpoint_blocks;
    /* bf16 GEMMs (fsdp.mixed_precision "bf16"): weights are read as bf16 and
     * each GEMM's fp32 input is rounded to bf16; products accumulate in fp32,
     * and activations, gradients and everything else stay fp32. Unit buffers
     * are then set with keel_model_set_unit_bf16; a model with its own
     * parameters keeps a bf16 copy of them (keel_model_params_changed). */
    bool bf16;
    /* What one FSDP unit holds (fsdp.unit): a block, or one of its matrices. */
    keel_unit_kind unit;
    /* Where the parameters, gradients and activations live and the kernels
     * run (keel/backend.h); NULL is the CPU backend. Unit buffers given to
     * the model and the tokens' copies are then that backend's memory. */
    const keel_backend *backend;
    /* Rows of logits the output head computes at a time (0: as many as fit
     * 256 MiB). Forward keeps the last chunk's gradient; backward recomputes
     * the others' logits, so (N, V) never exists whole. */
    int head_rows;
    /* Document masking (data.document_mask): a forward given token flags
     * keeps each position's attention inside its document (from the last
     * KEEL_TOKEN_DOC_START at or before it in the row); positions keep their
     * row's RoPE positions. Needs a backend with document_masking. */
    bool document_mask;
    /* LoRA adapters on a frozen base (NULL or .on false: none). The base
     * gets no gradients: a model with its own parameters allocates none for
     * it, and a unit given no gradient buffer is frozen. The adapters are
     * keel_model_lora_layout's set (keel_model_lora_params, or
     * keel_model_set_unit_lora), fp32 in a bf16 model too. A rank that does
     * not fit a target makes keel_model_build_with KEEL_ERR_INPUT (printed). */
    const keel_lora_config *lora;
} keel_model_options;
/* Activation bytes (and bf16 GEMM scratch; one chunk of logits) for a micro-batch of B sequences:
 * exactly what keel_model_build_with allocates for them. Attention keeps its
 * log-sum-exp (B, NH, T) per layer here, not the (T, T) probabilities; its
 * per-thread tiles are the kernels' own (keel_attention_workspace_bytes). */
int64_t keel_model_activation_bytes(const keel_model_layout *lay, int B,
                                    const keel_model_options *opts);
/* How many blocks, from the first, backward recomputes at checkpoint_blocks
 * K: K - 1 (the last checkpointed block's activations are still in place). */
int keel_model_recomputed_blocks(const keel_model_layout *lay, int checkpoint_blocks);
keel_status keel_model_build_with(const keel_model_config *cfg, int B,
                                  const keel_model_options *opts, keel_model **out);
void keel_model_free(keel_model *m);
const keel_model_layout *keel_model_get_layout(const keel_model *m);
/* Where its tensors live and its kernels run (the CPU backend when none was given). */
const keel_backend *keel_model_backend(const keel_model *m);
/* (n_params) in the backend's memory (host memory on the CPU backend), NULL
 * without own parameters. */
float *keel_model_params(keel_model *m);
float *keel_model_grads(keel_model *m); /* NULL with LoRA: the base is frozen */
/* N(0, 0.02) matrices, ones for norms; each tensor from its own stream of
 * `seed`, so any slice can be regenerated independently. */
void keel_model_init_weights(keel_model *m, uint64_t seed);
/* The same initialisation into any full canonical vector (n_params). */
void keel_model_init_params(const keel_model_layout *lay, uint64_t seed, float *params);
/* Canonical parameters [begin, begin + len) of that initialisation into out
 * (len values): norm weights 1, every other element N(0, 0.02^2) from a
 * counter-based generator keyed by (seed, tensor, element), so a rank fills
 * only its shard and gets the same values for any world size. */
void keel_model_init_range(const keel_model_layout *lay, uint64_t seed, int64_t begin, int64_t len, float *out);
/* Zero the trained set's gradients: the model's, or with LoRA the adapters'. */
void keel_model_zero_grads(keel_model *m);

/* Where unit u's parameters are read and its gradients written during
 * forward/backward. By default they point into keel_model_params/grads at
 * the unit's offset; FSDP points them at gathered unit buffers (same internal
 * layout as the unit's slice of the canonical vector). Not owned. */
void keel_model_set_unit_buffers(keel_model *m, int unit, float *params, float *grads);
/* The same for a bf16 model: parameters in bf16 (same layout), fp32 gradients. */
void keel_model_set_unit_bf16(keel_model *m, int unit, keel_bf16 *params, float *grads);
bool keel_model_is_bf16(const keel_model *m);
/* With LoRA: the adapters' layout, their parameters and gradients (own
 * parameters; NULL otherwise), where unit u's adapters are read and their
 * gradients written (like keel_model_set_unit_buffers; a NULL grads while a
 * forward alone runs), and the dropout keys of the next training forward's
 * sequences, one per sequence (n = 0: none; needed when dropout > 0: the
 * trainer derives them from the seed, the step and the sequence's place in the
 * data, so a resumed or resharded run draws the same masks). Without LoRA
 * the layout is NULL. */
const keel_model_layout *keel_model_lora_layout(const keel_model *m);
float *keel_model_lora_params(keel_model *m);
float *keel_model_lora_grads(keel_model *m);
void keel_model_set_unit_lora(keel_model *m, int unit, float *params, float *grads);
void keel_model_set_dropout_keys(keel_model *m, const uint64_t *keys, int n);
/* A bf16 model with its own parameters: they changed (an optimizer step), so
 * the next forward refreshes their bf16 copy. */
void keel_model_params_changed(keel_model *m);

/* Called around each unit in compute order — forward: 0, 1, ..., head;
 * backward: head, ..., 1, 0, and with checkpoint_blocks each recomputed
 * block's units (keel_model_recomputed_blocks) run forward again (before_forward/after_forward) just before their
 * backward — so FSDP can gather a unit before it is used, prefetch, free it
 * after, and reduce-scatter its gradients as soon as they exist. `next` is
 * the next unit other than `unit` the model will use (-1: none), except in
 * after_forward, where next == unit says that unit's backward follows at
 * once (keep it). Any callback may be NULL. With tied embeddings the head
 * also reads unit 0's parameters and adds to unit 0's gradients. */
typedef void (*keel_model_hook_fn)(void *ctx, int unit, int next);
typedef struct {
    void *ctx;
    keel_model_hook_fn before_forward, after_forward, before_backward, after_backward;
} keel_model_hooks;
void keel_model_set_hooks(keel_model *m, const keel_model_hooks *hooks);
/* Called after every unit's forward and backward (recomputation included)
 * and after every matrix product inside them, with "forward" or "backward":
 * the trainer's heartbeat inside a step, so the slowest wait between two
 * beats is one product, not a 7B-width block's backward. NULL turns it off. */
typedef void (*keel_model_progress_fn)(void *ctx, const char *doing);
void keel_model_set_progress(keel_model *m, keel_model_progress_fn fn, void *ctx);

/* Forward over tokens (n_seqs, T+1), n_seqs <= B: inputs are [0,T), targets
 * [1,T+1). Returns the summed cross-entropy over n_seqs*T positions. flags
 * (n_seqs, T+1) of KEEL_TOKEN_* bits, or NULL: a target without TRAIN adds no
 * loss and no gradient (a chat prompt's tokens); with document masking on,
 * DOC_START bits keep documents apart. When grad_scale != 0 a backward
 * follows, with the loss's gradient times grad_scale (usually 1 / targets
 * trained on per optimizer step). */
double keel_model_forward(keel_model *m, const int32_t *tokens, const uint8_t *flags, int n_seqs,
                          float grad_scale);
/* Accumulate parameter gradients into the grads vector. */
void keel_model_backward(keel_model *m);

/* ---- generation: the forward against a KV cache (decode.c) ---------------
 *
 *     keel_decoder *d;
 *     keel_decoder_build(&cfg, params, &(keel_decoder_options){.max_seqs = 8, .max_len = 2048,
 *                                                            .max_rows = 512}, &d);
 *     // a prompt of 5 tokens as sequence 0, then logits of its last row
 *     keel_decoder_step(d, ids, (int32_t[]){0, 0, 0, 0, 0}, (int32_t[]){0, 1, 2, 3, 4}, 5,
 *                       (int32_t[]){4}, 1, logits);
 *
 * A step runs N rows at once, row i being token tokens[i] of sequence seq[i]
 * at position pos[i]; positions 0..pos[i]-1 of that sequence must have been
 * run by earlier steps or earlier rows of this one (a prompt in chunks, then
 * a token at a time, sequences in any mix). Running a sequence from position
 * 0 again starts it afresh. fp32, or bf16 GEMMs (weights in bf16, each
 * GEMM's input rounded to bf16, fp32 sums) as training's bf16, and the KV
 * cache in bf16 (keys and values rounded as training's bf16 attention rounds
 * them; scores, softmax and sums fp32). */
typedef struct keel_decoder keel_decoder;
typedef struct {
    const keel_backend *backend; /* NULL: the CPU */
    bool bf16;
    int max_seqs; /* sequences the cache holds */
    int max_len;  /* positions per sequence, at most the model's max_seq_len */
    int max_rows; /* rows one step takes */
} keel_decoder_options;
/* params: the model's canonical fp32 vector in host memory, read in place on
 * a host-memory backend in fp32 (it must then outlive the decoder), else
 * copied. A backend without generation kernels: one line, KEEL_ERR_INPUT. */
keel_status keel_decoder_build(const keel_model_config *cfg, const float *params, const keel_decoder_options *opt,
                               keel_decoder **out);
const keel_model_layout *keel_decoder_layout(const keel_decoder *d);
/* Run n rows; logits (n_logits, V) on the host get the rows logit_rows
 * (each < n) in that order, as fp32 (unnormalised). */
void keel_decoder_step(keel_decoder *d, const int32_t *tokens, const int32_t *seq, const int32_t *pos, int n,
                       const int32_t *logit_rows, int n_logits, float *logits);
void keel_decoder_free(keel_decoder *d);

#endif
