/* A stand-in for the driver's libnvidia-ml.so.1 with two GPUs of fixed readings,
 * for the tests of keel's NVML path on machines without an NVIDIA driver
 * (KEEL_NVML_LIB points keel at it). It implements only the calls keel makes,
 * with NVML's ABI (src/core/nvml_abi.h); it is never installed or shipped.
 * GPU 1 lacks power and row-remapping readings (NVML_ERROR_NOT_SUPPORTED) and
 * has one XID 79 event waiting; GPU 0 is busy (87 %), GPU 1 idle (clock event
 * reason "GPU idle"). Real readings come from a real GPU.
 *
 * Tests change readings with KEEL_NVML_STAND_IN_STATE=FILE, read at nvmlInit:
 * lines "gpuN.KNOB=VALUE" (KNOB: one of KNOBS below; VALUE a number, 0x..
 * allowed, or "unsupported") and "xid_events=GPU:XID,..." (the events waiting,
 * in order; empty: none). Anything else fails nvmlInit with a line on stderr.
 * The clock event reasons are served under their older name
 * (nvmlDeviceGetCurrentClocksThrottleReasons) only: keel's fallback to it is
 * what this exercises. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/nvml_abi.h"

#define NOT_SUPPORTED 3u
#define INVALID_ARGUMENT 2u
#define UNKNOWN 999u
#define N_GPUS 2
#define MAX_EVENTS 64

struct nvmlDevice_st {
    int i;
};
struct nvmlEventSet_st {
    int n, next;
    int gpu[MAX_EVENTS];
    unsigned xid[MAX_EVENTS];
};
static struct nvmlDevice_st gpus[N_GPUS] = {{0}, {1}};
static struct nvmlEventSet_st events = {.n = 1, .gpu = {1}, .xid = {79}};

enum { TEMP, UTIL, SM_CLOCK, MAX_SM_CLOCK, ECC_UNCORRECTED, REMAPPED_CORRECTABLE, REMAPPED_UNCORRECTABLE,
       REMAP_PENDING, REMAP_FAILURE, CLOCK_EVENT_REASONS, N_KNOBS };
static const char *const KNOBS[N_KNOBS] = {"temp", "util", "sm_clock", "max_sm_clock", "ecc_uncorrected",
                                           "remapped_correctable", "remapped_uncorrectable", "remap_pending",
                                           "remap_failure", "clock_event_reasons"};
#define UNSUPPORTED -1LL
/* GPU 1's row remapping is one unsupported call: all four of its readings */
static long long knob[N_GPUS][N_KNOBS] = {
    {61, 87, 1980, 1980, 0, 2, 0, 0, 0, 0},
    {38, 12, 1980, 1980, 0, UNSUPPORTED, UNSUPPORTED, UNSUPPORTED, UNSUPPORTED, KNVML_CLOCKS_EVENT_GPU_IDLE},
};

static int bad_state(const char *path, int line, const char *text) {
    fprintf(stderr, "nvml stand-in: %s:%d: '%s' is not gpuN.KNOB=VALUE or xid_events=GPU:XID,...\n", path, line,
            text);
    return 0;
}

static int set_events(const char *list) {
    events.n = events.next = 0;
    for (const char *p = list; *p && *p != '\n';) {
        int gpu, used = 0;
        unsigned xid;
        if (events.n == MAX_EVENTS || sscanf(p, "%d:%u%n", &gpu, &xid, &used) != 2 || gpu < 0 || gpu >= N_GPUS)
            return 0;
        events.gpu[events.n] = gpu, events.xid[events.n++] = xid;
        p += used;
        if (*p == ',') p++;
        else if (*p && *p != '\n') return 0;
    }
    return 1;
}

static int set_knob(const char *line) {
    int gpu, used = 0;
    char name[64];
    if (sscanf(line, "gpu%d.%63[a-z_]=%n", &gpu, name, &used) != 2 || !used || gpu < 0 || gpu >= N_GPUS) return 0;
    const char *value = line + used;
    for (int k = 0; k < N_KNOBS; k++) {
        if (strcmp(name, KNOBS[k])) continue;
        if (!strncmp(value, "unsupported", 11)) {
            knob[gpu][k] = UNSUPPORTED;
            return 1;
        }
        char *end;
        knob[gpu][k] = (long long)strtoull(value, &end, 0);
        return end != value && (*end == 0 || *end == '\n');
    }
    return 0;
}

/* KEEL_NVML_STAND_IN_STATE: 1 when absent or read, 0 on a line it does not know */
static int read_state(void) {
    const char *path = getenv("KEEL_NVML_STAND_IN_STATE");
    if (!path || !*path) return 1;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "nvml stand-in: cannot open KEEL_NVML_STAND_IN_STATE=%s\n", path);
        return 0;
    }
    char line[512];
    int ok = 1;
    for (int n = 1; ok && fgets(line, sizeof line, f); n++) {
        if (line[0] == '\n' || line[0] == '#') continue;
        ok = !strncmp(line, "xid_events=", 11) ? set_events(line + 11) : set_knob(line);
        if (!ok) bad_state(path, n, strtok(line, "\n"));
    }
    fclose(f);
    return ok;
}

#define DEV(d) int i = (d)->i; (void)i
/* a knob's reading, or NOT_SUPPORTED */
#define KNOB(k, out)                                  \
    if (knob[i][k] == UNSUPPORTED) return NOT_SUPPORTED; \
    *(out) = (unsigned)knob[i][k]
