/* data: token-shard files, world-size-independent sample order, the synthetic
 * source, and `keel data prepare`. See docs/checkpoints.md, "File formats".
 *
 *     keel_data *d;
 *     if (keel_data_open(&cfg.data, "train", T, V, cfg.train.seed, &d) != KEEL_OK) return 2;
 *     int32_t *tokens = keel_xmalloc(B * (T + 1) * sizeof *tokens, "batch");
 *     // rank r's micro-batch m of step s; G = global batch in sequences
 *     keel_data_fetch(d, s, G, first_of(r, m), B, tokens, NULL);  // rows: T inputs + 1 target
 *     keel_data_close(d);
 */
#ifndef KEEL_DATA_H
#define KEEL_DATA_H

#include <inttypes.h>

#include "keel/core.h"
#include "keel/tokenizer.h"

/* ---- token-shard file (one file) ---------------------------------------- */

#define KEEL_SHARD_MAGIC "KEELTOK1"  /* 8 bytes */
#define KEEL_SHARD_VERSION 2          /* the newest read; a shard without bitmaps is written as 1 */
#define KEEL_SHARD_HEADER_BYTES 64
#define KEEL_SHARD_FLAG_LOSS_MASK 1u  /* version 2 bitmaps after the ids: which tokens train as targets, */
#define KEEL_SHARD_FLAG_DOC_STARTS 2u /* which start a document (data.document_mask) */
/* (a token's flags, KEEL_TOKEN_*, are core's: the model reads them too) */

typedef struct keel_shard keel_shard;

/* Write tokens to `path` atomically: a temporary file in the same directory,
 * fsync, rename, fsync of the directory; on failure the old file (if any) is
 * untouched and no temporary is left. Ids are stored as uint16 when
 * vocab_size <= 65536, else uint32. stored (KEEL_SHARD_FLAG_*) names the
 * bitmaps to write from flags (n_tokens bytes of KEEL_TOKEN_* bits; NULL when
 * stored is 0: a version 1 shard, every target trained, no document starts).
 * Returns KEEL_ERR_INPUT (nothing written) if an id is outside
 * [0, vocab_size), KEEL_ERR_IO if the system fails. */
keel_status keel_shard_write(const char *path, const int32_t *tokens, const uint8_t *flags, uint32_t stored,
                             uint64_t n_tokens, uint32_t vocab_size);
/* mmap and verify (magic, version, size, checksum, every id < vocab_size of
 * the header). Errors are one line naming the file and the fix
 * (KEEL_ERR_INPUT). The caller owns *out and frees it with keel_shard_close. */
keel_status keel_shard_open(const char *path, keel_shard **out);
/* The same checks over a shard already in memory, bytes[0, len) (not copied:
 * it must outlive *out), `name` standing for the file in messages.
 * keel_shard_open maps the file and checks it with this (fuzzed by
 * tests/fuzz/fuzz_token_shard.c). A path that is not a regular file (a FIFO,
 * a directory) is refused by keel_shard_open without blocking. */
keel_status keel_shard_from_buffer(const void *bytes, size_t len, const char *name, keel_shard **out);
void keel_shard_close(keel_shard *s);
uint64_t keel_shard_n_tokens(const keel_shard *s);
uint32_t keel_shard_vocab_size(const keel_shard *s);
/* Copy tokens [first, first + n) widened to int32. */
void keel_shard_read(const keel_shard *s, uint64_t first, uint64_t n, int32_t *out);
/* The bitmaps the shard stores (KEEL_SHARD_FLAG_*), and the flags of tokens
 * [first, first + n) as KEEL_TOKEN_* bytes: TRAIN from the loss mask (set
 * for every token without one), DOC_START from the document starts (clear
 * for every token without them). */
uint32_t keel_shard_stored(const keel_shard *s);
void keel_shard_read_flags(const keel_shard *s, uint64_t first, uint64_t n, uint8_t *out);
/* Shard files of a prepared directory are named "<split>-NNNNN.bin" (index
 * zero-padded to 5 digits, more when needed). True if `name` is one of
 * `split`'s, with its index in *index. */
#define KEEL_SHARD_NAME_FMT "%s-%05" PRIu64 ".bin"
bool keel_shard_name_parse(const char *name, const char *split, uint64_t *index);

/* ---- a split of a dataset, in training order ------------------------------ */

typedef struct keel_data keel_data;

