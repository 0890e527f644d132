/* cli/cmd_data.c: `keel data prepare` — parse the flags, call keel_data_prepare. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/data.h"

static const char data_usage[] =
    "usage: keel data prepare --model TOKENIZER.model --input PATH [PATH ...] --out DIR\n"
    "                         [--val-fraction F] [--split-seed S] [--shard-tokens N]\n"
    "                         [--text-key KEY] [--column NAME] [--strict-utf8]\n"
    "                         [--max-tokens N] [--threads N] [--force]\n"
    "                         [--format text|chat] [--chat-template llama3|llama2]\n"
    "\n"
    "Tokenize text, JSON Lines and Parquet files into token shards for `data.path`:\n"
    "DIR/train-00000.bin, ... and, with --val-fraction, DIR/val-00000.bin, ...\n"
    "\n"
    "Inputs: .jsonl and .json files are JSON Lines (one object a line), .parquet\n"
    "files Apache Parquet, any other file is text; .gz and .zst files are\n"
    "decompressed as they are read (corpus.jsonl.zst, notes.txt.gz; Parquet\n"
    "compresses its own pages: SNAPPY, GZIP, ZSTD). A directory gives its .txt,\n"
    ".jsonl, .json and .parquet files and their .gz/.zst, recursively, in sorted\n"
    "path order; a quoted pattern ('shards/*.parquet') is expanded by keel, sorted.\n"
    "A pipe is read as text.\n"
    "\n"
    "In text a document is a block of non-blank lines; a blank line or the end of\n"
    "a file ends it. In JSON Lines each record is a document: the string at\n"
    "--text-key, split at its newlines into lines as text is (its blank lines do\n"
    "not end it); empty records are skipped. In Parquet each row of the string\n"
    "column --column is a document, as a record's string is; empty and null rows\n"
    "are skipped. Each line is encoded as spm_encode would, and each document\n"
    "becomes BOS + its lines' tokens + EOS (BOS/EOS only if the tokenizer defines\n"
    "them). Prints the inputs, the tokens of each split, the split with its seed,\n"
    "and MB/s of text; on a terminal, the progress.\n"
    "\n"
    "Chat fine-tuning (--format chat): each JSON Lines record is one conversation,\n"
    "  {\"messages\": [{\"role\": \"system\", \"content\": \"...\"},   (optional, first)\n"
    "                {\"role\": \"user\", \"content\": \"...\"},\n"
    "                {\"role\": \"assistant\", \"content\": \"...\"}, ...]}\n"
    "user and assistant in turn, ending with the assistant. It is rendered with\n"
    "--chat-template as the model's Hugging Face chat template renders it (its\n"
    "BOS/EOS and special tokens; no others added) and tokenized to the ids of\n"
    "transformers' apply_chat_template; the shards carry a loss mask that trains\n"
    "only on the assistant's answers and the token ending each (<|eot_id|>, </s>).\n"
    "A conversation is never cut: it goes whole to train or val. Every input is\n"
    "read as JSON Lines (a pipe too; .txt files are refused). See docs/data.md,\n"
    "\"Chat fine-tuning\".\n"
    "\n"
    "  --model PATH        tokenizer: a SentencePiece .model or a Hugging Face\n"
    "                      tokenizer.json (BOS/EOS from the tokenizer_config.json\n"
    "                      beside it)\n"
    "  --input PATH ...    files, directories or quoted glob patterns, read in\n"
    "                      order (repeatable)\n"
    "  --out DIR           output directory; created if missing\n"
    "  --val-fraction F    chance that a document goes to val, in [0, 1) (default 0: no\n"
    "                      val); decided by a seeded hash of the document's text, so the\n"
    "                      same for any order or layout of the inputs (a document is cut\n"
    "                      at line ends every ~65536 tokens, each piece decided alone)\n"
    "  --split-seed S      seed of that hash, an integer >= 0 (default 0); another seed\n"
    "                      draws another val set\n"
    "  --shard-tokens N    at most N tokens per file (default 67108864)\n"
    "  --text-key KEY      the key of a JSON Lines record that holds its text\n"
    "                      (default: text)\n"
    "  --column NAME       the top-level Parquet column that holds the text, a\n"
    "                      string column (default: text)\n"
    "  --strict-utf8       text that is not valid UTF-8 is an error naming the file,\n"
    "                      line (record, row) and byte (default: the tokenizer reads\n"
    "                      it as it does any bytes)\n"
    "  --max-tokens N      stop at the end of the document that brings the tokens\n"
    "                      written to N or more (default: read every input)\n"
    "  --threads N         threads that encode text (default: one per CPU); the files\n"
    "                      are the same for any N\n"
    "  --force             replace the shards already in DIR (default: refuse)\n"
    "  --format F          text (default: documents) or chat (JSON Lines\n"
    "                      conversations, with a loss mask)\n"
    "  --chat-template T   with --format chat, required: llama3 (Llama 3 Instruct:\n"
    "                      <|start_header_id|>role<|end_header_id|> ... <|eot_id|>)\n"
    "                      or llama2 (Llama 2 chat: <s>[INST] ... [/INST] ... </s>)\n"
    "  --help              show this text\n";

enum { OPT_MODEL = 256, OPT_INPUT, OPT_OUT, OPT_VAL_FRACTION, OPT_SHARD_TOKENS, OPT_FORCE,
       OPT_HELP, OPT_SPLIT_SEED, OPT_THREADS, OPT_TEXT_KEY, OPT_MAX_TOKENS, OPT_FORMAT,
       OPT_CHAT_TEMPLATE, OPT_COLUMN, OPT_STRICT_UTF8 };

static const struct option prepare_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"input", required_argument, NULL, OPT_INPUT},
    {"out", required_argument, NULL, OPT_OUT},
    {"val-fraction", required_argument, NULL, OPT_VAL_FRACTION},
    {"shard-tokens", required_argument, NULL, OPT_SHARD_TOKENS},
    {"split-seed", required_argument, NULL, OPT_SPLIT_SEED},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"text-key", required_argument, NULL, OPT_TEXT_KEY},
    {"max-tokens", required_argument, NULL, OPT_MAX_TOKENS},
    {"format", required_argument, NULL, OPT_FORMAT},
    {"chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE},
    {"column", required_argument, NULL, OPT_COLUMN},
    {"strict-utf8", no_argument, NULL, OPT_STRICT_UTF8},
    {"force", no_argument, NULL, OPT_FORCE},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static int usage_error(const char *what, const char *arg) {
    keel_errorf("data prepare: %s '%s'; see `keel data prepare --help`", what, arg);
    return 2;
}

static bool parse_fraction(const char *text, double *out) {
    char *end;
    errno = 0;
    *out = strtod(text, &end);
    return errno == 0 && end != text && *end == '\0' && isfinite(*out);
}

/* A whole decimal integer >= 0 (strtoull alone would take "-1" and " 7"). */
static bool parse_u64(const char *text, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] < '0' || text[0] > '9') return false;
    *out = value;
    return true;
}