knvml_return nvmlInit_v2(void) { return read_state() ? 0 : UNKNOWN; }
knvml_return nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(knvml_return r) { return r == NOT_SUPPORTED ? "Not Supported" : "Unknown Error"; }
knvml_return nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return 0; }
knvml_return nvmlDeviceGetHandleByIndex_v2(unsigned i, knvml_device *d) {
    if (i >= 2) return INVALID_ARGUMENT;
    *d = &gpus[i];
    return 0;
}
knvml_return nvmlDeviceGetName(knvml_device d, char *s, unsigned n) { DEV(d); snprintf(s, n, "NVIDIA H200"); return 0; }
knvml_return nvmlDeviceGetUUID(knvml_device d, char *s, unsigned n) {
    DEV(d);
    snprintf(s, n, "GPU-0000000%d-1111-2222-3333-444444444444", i);
    return 0;
}
knvml_return nvmlDeviceGetMinorNumber(knvml_device d, unsigned *m) { DEV(d); *m = (unsigned)i; return 0; }
knvml_return nvmlDeviceGetPciInfo_v3(knvml_device d, knvml_pci_info *p) {
    DEV(d);
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", 0x19 + i);
    return 0;
}
knvml_return nvmlDeviceGetUtilizationRates(knvml_device d, knvml_utilization *u) {
    DEV(d);
    if (knob[i][UTIL] == UNSUPPORTED) return NOT_SUPPORTED;
    u->gpu = (unsigned)knob[i][UTIL], u->memory = i ? 3 : 41;
    return 0;
}
knvml_return nvmlDeviceGetMemoryInfo(knvml_device d, knvml_memory *m) {
    DEV(d);
    m->total = 143771ull << 20, m->used = (i ? 1000ull : 30000ull) << 20, m->free = m->total - m->used;
    return 0;
}
knvml_return nvmlDeviceGetTemperature(knvml_device d, unsigned sensor, unsigned *t) {
    DEV(d);
    if (sensor != 0) return INVALID_ARGUMENT;
    KNOB(TEMP, t);
    return 0;
}
knvml_return nvmlDeviceGetPowerUsage(knvml_device d, unsigned *mw) {
    DEV(d);
    if (i) return NOT_SUPPORTED;
    *mw = 412345;
    return 0;
}
knvml_return nvmlDeviceGetTotalEnergyConsumption(knvml_device d, unsigned long long *mj) {
    DEV(d);
    *mj = 123456789ull + (unsigned long long)i;
    return 0;
}
knvml_return nvmlDeviceGetClockInfo(knvml_device d, unsigned type, unsigned *mhz) {
    DEV(d);
    if (type == 2) *mhz = 3201;
    else if (type != 1) return INVALID_ARGUMENT;
    else { KNOB(SM_CLOCK, mhz); }
    return 0;
}
knvml_return nvmlDeviceGetMaxClockInfo(knvml_device d, unsigned type, unsigned *mhz) {
    DEV(d);
    if (type != 1) return INVALID_ARGUMENT;
    KNOB(MAX_SM_CLOCK, mhz);
    return 0;
}
knvml_return nvmlDeviceGetPcieReplayCounter(knvml_device d, unsigned *n) { DEV(d); *n = i ? 0 : 3; return 0; }
knvml_return nvmlDeviceGetTotalEccErrors(knvml_device d, unsigned type, unsigned counter, unsigned long long *n) {
    DEV(d);
    if (counter != 0) return INVALID_ARGUMENT;
    if (type == 0) *n = i ? 0 : 5;
    else if (knob[i][ECC_UNCORRECTED] == UNSUPPORTED) return NOT_SUPPORTED;
    else *n = (unsigned long long)knob[i][ECC_UNCORRECTED];
    return 0;
}
knvml_return nvmlDeviceGetRemappedRows(knvml_device d, unsigned *corr, unsigned *unc, unsigned *pending,
                                       unsigned *failed) {
    DEV(d);
    KNOB(REMAPPED_CORRECTABLE, corr);
    KNOB(REMAPPED_UNCORRECTABLE, unc);
    KNOB(REMAP_PENDING, pending);
    KNOB(REMAP_FAILURE, failed);
    return 0;
}
/* the older name of nvmlDeviceGetCurrentClocksEventReasons (see the top) */
knvml_return nvmlDeviceGetCurrentClocksThrottleReasons(knvml_device d, unsigned long long *reasons) {
    DEV(d);
    if (knob[i][CLOCK_EVENT_REASONS] == UNSUPPORTED) return NOT_SUPPORTED;
    *reasons = (unsigned long long)knob[i][CLOCK_EVENT_REASONS];
    return 0;
}
knvml_return nvmlEventSetCreate(knvml_event_set *s) { *s = &events; return 0; }
knvml_return nvmlDeviceRegisterEvents(knvml_device d, unsigned long long types, knvml_event_set s) {
    (void)d, (void)s;
    return types == KNVML_EVENT_TYPE_XID_CRITICAL_ERROR ? 0 : INVALID_ARGUMENT;
}
knvml_return nvmlEventSetWait_v2(knvml_event_set s, knvml_event_data *e, unsigned timeout_ms) {
    (void)timeout_ms;
    if (s->next == s->n) return KNVML_ERROR_TIMEOUT;
    memset(e, 0, sizeof *e);
    e->device = &gpus[s->gpu[s->next]], e->eventType = KNVML_EVENT_TYPE_XID_CRITICAL_ERROR;
    e->eventData = s->xid[s->next++];
    return 0;
}
knvml_return nvmlEventSetFree(knvml_event_set s) { (void)s; return 0; }
