/* tests/fuzz/k8s_yaml.h: the shapes of the YAML `keel k8s manifest` renders,
 * for the harnesses that render a spec (fuzz_k8s_spec: JSON specs,
 * fuzz_k8s_status: .env files). Every line is a comment, a "---", or
 * `[- ]key:` with nothing, a number, "{}" or one double-quoted scalar after it
 * (or `- "scalar"`), the scalar closed on its own line with no raw control
 * byte. Anything else aborts. */
#ifndef KEEL_FUZZ_K8S_YAML_H
#define KEEL_FUZZ_K8S_YAML_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* One double-quoted scalar at c: its end (just past the closing quote), or abort. */
static const char *quoted(const char *c) {
    if (*c++ != '"') abort();
    for (; *c != '"'; c++) {
        if (!*c || *c == '\n' || (unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f) abort();
        if (*c == '\\') {
            c++;
            if (*c == 'x') {
                if (!c[1] || !strchr("0123456789abcdef", c[1]) || !c[2] || !strchr("0123456789abcdef", c[2]))
                    abort();
                c += 2;
            } else if (*c != '"' && *c != '\\') abort();
        }
    }
    return c + 1;
}

static bool key_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '/' ||
           c == '-';
}

/* One line of the YAML (without its '\n'), held to keel's few shapes. */
static void check_line(const char *c) {
    if (!strcmp(c, "---") || !strncmp(c, "# ", 2)) return;
    while (*c == ' ') c++;
    if (c[0] == '-' && c[1] == ' ') {
        c += 2;
        if (*c == '"') {
            if (*quoted(c)) abort();
            return;
        }
    }
    const char *k = c;
    while (key_char(*c)) c++;
    if (c == k || *c++ != ':') abort();
    if (!*c) return;
    if (*c++ != ' ') abort();
    if (*c == '"') c = quoted(c);
    else if (!strcmp(c, "{}")) c += 2;
    else {
        if (!(*c >= '0' && *c <= '9')) abort();
        while (*c >= '0' && *c <= '9') c++;
    }
    if (*c) abort();
}

static void check_yaml(const char *yaml) {
    char *copy = strdup(yaml);
    if (!copy) abort();
    for (char *line = copy, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (!next) abort(); /* every line ends */
        *next++ = 0;
        check_line(line);
    }
    free(copy);
}

#endif