/* Open split "train" or "val" of cfg (a prepared directory, a single shard file
 * used as "train", or the synthetic source) for sequences of seq_len tokens
 * (+1 for the target). vocab_size is the model's: any mismatch with the data
 * (or with cfg->tokenizer) is an input error. seed drives the shuffle. For
 * "val" with no val split, *out = NULL and KEEL_OK. The caller owns *out
 * (keel_data_close).
 *
 * The synthetic source is an infinite, learnable stream: tokens in [0, V_s)
 * (V_s = data.synthetic.vocab, 0 = min(vocab_size, 1024)); each token has
 * data.synthetic.branching distinct successors fixed by data.synthetic.seed;
 * sample g starts at a hashed token and each next token is a hashed choice
 * among the current one's successors, so the best loss is ln(branching).
 * Train and val walk the same chain along different paths. */
keel_status keel_data_open(const keel_data_config *cfg, const char *split, int seq_len,
                           int vocab_size, uint64_t seed, keel_data **out);
/* Open one shard file or prepared directory directly (for `keel eval --data`). */
keel_status keel_data_open_path(const char *path, const char *split, int seq_len, int vocab_size,
                                uint64_t seed, keel_data **out);
void keel_data_close(keel_data *d);
/* Number of distinct samples in one epoch (synthetic: UINT64_MAX). */
uint64_t keel_data_n_samples(const keel_data *d);

/* Global sample order (DESIGN §4): step s of a run with global batch G
 * sequences consumes global positions [s*G, (s+1)*G) of a seeded permutation
 * of the samples, reshuffled each epoch. Fetch positions
 * [s*G + first, s*G + first + n) into out (n rows of seq_len + 1 tokens);
 * first + n <= G. Sample i is stream tokens [i*T, i*T + T + 1). The result
 * depends only on (seed, step, G, position), never on how [0, G) is split
 * into ranks or micro-batches. Not thread-safe for one d (it caches the
 * current epoch's permutation: 8 bytes per sample). */
void keel_data_fetch(keel_data *d, uint64_t step, uint64_t global_batch, uint64_t first,
                     int n, int32_t *out, uint8_t *flags);
/* flags (n rows of seq_len + 1, may be NULL) receives the same tokens'
 * KEEL_TOKEN_* bytes: TRAIN where the token is trained on as a target (all
 * of them without a loss mask; a chat prompt's are not), DOC_START where a
 * document starts (none without document starts). keel_data_has_mask: some
 * shard of d has a loss mask (so a trainer needs to read it);
 * keel_data_has_doc_starts: every shard has document starts (what
 * data.document_mask needs). */
bool keel_data_has_mask(const keel_data *d);
bool keel_data_has_doc_starts(const keel_data *d);
/* Targets trained on in fetched rows (flags: rows of seq_len + 1; a row's
 * targets are its positions 1..seq_len), and in the whole of step `step`
 * (global_batch rows; G*T without a mask): the loss's divisor, the same on
 * every rank without a collective. */
uint64_t keel_data_targets_in(const uint8_t *flags, int rows, int seq_len);
uint64_t keel_data_step_targets(keel_data *d, uint64_t step, uint64_t global_batch);

/* A mixture (data.sources): its sources (0 for one dataset) in config order
 * (for val: those with a val split), and how many of step `step`'s
 * global_batch rows each draws (added to rows[i]). */
int keel_data_n_sources(const keel_data *d);
const char *keel_data_source_path(const keel_data *d, int i);
double keel_data_source_weight(const keel_data *d, int i);
void keel_data_count_sources(keel_data *d, uint64_t step, uint64_t global_batch, uint64_t *rows);

