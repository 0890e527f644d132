/* hf: Hugging Face checkpoints — keel parameters as a LlamaForCausalLM
 * directory (config.json + safetensors), and back.
 *
 *     keel_hf_export(&cfg.model, params, "tok.model", "out/hf", 0);  // one file
 *     keel_model_config mc;
 *     float *params;
 *     if (keel_hf_import("out/hf", &mc, &params) != KEEL_OK) return 2;
 *     ...
 *     keel_free(params);
 *
 * Export writes, into out_dir:
 *   config.json             LlamaForCausalLM config (float32, silu, rope_theta,
 *                           tie_word_embeddings, ...) plus keel_multiple_of and
 *                           keel_ffn_dim_multiplier so the import restores the
 *                           exact keel config (transformers keeps unknown keys)
 *   model.safetensors       every tensor of keel/model.h under its Hugging Face
 *                           name, fp32, in canonical order; lm_head.weight is
 *                           absent when the embeddings are tied (as transformers
 *                           saves it) — or, when the tensors' bytes exceed
 *                           max_shard_bytes, model-0000K-of-0000N.safetensors +
 *                           model.safetensors.index.json (a tensor is never
 *                           split; one larger than the limit gets its own file)
 *   tokenizer.model         a copy of the SentencePiece model, when given (its
 *                           vocabulary must match), + tokenizer_config.json
 * out_dir must not exist (it is then written as out_dir.tmp.PID and renamed
 * into place once every file is fsync'd) or be an empty directory (each file
 * is then written as tmp + fsync + rename). Tensor data is written straight
 * from `params`, never copied.
 *
 * Import reads config.json (model_type "llama"; rope_theta top-level or in
 * rope_parameters; rope scaling, biases, a head_dim other than
 * hidden_size / num_attention_heads and activations other than silu are
 * rejected), and model.safetensors or model.safetensors.index.json and its
 * shards. Tensors may be F32, F16 or BF16 (converted to fp32 exactly); extra
 * tensors (rotary_emb.inv_freq, lm_head.weight of a tied model) are ignored.
 * max_seq_len is max_position_embeddings. intermediate_size becomes
 * multiple_of / ffn_dim_multiplier that reproduce it under
 * keel_model_ffn_hidden. Every problem — missing file or key, bad JSON,
 * missing tensor, wrong shape, unsupported dtype, truncated file — is one
 * line naming the file (and the tensor) and returns KEEL_ERR_INPUT.
 *
 * Files are little-endian, as is every host keel runs on.
 */
#ifndef KEEL_HF_H
#define KEEL_HF_H

#include "keel/core.h"

/* Export cfg's parameters (the canonical flat fp32 vector of keel/model.h,
 * keel_model_layout_init(cfg).n_params values) as a Hugging Face directory.
 * tokenizer_model_path may be NULL; max_shard_bytes 0 = one file. */
keel_status keel_hf_export(const keel_model_config *cfg, const float *params,
                           const char *tokenizer_model_path, const char *out_dir,
                           int64_t max_shard_bytes);

/* Import a Hugging Face LlamaForCausalLM directory: *cfg_out is a finalized
 * model config (it passes keel's config checks), *params_out a new canonical
 * fp32 vector (free with keel_free). On error both are left untouched. */
keel_status keel_hf_import(const char *hf_dir, keel_model_config *cfg_out, float **params_out);

/* The (multiple_of, ffn_dim_multiplier) keel uses for a Hugging Face
 * intermediate_size at hidden size dim: keel_model_ffn_hidden of the result
 * is exactly intermediate_size. false if no such pair is in keel's ranges. */
bool keel_hf_ffn_params(int dim, int64_t intermediate_size, int *multiple_of,
                        double *ffn_dim_multiplier);

#endif