static bool parse_count(const char *text, uint64_t *out) { return parse_u64(text, out) && *out > 0; }

static int cmd_prepare(int argc, char **argv) {
    keel_prepare_args args = {0};
    const char **inputs = calloc((size_t)argc, sizeof *inputs); /* argc bounds the inputs */
    if (!inputs) return 1;
    int exit_code = -1;
    optind = 0; /* full re-initialisation of GNU getopt */
    opterr = 0;
    int opt;
    while (exit_code < 0 && (opt = getopt_long(argc, argv, ":", prepare_options, NULL)) != -1) {
        const char *arg = optarg;
        switch (opt) {
        case OPT_MODEL: args.model_path = arg; break;
        case OPT_INPUT: inputs[args.n_inputs++] = arg; break;
        case OPT_OUT: args.out_dir = arg; break;
        case OPT_VAL_FRACTION:
            if (!parse_fraction(arg, &args.val_fraction))
                exit_code = usage_error("--val-fraction needs a number, not", arg);
            break;
        case OPT_SHARD_TOKENS:
            if (!parse_count(arg, &args.shard_tokens))
                exit_code = usage_error("--shard-tokens needs a positive integer, not", arg);
            break;
        case OPT_SPLIT_SEED:
            if (!parse_u64(arg, &args.split_seed))
                exit_code = usage_error("--split-seed needs an integer >= 0, not", arg);
            break;
        case OPT_THREADS: {
            uint64_t threads;
            if (parse_count(arg, &threads) && threads <= KEEL_PREPARE_MAX_THREADS) {
                args.threads = (int)threads;
                break;
            }
            char what[64];
            snprintf(what, sizeof what, "--threads needs an integer from 1 to %d, not",
                     KEEL_PREPARE_MAX_THREADS);
            exit_code = usage_error(what, arg);
            break;
        }
        case OPT_TEXT_KEY: args.text_key = arg; break;
        case OPT_COLUMN: args.column = arg; break;
        case OPT_STRICT_UTF8: args.strict_utf8 = true; break;
        case OPT_MAX_TOKENS:
            if (!parse_count(arg, &args.max_tokens))
                exit_code = usage_error("--max-tokens needs a positive integer, not", arg);
            break;
        case OPT_FORMAT: args.format = arg; break;
        case OPT_CHAT_TEMPLATE: args.chat_template = arg; break;
        case OPT_FORCE: args.force = true; break;
        case OPT_HELP:
            fputs(data_usage, stdout);
            exit_code = 0;
            break;
        case ':': exit_code = usage_error("missing value for", argv[optind - 1]); break;
        default: {
            char short_opt[3] = {'-', (char)optopt, '\0'};
            exit_code = usage_error("unknown option", optopt ? short_opt : argv[optind - 1]);
            break;
        }
        }
    }
    /* `--input a.txt b.txt`: the words after the options are inputs too. */
    for (int i = optind; exit_code < 0 && i < argc; i++) inputs[args.n_inputs++] = argv[i];
    if (exit_code < 0) {
        args.inputs = inputs;
        exit_code = keel_status_exit_code(keel_data_prepare(&args));
    }
    free(inputs);
    return exit_code;
}

int keel_cmd_data(int argc, char **argv) {
    if (argc < 2) {
        fputs(data_usage, stderr);
        return 2;
    }
    const char *sub = argv[1];
    if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0 || strcmp(sub, "help") == 0) {
        fputs(data_usage, stdout);
        return 0;
    }
    if (strcmp(sub, "prepare") == 0) return cmd_prepare(argc - 1, argv + 1);
    keel_errorf("data: unknown subcommand '%s'; the only one is `keel data prepare`", sub);
    return 2;
}
