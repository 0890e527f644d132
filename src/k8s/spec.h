/* k8s/spec.h: what spec.c shares inside the k8s module — a spec read from a
 * parsed JSON object, with the lines of a .env file its keys came from (env.c),
 * so that an error names the line a value was written on. */
#ifndef KEEL_K8S_SPEC_H
#define KEEL_K8S_SPEC_H

#include <cjson/cJSON.h>

#include "keel/k8s.h"

#define K8S_SPEC_MAX_BYTES (64 << 10) /* a spec, JSON or .env, is a small file */

/* A spec key and the .env variable that gave it: error lines about key name
 * "FILE:LINE: VAR (key)" (line 0: the variable is absent, "FILE: VAR (key)"). */
typedef struct {
    const char *key; /* "nodes", "elastic.minNodes"; NULL ends a list */
    const char *var; /* "NUM_NODES" */
    int line;
} k8s_origin;

/* A spec's text is at most K8S_SPEC_MAX_BYTES and has no NUL byte; else one error line. */
keel_status k8s_spec_text_check(const char *text, size_t len, const char *path);
/* The spec in j (an object of spec keys), every value checked as
 * keel_k8s_spec_parse checks a file's; origins (NULL-keyed end, or NULL)
 * names where keys came from. On error *s is freed and zeroed. */
keel_status k8s_spec_from_json(const cJSON *j, const char *path, const k8s_origin *origins,
                               const char *default_run_id, keel_k8s_spec *s);

#endif
