/* TEMPORARY until the fsio branch lands: the parts of core/fsio.c the run module uses. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "keel/core.h"

keel_status keel_mkdirs(const char *dir) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) goto fail;
            *p = '/';
        }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) goto fail;
    return KEEL_OK;
fail:
    keel_errorf("%s: cannot create directory: %s", buf, strerror(errno));
    return KEEL_ERR_IO;
}

bool keel_path_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

keel_status keel_read_file(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        keel_errorf("%s: cannot open: %s", path, strerror(errno));
        return errno == ENOENT ? KEEL_ERR_INPUT : KEEL_ERR_IO;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = keel_xmalloc((size_t)(n > 0 ? n : 0) + 1, "file");
    size_t got = fread(text, 1, (size_t)(n > 0 ? n : 0), f);
    fclose(f);
    text[got] = 0;
    *out = text;
    if (len) *len = got;
    return KEEL_OK;
}
