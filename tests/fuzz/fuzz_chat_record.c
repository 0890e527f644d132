/* tests/fuzz/fuzz_chat_record.c: one line of a `keel data prepare --format
 * chat` input through chat_record_encode (src/data/chat.c): the record's
 * messages checked, rendered and encoded with its loss mask. The first byte
 * picks the template: even, llama3 over a byte-level tokenizer.json written
 * at start-up (the 256 byte characters, a few merges, Llama 3's special
 * tokens, BOS from its tokenizer_config.json); odd, llama2 over
 * tests/fuzz/data/tok.model (BOS and EOS of the SentencePiece model). The
 * rest is the line, in a buffer of exactly its size. A record must come out
 * as the template has it — BOS first, the turn's end last and trained on, a
 * mask of 0s then 1s within each llama2 turn with its BOS at 0 and its EOS at
 * 1 (a .model never makes those two from text) — and the same again from a
 * doc that encoded other records before; a failure is one error line. */
#include "data/chat.h"

#include "fuzz.h"

#ifndef KEEL_FUZZ_DATA
#error "KEEL_FUZZ_DATA: the directory of tok.model (tests/fuzz/CMakeLists.txt sets it)"
#endif

static keel_tokenizer *tok3, *tok2;
static chat_template *llama3, *llama2;
static chat_doc reused; /* kept from call to call: it must not carry anything over */

/* GPT-2's bytes_to_unicode: the character ByteLevel writes for byte b. */
static unsigned byte_char(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    unsigned n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) n++;
    return 256 + n;
}

/* A byte-level tokenizer.json with Llama 3's special tokens, and the
 * tokenizer_config.json beside it, written into the scratch directory. */
static void write_llama3_tokenizer(const char *dir) {
    static char json[64 << 10];
    size_t n = 0;
#define PUT(...) (n += (size_t)snprintf(json + n, sizeof json - n, __VA_ARGS__))
    PUT("{\"version\": \"1.0\", \"added_tokens\": [");
    static const char *const specials[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                           "<|end_header_id|>", "<|eot_id|>"};
    for (int i = 0; i < 5; i++)
        PUT("%s{\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, \"rstrip\": "
            "false, \"normalized\": false, \"special\": true}", i ? ", " : "", 262 + i, specials[i]);
    PUT("], \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
        "\"trim_offsets\": true, \"use_regex\": true}, \"post_processor\": null, \"decoder\": {\"type\": "
        "\"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true}, "
        "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": "
        "null, \"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, "
        "\"ignore_merges\": false, \"vocab\": {");
    for (unsigned b = 0; b < 256; b++) PUT("%s\"\\u%04x\": %u", b ? ", " : "", byte_char(b), b);
    /* Ġ is byte_char(' ') = U+0120, Ċ is byte_char('\n') = U+010A */
    PUT(", \"\\u0120t\": 256, \"he\": 257, \"\\u0120the\": 258, \"\\u010a\\u010a\": 259, \"in\": 260, "
        "\"\\u0120a\": 261}, \"merges\": [\"\\u0120 t\", \"h e\", \"\\u0120t he\", \"\\u010a \\u010a\", "
        "\"i n\", \"\\u0120 a\"]}}");
#undef PUT
    if (n >= sizeof json) abort();
    fuzz_write(dir, "tokenizer.json", json, n);
    static const char config[] = "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\"}";
    fuzz_write(dir, "tokenizer_config.json", config, sizeof config - 1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/llama3", fuzz_dir());
    write_llama3_tokenizer(dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (keel_tokenizer_load(path, &tok3) != KEEL_OK || chat_template_open("llama3", tok3, path, &llama3) != KEEL_OK)
        abort();
    if (keel_tokenizer_load(KEEL_FUZZ_DATA "/tok.model", &tok2) != KEEL_OK ||
        chat_template_open("llama2", tok2, "tok.model", &llama2) != KEEL_OK)
        abort();
    return 0;
}

/* What every encoded record must look like. */
static void check_doc(const chat_doc *d, bool is_llama3) {
    const keel_tokenizer *tok = is_llama3 ? tok3 : tok2;
    int V = keel_tokenizer_vocab_size(tok);
    int bos = keel_tokenizer_bos_id(tok), eos = keel_tokenizer_eos_id(tok);
    int end = is_llama3 ? keel_tokenizer_special_id(tok3, "<|eot_id|>") : eos;
    size_t n = d->ids.n;
    if (n < 3 || d->ids.ids[0] != bos || d->mask[0] != 0 || d->ids.ids[n - 1] != end || d->mask[n - 1] != 1) abort();
    if (strlen(d->text) != d->text_len) abort(); /* a content ends at a NUL */
    for (size_t i = 0; i < n; i++)
        if (d->ids.ids[i] < 0 || d->ids.ids[i] >= V || d->mask[i] > 1) abort();
    if (is_llama3) return;
    /* llama2: turns BOS (0) prompt (0...) answer (1...) EOS (1) */
    for (size_t i = 0; i < n; i++) {
        int id = d->ids.ids[i];
        if (id == bos && (d->mask[i] != 0 || (i > 0 && d->ids.ids[i - 1] != eos))) abort();
        if (id == eos && d->mask[i] != 1) abort();
        if (i > 0 && d->mask[i] < d->mask[i - 1] && id != bos) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fuzz_quiet();
    bool is_llama3 = data[0] % 2 == 0;
    const chat_template *ct = is_llama3 ? llama3 : llama2;
    size_t len = size - 1;
    char *line = malloc(len ? len : 1);
    if (!line) abort();
    memcpy(line, data + 1, len);
    chat_doc fresh = {0};
    bool is_record, again;
    char why[1024], why2[1024];
    keel_status st = chat_record_encode(ct, line, len, &fresh, &is_record, why, sizeof why);
    keel_status st2 = chat_record_encode(ct, line, len, &reused, &again, why2, sizeof why2);
    if (st != st2 || is_record != again || strcmp(why, why2) != 0) abort();
    if (st == KEEL_OK && is_record) {
        check_doc(&fresh, is_llama3);
        if (fresh.ids.n != reused.ids.n || fresh.text_len != reused.text_len ||
            memcmp(fresh.ids.ids, reused.ids.ids, fresh.ids.n * sizeof *fresh.ids.ids) != 0 ||
            memcmp(fresh.mask, reused.mask, fresh.ids.n) != 0 || memcmp(fresh.text, reused.text, fresh.text_len) != 0)
            abort();
    } else if (st == KEEL_OK) {
        for (size_t i = 0; i < len; i++)
            if (!strchr(" \t\r\n", line[i]) || !line[i]) abort();
    } else {
        if (is_record) abort();
        if (why[0]) keel_errorf("%s", why); /* as keel data prepare prints it, behind the file and line */
        fuzz_expect_error_line(st, "chat_record_encode");
    }
    chat_doc_free(&fresh);
    free(line);
    return 0;
}
