/* hf: Hugging Face checkpoints — keel parameters as a LlamaForCausalLM
 * directory (config.json + safetensors, tokenizer, generation_config.json),
 * and back.
 *
 *     keel_hf_export(&cfg.model, keel_params_from_buffer, params, "tok.model", NULL, "out/hf", 0);
 *     keel_model_config mc;
 *     keel_hf_reader *r;
 *     if (keel_hf_open("out/hf", &mc, &r) != KEEL_OK) return 2;
 *     keel_hf_read(r, begin, len, dst);     // a keel_param_source: tensor by tensor
 *     keel_hf_close(r);
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
 *                           vocabulary must fit), + tokenizer_config.json;
 *                           a tokenizer.json is copied as tokenizer.json with
 *                           the tokenizer_config.json beside it (or a minimal
 *                           one), and its BOS/EOS (null when it has none) go
 *                           into config.json; a vocabulary larger than the
 *                           model's is refused, a smaller one (a padded
 *                           embedding) exported with a warning
 *   tokenizer_config.json   for a tokenizer.model: the one beside it when the
 *                           file is named tokenizer.model (an import's), else
 *                           a minimal LlamaTokenizer one
 *   generation_config.json  the one given, byte for byte (its bos/eos ids go
 *                           into config.json when there is no tokenizer), or
 *                           {"_from_model_config": true, "bos_token_id",
 *                           "eos_token_id"} from config.json's ids, as
 *                           transformers' GenerationConfig.from_model_config
 *                           saves it (a null id left out)
 * out_dir must not exist (it is then written as out_dir.tmp.PID and renamed
 * into place once every file is fsync'd) or be an empty directory (each file
 * is then written as tmp + fsync + rename). Tensors are read from the source
 * one at a time and streamed into the files: the export never holds more
 * than the largest tensor.
 *
 * Import reads config.json (model_type "llama"; rope_theta top-level or in
 * rope_parameters; rope scalings other than llama3, biases, a head_dim other than
 * hidden_size / num_attention_heads and activations other than silu are
 * rejected), and model.safetensors or model.safetensors.index.json and its
 * shards. Tensors may be F32, F16 or BF16 (converted to fp32 exactly); extra
 * tensors (rotary_emb.inv_freq, lm_head.weight of a tied model) are ignored.
 * max_seq_len is max_position_embeddings. intermediate_size becomes
 * multiple_of / ffn_dim_multiplier that reproduce it under
 * keel_model_ffn_hidden. Every problem — missing file or key, bad JSON,
 * missing tensor, wrong shape, unsupported dtype, truncated file — is one
 * line naming the file (and the tensor) and returns KEEL_ERR_INPUT.
 * keel_hf_read_carried reads the files an import carries beside the weights
 * (the tokenizer and generation_config.json), checked the same way.
 *
 * Files are little-endian, as is every host keel runs on.
 */
#ifndef KEEL_HF_H
#define KEEL_HF_H

#include "keel/model.h"

/* Export cfg's parameters, read tensor by tensor from a source (canonical
 * order of keel/model.h), as a Hugging Face directory. tokenizer_model_path
 * (a .model or tokenizer.json) and generation_config_path (copied as it is,
 * after a check: a JSON object whose bos/eos/pad ids are below vocab_size)
 * may be NULL; max_shard_bytes 0 = one file. Both files are read and checked
 * before anything is written. */
keel_status keel_hf_export(const keel_model_config *cfg, keel_param_source read, void *ctx,
                           const char *tokenizer_model_path, const char *generation_config_path,
                           const char *out_dir, int64_t max_shard_bytes);

/* Export LoRA adapters (lora: their layout, keel_lora_layout_init; read: a
 * source over it) as Hugging Face PEFT saves them: adapter_model.safetensors
 * (F32, PEFT's tensor names) and adapter_config.json (r, lora_alpha,
 * lora_dropout, target_modules; base, when given, as
 * base_model_name_or_path). out_dir is new or empty, as keel_hf_export's. */
keel_status keel_hf_export_peft(const keel_model_layout *lora, keel_param_source read, void *ctx, const char *base,
                                const char *out_dir);

