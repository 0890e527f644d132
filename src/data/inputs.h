/* data/inputs.h: the --input arguments of `keel data prepare` as the list of
 * files to read, in order — a file as named, a directory's files with known
 * extensions (recursively, in byte-wise sorted path order), a glob pattern's
 * matches (sorted) — each with its format and compression read from its
 * name. Internal to the data module (prepare.c).
 *
 *     input_list l;
 *     if (input_list_resolve(args, n_args, &l) != KEEL_OK) return KEEL_ERR_INPUT;
 *     for (size_t i = 0; i < l.n_files; i++) read(l.files[i].path, l.files[i].format, ...);
 *     input_list_free(&l);
 */
#ifndef KEEL_DATA_INPUTS_H
#define KEEL_DATA_INPUTS_H

#include "data/instream.h"

typedef enum {
    INPUT_TEXT,    /* documents are blocks of non-blank lines */
    INPUT_JSONL,   /* one JSON object a line, one document a record */
    INPUT_PARQUET, /* Apache Parquet, one document a row of a string column */
} input_format;

typedef struct {
    char *path;
    input_format format;
    instream_kind compression;
    uint64_t size_bytes; /* on disk (compressed); 0 for a pipe */
    bool sized;          /* a regular file, whose size is known */
} prepare_input;

typedef struct {
    prepare_input *files;
    size_t n_files;
    uint64_t n_ignored;   /* files in named directories without a known extension */
    uint64_t total_bytes; /* sum of size_bytes */
    bool all_sized;       /* no pipe among the files: total_bytes is the whole input */
} input_list;

/* What a file's name says: .jsonl/.json are JSON Lines, .parquet is Parquet
 * and anything else is text, each optionally compressed (.gz, .zst; letter
 * case ignored: a compressed .parquet is refused when it is read). Returns
 * whether the name has a known extension (.txt, .jsonl, .json, .parquet,
 * alone or followed by .gz or .zst): a directory reads only those. */
bool input_kind_of(const char *name, input_format *format, instream_kind *compression);

/* Resolve args[0, n_args) in order into *out: an existing path is a file (any
 * name: read by its extension, text if unknown; a pipe is text) or a
 * directory (its known files, recursively, sorted byte-wise by path; symbolic
 * links to files are followed, to directories not); a path that does not
 * exist and holds *, ? or [ is a glob pattern (glob(3)), its matches sorted and
 * each taken as if named. Errors are one line naming the argument and the fix
 * (KEEL_ERR_INPUT: a missing path, a pattern that matches nothing, a
 * directory without known files; KEEL_ERR_IO: a directory that cannot be
 * read); *out is then empty. The caller owns *out (input_list_free). */
keel_status input_list_resolve(const char *const *args, int n_args, input_list *out);
void input_list_free(input_list *l);

#endif