/* `keel data prepare`: tokenize text files into DIR/train-NNNNN.bin and
 * DIR/val-NNNNN.bin and print the token counts of each split, the split and
 * the speed (MB/s of text).
 *
 * Inputs: files (.jsonl and .json are JSON Lines, .parquet Apache Parquet,
 * anything else text; .gz and .zst are decompressed as they are read, and a
 * .parquet.gz refused: Parquet compresses its own pages), directories
 * (their .txt, .jsonl, .json and .parquet files and the .gz/.zst of those,
 * recursively, in byte-wise sorted path order) and glob patterns (expanded
 * here, sorted); a pipe is text.
 *
 * A document is a block of non-blank lines (blank = empty or only spaces,
 * tabs, CRs); each file ends a document. In JSON Lines each record (one JSON
 * object a line) is one document: the string at text_key, split at its "\n"s
 * into lines handled as a text file's, except that its blank lines do not end
 * it; a record with no non-blank line is skipped (and counted). So records
 * holding a text file's documents prepare into the same shards as the text
 * file. In Parquet each row of the top-level string column `column` (a
 * BYTE_ARRAY of logical type STRING, or none) is one document, as a record's
 * text is; null rows are skipped (and counted) too; the pages are read by
 * keel's own reader (data/parquet.h: uncompressed, SNAPPY, GZIP, ZSTD; PLAIN,
 * dictionary and delta encodings; v1 and v2 pages). Bad input (a malformed
 * record, a record that is not an object or has no string at text_key, a
 * truncated or corrupt .gz/.zst, a JSON array, a Parquet file without the
 * column or whose column is not a string, with another codec, truncated or
 * corrupt, a directory without inputs, a pattern without a match, and with
 * strict_utf8 text that is not valid UTF-8) is KEEL_ERR_INPUT with one line
 * naming the file (and line, or row, and byte) and the fix; nothing is
 * written. Without strict_utf8 invalid UTF-8 goes to the tokenizer as it is.
 *
 * Each line is encoded on its own (as `spm_encode` does) and a document's
 * tokens are BOS + lines + EOS, where BOS and EOS are added only if the
 * tokenizer defines them. A document is cut
 * into chunks at line ends: a chunk ends after the line that brings it to
 * 65536 tokens or more (BOS in the first chunk, EOS in the last), so a
 * shorter document is one chunk.
 *
 * Split: each chunk goes whole to val when XXH3-64, seeded with split_seed,
 * of its text — its lines without their line ends, each followed by "\n" —
 * read as a fraction of 2^64 is below val_fraction, else to train
 * (val_fraction 0 = no val files). The coin depends on the chunk's text
 * alone: not on the order or the file layout of the inputs, nor on the
 * thread count, so val documents are an unbiased sample (val's token share
 * is val_fraction in expectation), identical documents share a split, and a
 * chunk's cut points depend only on its document and the tokenizer. Each
 * split's stream keeps the input order.
 *
 * Chat (format "chat", with chat_template "llama3" or "llama2"; see
 * docs/data.md, "Chat fine-tuning"): every input is JSON Lines (a file named
 * .txt is refused) and each record one conversation, "messages": an optional
 * system message first, then user and assistant in turn from the user,
 * ending with the assistant, each {"role", "content": string}. It is
 * rendered as the model's Hugging Face chat template renders it and encoded
 * to the ids of transformers' apply_chat_template with the same tokenizer
 * (the template's special tokens must be the tokenizer's: a one-line error
 * names a missing one and the file). It is one document: no BOS/EOS beyond
 * the template's, never cut into chunks, whole to train or val by the hash of
 * its rendered text (special tokens as text, then "\n"). The shards carry a
 * loss mask (version 2) that is 1 on the assistant's answers and the token
 * ending each (<|eot_id|>, </s>; llama2: with the spaces around the answer),
 * 0 elsewhere; the summary prints the share trained on. A record that is not
 * such a conversation is KEEL_ERR_INPUT naming file:line and the fix. Without
 * format "chat" nothing of this applies and the shards have no mask.
 * Every shard marks where its documents start (KEEL_SHARD_FLAG_DOC_STARTS):
 * each chunk's first token (a conversation's, in chat), for
 * data.document_mask.
 *
 * threads encode lines in blocks in parallel while the caller's thread
 * writes; the files are bit-identical for any thread count. max_tokens stops
 * the reading at the end of the first document that brings the tokens
 * written to max_tokens or more. On a terminal, stderr shows the progress
 * about once a second (documents, MB of the inputs read as stored, MB/s, the
 * time left).
 * Refuses an out_dir that already holds shards unless force; with force the
 * old shards of both splits are replaced. */
#define KEEL_PREPARE_MAX_THREADS 256
typedef struct {
    const char *model_path;
    const char *const *inputs;
    int n_inputs;
    const char *out_dir;
    double val_fraction;      /* in [0, 1) */
    uint64_t split_seed;      /* seeds the split's hash; 0 by default */
    uint64_t shard_tokens;    /* at most this many tokens per file; 0 = 64 Mi */
    int threads;              /* in [0, KEEL_PREPARE_MAX_THREADS]; 0 = one per online CPU */
    bool force;               /* replace existing shards in out_dir */
    const char *text_key;     /* JSON Lines: the member holding the text; NULL = "text" */
    uint64_t max_tokens;      /* stop at a document's end once this many are written; 0 = all */
    const char *format;       /* "text" (NULL: the same) or "chat" */
    const char *chat_template; /* chat: "llama3" or "llama2"; required with chat, else NULL */
    const char *column;       /* Parquet: the column holding the text; NULL = "text" */
    bool strict_utf8;         /* invalid UTF-8 is an error (else the tokenizer replaces it) */
} keel_prepare_args;
keel_status keel_data_prepare(const keel_prepare_args *args);

#endif
