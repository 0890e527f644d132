/* core/gpu.c: this machine's NVIDIA GPUs through NVML, opened with dlopen so
 * that keel needs no driver to build or run; without one there are no GPU
 * readings (keel_gpus_open says why), never invented ones. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/nvml_abi.h"
#include "keel/core.h"

#define KEEL_GPUS_MAX 64

struct keel_gpus {
    void *lib;
    char library[256];
#define FIELD(sym, field, ret, params) ret(*field) params;
    KNVML_FUNCTIONS(FIELD)
#undef FIELD
#define OPTIONAL_FIELD(sym, older, field, ret, params) ret(*field) params; /* NULL: this NVML lacks it */
    KNVML_OPTIONAL_FUNCTIONS(OPTIONAL_FIELD)
#undef OPTIONAL_FIELD
    knvml_event_set events; /* XID events of every GPU; NULL when unsupported */
    int n;
    knvml_device dev[KEEL_GPUS_MAX];
    unsigned last_xid[KEEL_GPUS_MAX];
    double xid_count[KEEL_GPUS_MAX];
    unsigned new_xids[KEEL_GPUS_MAX][KEEL_GPU_NEW_XIDS_MAX]; /* since the GPU's last read */
    int n_new_xids[KEEL_GPUS_MAX];
};

void keel_gpus_close(keel_gpus *g) {
    if (!g) return;
    if (g->events) g->event_set_free(g->events);
    if (g->init) g->shutdown();
    dlclose(g->lib);
    keel_free(g);
}

keel_status keel_gpus_open(keel_gpus **out, char *why, size_t why_n) {
    *out = NULL;
    const char *name = getenv("KEEL_NVML_LIB");
    bool chosen = name && *name;
    if (!chosen) name = "libnvidia-ml.so.1";
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, why_n, "%s%s: %s", chosen ? "KEEL_NVML_LIB=" : "", name, dlerror());
        return chosen ? KEEL_ERR_INPUT : KEEL_OK;
    }
    keel_gpus *g = keel_xcalloc(sizeof *g, "NVML");
    g->lib = lib;
    snprintf(g->library, sizeof g->library, "%s", name);
    /* A function pointer from dlsym goes through memcpy: ISO C has no cast between data and code pointers. */
