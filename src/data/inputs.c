/* data/inputs.c: the --input arguments of `keel data prepare` (files,
 * directories, glob patterns) as the list of files it reads (see inputs.h). */
#include "data/inputs.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* Cuts a (case-insensitive) suffix off name[0, *len) if it is there. */
static bool cut_suffix(const char *name, size_t *len, const char *suffix) {
    size_t n = strlen(suffix);
    if (*len <= n || strncasecmp(name + *len - n, suffix, n) != 0) return false;
    *len -= n;
    return true;
}

bool input_kind_of(const char *name, input_format *format, instream_kind *compression) {
    const char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    size_t len = strlen(base);
    *compression = cut_suffix(base, &len, ".gz")    ? INSTREAM_GZIP
                   : cut_suffix(base, &len, ".zst") ? INSTREAM_ZSTD
                                                    : INSTREAM_PLAIN;
    if (cut_suffix(base, &len, ".jsonl") || cut_suffix(base, &len, ".json")) {
        *format = INPUT_JSONL;
        return true;
    }
    if (cut_suffix(base, &len, ".parquet")) {
        *format = INPUT_PARQUET;
        return true;
    }
    *format = INPUT_TEXT;
    return cut_suffix(base, &len, ".txt");
}

static void push_file(input_list *l, size_t *cap, const char *path, const struct stat *sb) {
    if (l->n_files == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        l->files = keel_xrealloc(l->files, *cap * sizeof *l->files, "input list");
    }
    prepare_input *f = &l->files[l->n_files++];
    *f = (prepare_input){.path = keel_xstrdup(path), .sized = S_ISREG(sb->st_mode)};
    input_kind_of(path, &f->format, &f->compression);
    f->size_bytes = f->sized ? (uint64_t)sb->st_size : 0;
    l->total_bytes += f->size_bytes;
    l->all_sized = l->all_sized && f->sized;
}

static int by_path(const void *a, const void *b) {
    return strcmp(((const prepare_input *)a)->path, ((const prepare_input *)b)->path);
}

/* Every file under dir with a known extension into *found (unsorted); the
 * rest counted in *ignored. Directories are entered, symbolic links to them
 * not (no loops). */
static keel_status walk(const char *dir, const char *arg, input_list *found, size_t *cap,
                        uint64_t *ignored) {
    DIR *dh = opendir(dir);
    if (!dh) {
        keel_errorf("data prepare: cannot read directory %s (of --input %s): %s", dir, arg,
                    strerror(errno));
        return KEEL_ERR_IO;
    }
    keel_status st = KEEL_OK;
    struct dirent *e;
    while (st == KEEL_OK && (e = readdir(dh)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *path = keel_path_join(dir, e->d_name);
        struct stat sb;
        input_format format;
        instream_kind compression;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
            st = walk(path, arg, found, cap, ignored);
        else if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) &&
                 input_kind_of(e->d_name, &format, &compression))
            push_file(found, cap, path, &sb);
        else
            (*ignored)++;
        keel_free(path);
    }
    closedir(dh);
    return st;
}

static keel_status add_directory(input_list *l, size_t *cap, const char *arg) {
    char *dir = keel_xstrdup(arg);
    for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--) dir[n - 1] = '\0';
    input_list found = {.all_sized = true};
    size_t found_cap = 0;
    uint64_t ignored = 0;
    keel_status st = walk(dir, arg, &found, &found_cap, &ignored);
    if (st == KEEL_OK && found.n_files == 0) {
        char others[64] = "";
        if (ignored)
            snprintf(others, sizeof others, ", only %" PRIu64 " other file%s", ignored,
                     ignored == 1 ? "" : "s");
        keel_errorf("data prepare: --input directory %s holds no .txt, .jsonl, .json or .parquet "
                    "file (nor a .gz or .zst of one)%s; name a file itself to read it as text",
                    arg, others);
        st = KEEL_ERR_INPUT;
    }
    if (st == KEEL_OK) {
        qsort(found.files, found.n_files, sizeof *found.files, by_path);
        for (size_t i = 0; i < found.n_files; i++) {
            struct stat sb = {.st_mode = S_IFREG, .st_size = (off_t)found.files[i].size_bytes};
            push_file(l, cap, found.files[i].path, &sb);
        }
        l->n_ignored += ignored;
    }
    input_list_free(&found);
    keel_free(dir);
    return st;
}

/* A path as the user named it: a directory's files, or the file itself. */
static keel_status add_path(input_list *l, size_t *cap, const char *path, const struct stat *sb) {
    if (S_ISDIR(sb->st_mode)) return add_directory(l, cap, path);
    push_file(l, cap, path, sb);
    return KEEL_OK;
}

static int by_string(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static keel_status add_glob(input_list *l, size_t *cap, const char *pattern) {
    glob_t g;
    int rc = glob(pattern, GLOB_NOSORT, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        keel_errorf("data prepare: --input pattern '%s' matches no file", pattern);
        return KEEL_ERR_INPUT;
    }
    if (rc != 0) {
        keel_errorf("data prepare: cannot expand --input pattern '%s': %s", pattern,
                    rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
        return KEEL_ERR_IO;
    }
    /* byte-wise, whatever the locale (glob's own sort follows LC_COLLATE) */
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, by_string);
    keel_status st = KEEL_OK;
    for (size_t i = 0; i < g.gl_pathc && st == KEEL_OK; i++) {
        struct stat sb;
        if (stat(g.gl_pathv[i], &sb) != 0) {
            keel_errorf("data prepare: input %s (of --input '%s'): %s", g.gl_pathv[i], pattern,
                        strerror(errno));
            st = KEEL_ERR_INPUT;
        } else {
            st = add_path(l, cap, g.gl_pathv[i], &sb);
        }
    }
    globfree(&g);
    return st;
}

keel_status input_list_resolve(const char *const *args, int n_args, input_list *out) {
    *out = (input_list){.all_sized = true};
    size_t cap = 0;
    keel_status st = KEEL_OK;
    for (int i = 0; i < n_args && st == KEEL_OK; i++) {
        const char *arg = args[i];
        struct stat sb;
        if (stat(arg, &sb) == 0) {
            st = add_path(out, &cap, arg, &sb);
        } else if ((errno == ENOENT || errno == ENOTDIR) && strpbrk(arg, "*?[")) {
            st = add_glob(out, &cap, arg);
        } else {
            keel_errorf("data prepare: input %s: %s", arg, strerror(errno));
            st = KEEL_ERR_INPUT;
        }
    }
    if (st != KEEL_OK) input_list_free(out);
    return st;
}

void input_list_free(input_list *l) {
    for (size_t i = 0; i < l->n_files; i++) keel_free(l->files[i].path);
    keel_free(l->files);
    *l = (input_list){0};
}
