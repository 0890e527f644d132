/* cli/cmd_tokenize.c: `keel tokenize --model M [--decode]` — lines of text on
 * stdin to lines of ids on stdout (like spm_encode --output_format=id, or
 * tokenizers' encode without special tokens for a tokenizer.json; no
 * BOS/EOS), or with --decode lines of ids back to text (like spm_decode
 * --input_format=id). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/tokenizer.h"

static const char USAGE[] =
    "usage: keel tokenize --model FILE [--decode]\n"
    "\n"
    "Reads lines on stdin and writes one line per input line on stdout.\n"
    "  --model FILE   SentencePiece BPE model (.model), e.g. from spm_train, or a\n"
    "                 Hugging Face BPE tokenizer.json (Llama 3, Llama 2, Mistral, GPT-2)\n"
    "  --decode       input lines are space-separated token ids; print their text\n"
    "                 (default: input lines are text; print their ids, no BOS/EOS)\n"
    "  --help         show this help\n";

enum { OPT_MODEL = 1000, OPT_DECODE, OPT_HELP };

typedef struct {
    const char *model_path;
    bool decode;
} tokenize_args;

/* 0 = parsed, 1 = --help printed, -1 = bad usage (error printed). */
static int parse_args(int argc, char **argv, tokenize_args *a) {
    static const struct option options[] = {
        {"model", required_argument, NULL, OPT_MODEL},
        {"decode", no_argument, NULL, OPT_DECODE},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    *a = (tokenize_args){0};
    optind = 0; /* GNU: re-initialise, another command may have run getopt */
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, ":", options, NULL)) != -1) {
        switch (opt) {
        case OPT_MODEL: a->model_path = optarg; break;
        case OPT_DECODE: a->decode = true; break;
        case OPT_HELP: fputs(USAGE, stdout); return 1;
        case ':':
            keel_errorf("tokenize: %s needs a value; see keel tokenize --help", argv[optind - 1]);
            return -1;
        default:
            keel_errorf("tokenize: unknown option '%s'; see keel tokenize --help",
                        argv[optind - 1]);
            return -1;
        }
    }
    if (optind < argc) {
        keel_errorf("tokenize: unexpected argument '%s' (text comes on stdin); see keel tokenize "
                    "--help", argv[optind]);
        return -1;
    }
    if (!a->model_path) {
        keel_errorf("tokenize: --model FILE is required; see keel tokenize --help");
        return -1;
    }
    return 0;
}

/* The decimal digits of id into out (room for 11 bytes); returns their count. */
static size_t format_id(char *out, int32_t id) {
    char digits[11];
    size_t n = 0, k = 0;
    uint32_t v = id < 0 ? 0u - (uint32_t)id : (uint32_t)id;
    do digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) > 0);
    if (id < 0) out[k++] = '-';
    while (n > 0) out[k++] = digits[--n];
    return k;
}

/* One line of ids, written in blocks (printf per id was a quarter of encoding's time). */
static void print_ids(const keel_ids *ids) {
    char line[4096];
    size_t n = 0;
    for (size_t i = 0; i < ids->n; i++) {
        if (n > sizeof line - 16) {
            fwrite(line, 1, n, stdout);
            n = 0;
        }
        if (i) line[n++] = ' ';
        n += format_id(line + n, ids->ids[i]);
    }
    line[n++] = '\n';
    fwrite(line, 1, n, stdout);
}

static keel_status encode_lines(const keel_tokenizer *tok) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    keel_ids ids = {0};
    keel_status st = KEEL_OK;
    while (st == KEEL_OK && (got = getline(&line, &cap, stdin)) >= 0) {
        size_t len = (size_t)got;
        if (len > 0 && line[len - 1] == '\n') len--; /* like std::getline: keep '\r' */
        st = keel_tokenizer_encode(tok, line, len, &ids);
        if (st == KEEL_OK) print_ids(&ids);
    }
    free(line);
    keel_ids_free(&ids);
    return st;
}

/* Parse one line of space-separated ids into *ids. */
static keel_status parse_id_line(char *line, long line_no, int vocab_size, keel_ids *ids) {
    ids->n = 0;
    for (char *tok = strtok(line, " \t\r\n"); tok; tok = strtok(NULL, " \t\r\n")) {
        char *end;
        errno = 0;
        long v = strtol(tok, &end, 10);
        if (*end != '\0' || errno != 0 || v < 0 || v >= vocab_size) {
            keel_errorf("tokenize --decode: line %ld: '%s' is not a token id in [0, %d); give "
                        "space-separated ids from this model",
                        line_no, tok, vocab_size);
            return KEEL_ERR_INPUT;
        }
        if (ids->n == ids->cap) {
            ids->cap = ids->cap ? 2 * ids->cap : 64;
            ids->ids = keel_xrealloc(ids->ids, ids->cap * sizeof *ids->ids, "token ids");
        }
        ids->ids[ids->n++] = (int32_t)v;
    }
    return KEEL_OK;
}

static keel_status decode_lines(const keel_tokenizer *tok) {
    char *line = NULL;
    size_t cap = 0;
    keel_ids ids = {0};
    keel_status st = KEEL_OK;
    for (long line_no = 1; st == KEEL_OK && getline(&line, &cap, stdin) >= 0; line_no++) {
        st = parse_id_line(line, line_no, keel_tokenizer_vocab_size(tok), &ids);
        char *text = NULL;
        size_t len = 0;
        if (st == KEEL_OK) st = keel_tokenizer_decode_len(tok, ids.ids, ids.n, &text, &len);
        if (st == KEEL_OK) {
            fwrite(text, 1, len, stdout);
            putchar('\n');
        }
        keel_free(text);
    }
    free(line);
    keel_ids_free(&ids);
    return st;
}

int keel_cmd_tokenize(int argc, char **argv) {
    tokenize_args args;
    int parsed = parse_args(argc, argv, &args);
    if (parsed != 0) return parsed > 0 ? 0 : 2;

    keel_tokenizer *tok;
    keel_status st = keel_tokenizer_load(args.model_path, &tok);
    if (st != KEEL_OK) return keel_status_exit_code(st);
    st = args.decode ? decode_lines(tok) : encode_lines(tok);
    keel_tokenizer_free(tok);
    if (st == KEEL_OK && ferror(stdin)) {
        keel_errorf("tokenize: cannot read stdin: %s", strerror(errno));
        st = KEEL_ERR_IO;
    }
    if (st == KEEL_OK && fflush(stdout) != 0) {
        keel_errorf("tokenize: cannot write stdout: %s", strerror(errno));
        st = KEEL_ERR_IO;
    }
    return keel_status_exit_code(st);
}