#define LOAD(sym, field, ret, params)                                                                       \
    {                                                                                                       \
        void *p = dlsym(lib, #sym);                                                                         \
        if (!p) {                                                                                           \
            snprintf(why, why_n, "%s has no %s (an NVML older than the R450 driver?)", name, #sym);         \
            g->init = NULL;                                                                                 \
            keel_gpus_close(g);                                                                             \
            return KEEL_ERR_IO;                                                                             \
        }                                                                                                   \
        memcpy(&g->field, &p, sizeof p);                                                                    \
    }
    KNVML_FUNCTIONS(LOAD)
#undef LOAD
    /* optional: the current name, else the older one of the same ABI, else none */
#define LOAD_OPTIONAL(sym, older, field, ret, params)   \
    {                                                   \
        void *p = dlsym(lib, #sym);                     \
        if (!p) p = dlsym(lib, #older);                 \
        if (p) memcpy(&g->field, &p, sizeof p);         \
    }
    KNVML_OPTIONAL_FUNCTIONS(LOAD_OPTIONAL)
#undef LOAD_OPTIONAL
    knvml_return r = g->init();
    if (r != KNVML_SUCCESS) {
        snprintf(why, why_n, "%s: nvmlInit: %s (driver not loaded?)", name, g->error_string(r));
        g->init = NULL; /* nothing to shut down */
        keel_gpus_close(g);
        return KEEL_ERR_IO;
    }
    unsigned count = 0;
    if ((r = g->count(&count)) != KNVML_SUCCESS) {
        snprintf(why, why_n, "%s: nvmlDeviceGetCount: %s", name, g->error_string(r));
        keel_gpus_close(g);
        return KEEL_ERR_IO;
    }
    if (g->event_set_create(&g->events) != KNVML_SUCCESS) g->events = NULL;
    for (unsigned i = 0; i < count && g->n < KEEL_GPUS_MAX; i++) {
        if (g->handle(i, &g->dev[g->n]) != KNVML_SUCCESS) continue; /* one we may not open: not ours */
        if (g->events) g->register_events(g->dev[g->n], KNVML_EVENT_TYPE_XID_CRITICAL_ERROR, g->events);
        g->n++;
    }
    snprintf(why, why_n, "%d GPU(s) through %s", g->n, name);
    *out = g;
    return KEEL_OK;
}

int keel_gpus_count(const keel_gpus *g) { return g ? g->n : 0; }
const char *keel_gpus_library(const keel_gpus *g) { return g->library; }

/* Take the XID events waiting in the set (no wait) onto their GPUs. */
static void drain_xids(keel_gpus *g) {
    knvml_event_data e;
    for (int k = 0; g->events && k < 1024 && g->event_wait(g->events, &e, 0) == KNVML_SUCCESS; k++)
        for (int i = 0; i < g->n; i++)
            if (g->dev[i] == e.device && (e.eventType & KNVML_EVENT_TYPE_XID_CRITICAL_ERROR)) {
                g->last_xid[i] = (unsigned)e.eventData;
                g->xid_count[i]++;
                if (g->n_new_xids[i] < KEEL_GPU_NEW_XIDS_MAX) g->new_xids[i][g->n_new_xids[i]] = (unsigned)e.eventData;
                g->n_new_xids[i]++;
            }
}

keel_status keel_gpus_read(keel_gpus *g, int i, keel_gpu_sample *s) {
    if (!g || i < 0 || i >= g->n) return KEEL_ERR_INTERNAL;
    knvml_device d = g->dev[i];
    memset(s, 0, sizeof *s);
    s->index = i;
    for (int f = 0; f < KEEL_GPU_N_FIELDS; f++) s->v[f] = NAN;
    if (g->uuid(d, s->uuid, sizeof s->uuid) != KNVML_SUCCESS) snprintf(s->uuid, sizeof s->uuid, "unknown");
    if (g->name(d, s->model, sizeof s->model) != KNVML_SUCCESS) snprintf(s->model, sizeof s->model, "unknown");
    knvml_pci_info pci;
    if (g->pci(d, &pci) == KNVML_SUCCESS)
        snprintf(s->pci_bus_id, sizeof s->pci_bus_id, "%.*s", (int)sizeof pci.busId, pci.busId);
    if (g->minor(d, &s->minor) != KNVML_SUCCESS) s->minor = (unsigned)i;

    knvml_utilization u;
    if (g->utilization(d, &u) == KNVML_SUCCESS) s->v[KEEL_GPU_UTIL] = u.gpu, s->v[KEEL_GPU_MEM_COPY_UTIL] = u.memory;
    knvml_memory m;
    if (g->memory(d, &m) == KNVML_SUCCESS)
        s->v[KEEL_GPU_FB_USED] = (double)(m.used >> 20), s->v[KEEL_GPU_FB_FREE] = (double)(m.free >> 20);
    unsigned x;
    unsigned long long ull;
    if (g->temperature(d, KNVML_TEMPERATURE_GPU, &x) == KNVML_SUCCESS) s->v[KEEL_GPU_TEMP] = x;
    if (g->power(d, &x) == KNVML_SUCCESS) s->v[KEEL_GPU_POWER_USAGE] = x / 1000.0; /* mW */
    if (g->energy(d, &ull) == KNVML_SUCCESS) s->v[KEEL_GPU_TOTAL_ENERGY] = (double)ull;
    if (g->clock(d, KNVML_CLOCK_SM, &x) == KNVML_SUCCESS) s->v[KEEL_GPU_SM_CLOCK] = x;
    if (g->clock(d, KNVML_CLOCK_MEM, &x) == KNVML_SUCCESS) s->v[KEEL_GPU_MEM_CLOCK] = x;
    if (g->max_clock(d, KNVML_CLOCK_SM, &x) == KNVML_SUCCESS) s->v[KEEL_GPU_MAX_SM_CLOCK] = x;
    if (g->pcie_replay(d, &x) == KNVML_SUCCESS) s->v[KEEL_GPU_PCIE_REPLAY] = x;
    if (g->ecc(d, KNVML_MEMORY_ERROR_TYPE_CORRECTED, KNVML_VOLATILE_ECC, &ull) == KNVML_SUCCESS)
        s->v[KEEL_GPU_ECC_SBE_VOL] = (double)ull;
    if (g->ecc(d, KNVML_MEMORY_ERROR_TYPE_UNCORRECTED, KNVML_VOLATILE_ECC, &ull) == KNVML_SUCCESS)
        s->v[KEEL_GPU_ECC_DBE_VOL] = (double)ull;
    unsigned corr, unc, pending, failed;
    if (g->remapped_rows(d, &corr, &unc, &pending, &failed) == KNVML_SUCCESS) {
        s->v[KEEL_GPU_CORRECTABLE_REMAPPED_ROWS] = corr, s->v[KEEL_GPU_UNCORRECTABLE_REMAPPED_ROWS] = unc;
        s->v[KEEL_GPU_ROW_REMAP_PENDING] = pending != 0, s->v[KEEL_GPU_ROW_REMAP_FAILURE] = failed != 0;
    }
    if (g->clock_event_reasons && g->clock_event_reasons(d, &ull) == KNVML_SUCCESS)
        s->v[KEEL_GPU_CLOCK_EVENT_REASONS] = (double)ull;
    if (g->events) {
        drain_xids(g);
        s->v[KEEL_GPU_XID_ERRORS] = g->last_xid[i];
        s->v[KEEL_GPU_XID_COUNT] = g->xid_count[i];
        s->n_new_xids = g->n_new_xids[i];
        memcpy(s->new_xids, g->new_xids[i], sizeof s->new_xids);
        g->n_new_xids[i] = 0;
    }
    return KEEL_OK;
}
