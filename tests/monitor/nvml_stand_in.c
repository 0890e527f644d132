/* A stand-in for the driver's libnvidia-ml.so.1 with two GPUs of fixed readings,
 * for the tests of keel's NVML path on machines without an NVIDIA driver
 * (KEEL_NVML_LIB points keel at it). It implements only the calls keel makes,
 * with NVML's ABI (src/core/nvml_abi.h); it is never installed or shipped.
 * GPU 1 lacks power and row-remapping readings (NVML_ERROR_NOT_SUPPORTED) and
 * has one XID 79 event waiting. Real readings come from a real GPU (issue 14). */
#include <stdio.h>
#include <string.h>

#include "core/nvml_abi.h"

#define NOT_SUPPORTED 3u
#define INVALID_ARGUMENT 2u

struct nvmlDevice_st {
    int i;
};
struct nvmlEventSet_st {
    int xids_left;
};
static struct nvmlDevice_st gpus[2] = {{0}, {1}};
static struct nvmlEventSet_st events = {1};

#define DEV(d) int i = (d)->i; (void)i
knvml_return nvmlInit_v2(void) { return 0; }
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
    u->gpu = i ? 12 : 87, u->memory = i ? 3 : 41;
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
    *t = i ? 38 : 61;
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
    if (type == 1) *mhz = 1980;
    else if (type == 2) *mhz = 3201;
    else return INVALID_ARGUMENT;
    return 0;
}
knvml_return nvmlDeviceGetMaxClockInfo(knvml_device d, unsigned type, unsigned *mhz) {
    DEV(d);
    if (type != 1) return INVALID_ARGUMENT;
    *mhz = 1980;
    return 0;
}
knvml_return nvmlDeviceGetPcieReplayCounter(knvml_device d, unsigned *n) { DEV(d); *n = i ? 0 : 3; return 0; }
knvml_return nvmlDeviceGetTotalEccErrors(knvml_device d, unsigned type, unsigned counter, unsigned long long *n) {
    DEV(d);
    if (counter != 0) return INVALID_ARGUMENT;
    *n = type == 0 ? (i ? 0 : 5) : 0;
    return 0;
}
knvml_return nvmlDeviceGetRemappedRows(knvml_device d, unsigned *corr, unsigned *unc, unsigned *pending,
                                       unsigned *failed) {
    DEV(d);
    if (i) return NOT_SUPPORTED;
    *corr = 2, *unc = 0, *pending = 0, *failed = 0;
    return 0;
}
knvml_return nvmlEventSetCreate(knvml_event_set *s) { *s = &events; return 0; }
knvml_return nvmlDeviceRegisterEvents(knvml_device d, unsigned long long types, knvml_event_set s) {
    (void)d, (void)s;
    return types == KNVML_EVENT_TYPE_XID_CRITICAL_ERROR ? 0 : INVALID_ARGUMENT;
}
knvml_return nvmlEventSetWait_v2(knvml_event_set s, knvml_event_data *e, unsigned timeout_ms) {
    (void)timeout_ms;
    if (s->xids_left == 0) return KNVML_ERROR_TIMEOUT;
    s->xids_left--;
    memset(e, 0, sizeof *e);
    e->device = &gpus[1], e->eventType = KNVML_EVENT_TYPE_XID_CRITICAL_ERROR, e->eventData = 79;
    return 0;
}
knvml_return nvmlEventSetFree(knvml_event_set s) { (void)s; return 0; }