/* An adapter_config.json's text[0, len) (path names it in messages) as a
 * LoRA config: peft_type LORA, r, lora_alpha, lora_dropout, target_modules
 * among keel's seven; what keel does not do (DoRA, rsLoRA, fan_in_fan_out,
 * biases, modules_to_save, layers_to_transform, rank or alpha patterns, a
 * pattern for the targets) is one line naming the key. The fuzz harness's
 * entry (tests/fuzz/fuzz_hf.c). */
keel_status keel_hf_parse_peft_config(const char *text, size_t len, const char *path, keel_lora_config *out);
/* The adapters of dir/adapter_model.safetensors (PEFT's names, F32, F16 or
 * BF16) into params, in lora's layout: a tensor missing, or of another shape
 * (an adapter of another model), is one line naming it. */
keel_status keel_hf_read_peft(const char *dir, const keel_model_layout *lora, float *params);

/* A Hugging Face LlamaForCausalLM directory opened for reading: open checks
 * config.json (*cfg_out becomes a finalized model config) and finds the
 * safetensors files; keel_hf_read is a keel_param_source over it (ctx: the
 * reader) that reads tensors as they are asked for — a range inside one
 * tensor or a run of whole tensors — so nothing larger than a tensor is ever
 * read at once. */
typedef struct keel_hf_reader keel_hf_reader;
keel_status keel_hf_open(const char *hf_dir, keel_model_config *cfg_out, keel_hf_reader **out);
/* What keel_hf_open does with config.json's text[0, len) (path names it in
 * messages): the finalized model config it describes, or one line naming the
 * key. The fuzz harness's entry (tests/fuzz/fuzz_hf.c). */
keel_status keel_hf_parse_config(const char *text, size_t len, const char *path, keel_model_config *out);
keel_status keel_hf_read(void *reader, int64_t begin, int64_t len, float *dst);
void keel_hf_close(keel_hf_reader *r);

/* The files of a Hugging Face directory that an import carries into its
 * checkpoint, read whole: the tokenizer — tokenizer.json (+ the
 * tokenizer_config.json beside it, if there), else tokenizer.model (+
 * tokenizer_config.json, if there) — loaded from these bytes by keel's loader
 * and with no id at or past cfg->vocab_size (fewer tokens: a padded
 * embedding), and generation_config.json (a JSON object whose bos/eos/pad
 * ids are below vocab_size). Files that are absent are left out, quietly (the
 * caller says what is missing once the import has succeeded); one that is
 * unreadable or fails its check is one line naming it and the fix
 * (KEEL_ERR_INPUT, *out empty). */
typedef struct {
    const char *name; /* a string literal: "tokenizer.json", "tokenizer_config.json", ... */
    char *data;       /* the file's bytes (keel_hf_carried_free frees them) */
    size_t bytes;
} keel_hf_file;
typedef struct {
    keel_hf_file files[3];
    int n_files;
    const char *tokenizer; /* the tokenizer's name among files, or NULL when there is none */
    int tokenizer_tokens;  /* its vocabulary size (<= vocab_size), 0 when there is none */
} keel_hf_carried;
keel_status keel_hf_read_carried(const char *hf_dir, const keel_model_config *cfg, keel_hf_carried *out);
/* generation_config.json's text[0, len) (path names it in the one error
 * line): a JSON object whose bos/eos/pad ids are below V (eos_token_id an id
 * or a list of at most KEEL_HF_MAX_EOS). *bos its bos id (-1 when none),
 * eos[0, *n_eos) its eos ids. The fuzz harness's entry (fuzz_hf.c, mode 5). */
#define KEEL_HF_MAX_EOS 16
keel_status keel_hf_generation_config(const char *text, size_t len, const char *path, int V, int *bos,
                                      int32_t *eos, int *n_eos);
void keel_hf_carried_free(keel_hf_carried *c);

/* The whole model in memory (tests, small models): open, every tensor into a
 * new canonical fp32 vector (*params_out, keel_free), close. On error both
 * outputs are left untouched. */
keel_status keel_hf_import(const char *hf_dir, keel_model_config *cfg_out, float **params_out);

/* The (multiple_of, ffn_dim_multiplier) keel uses for a Hugging Face
 * intermediate_size at hidden size dim: keel_model_ffn_hidden of the result
 * is exactly intermediate_size. false if no such pair is in keel's ranges. */
bool keel_hf_ffn_params(int dim, int64_t intermediate_size, int *multiple_of,
                        double *ffn_dim_multiplier);

#endif
