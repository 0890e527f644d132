/* core/nvml_abi.h: the part of NVML's C ABI keel calls (src/core/gpu.c), declared
 * here because keel opens libnvidia-ml.so.1 with dlopen and builds where no
 * nvml.h is installed. tests/core/nvml_abi_check.c compiles them against the
 * real nvml.h (where one is found) and fails the build on any difference: the
 * handles share NVML's struct tags, the structs' layouts are compared, and the
 * functions' types are checked with NVML's structs put in for ours
 * (KNVML_STRUCT). Enums are unsigned int: NVML's have no negative values.
 * KNVML_OPTIONAL_FUNCTIONS are calls an NVML may lack (or have under an older
 * name): keel reads them when present and reports "not reported" otherwise. */
#ifndef KEEL_NVML_ABI_H
#define KEEL_NVML_ABI_H

typedef unsigned int knvml_return; /* nvmlReturn_t: NVML_SUCCESS = 0 */
typedef struct nvmlDevice_st *knvml_device;
typedef struct nvmlEventSet_st *knvml_event_set;

enum {
    KNVML_SUCCESS = 0,
    KNVML_ERROR_TIMEOUT = 10,
    KNVML_CLOCK_SM = 1,
    KNVML_CLOCK_MEM = 2,
    KNVML_TEMPERATURE_GPU = 0,
    KNVML_MEMORY_ERROR_TYPE_CORRECTED = 0,
    KNVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1,
    KNVML_VOLATILE_ECC = 0,
};
#define KNVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x0000000000000008ULL
/* nvmlClocksEventReason* (formerly nvmlClocksThrottleReason*): why the clocks are below their maximum */
#define KNVML_CLOCKS_EVENT_GPU_IDLE 0x0000000000000001ULL
#define KNVML_CLOCKS_EVENT_APPLICATIONS_CLOCKS_SETTING 0x0000000000000002ULL
#define KNVML_CLOCKS_EVENT_SW_POWER_CAP 0x0000000000000004ULL
#define KNVML_CLOCKS_EVENT_HW_SLOWDOWN 0x0000000000000008ULL
#define KNVML_CLOCKS_EVENT_SYNC_BOOST 0x0000000000000010ULL
#define KNVML_CLOCKS_EVENT_SW_THERMAL_SLOWDOWN 0x0000000000000020ULL
#define KNVML_CLOCKS_EVENT_HW_THERMAL_SLOWDOWN 0x0000000000000040ULL
#define KNVML_CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN 0x0000000000000080ULL
#define KNVML_CLOCKS_EVENT_DISPLAY_CLOCK_SETTING 0x0000000000000100ULL

typedef struct knvml_pci_info {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} knvml_pci_info;
typedef struct knvml_utilization {
    unsigned int gpu, memory; /* percent of the last sample period */
} knvml_utilization;
typedef struct knvml_memory {
    unsigned long long total, free, used; /* bytes */
} knvml_memory;
typedef struct knvml_event_data {
    knvml_device device;
    unsigned long long eventType, eventData; /* eventData: the XID */
    unsigned int gpuInstanceId, computeInstanceId;
} knvml_event_data;

#ifndef KNVML_STRUCT
#define KNVML_STRUCT(ours, nvml) ours
#endif
/* X(name in the library, keel's field, return, parameters) */
#define KNVML_FUNCTIONS(X)                                                                                       \
    X(nvmlInit_v2, init, knvml_return, (void))                                                                   \
    X(nvmlShutdown, shutdown, knvml_return, (void))                                                              \
    X(nvmlErrorString, error_string, const char *, (knvml_return))                                               \
    X(nvmlDeviceGetCount_v2, count, knvml_return, (unsigned int *))                                              \
    X(nvmlDeviceGetHandleByIndex_v2, handle, knvml_return, (unsigned int, knvml_device *))                       \
    X(nvmlDeviceGetName, name, knvml_return, (knvml_device, char *, unsigned int))                               \
    X(nvmlDeviceGetUUID, uuid, knvml_return, (knvml_device, char *, unsigned int))                               \
    X(nvmlDeviceGetMinorNumber, minor, knvml_return, (knvml_device, unsigned int *))                             \
    X(nvmlDeviceGetPciInfo_v3, pci, knvml_return, (knvml_device, KNVML_STRUCT(knvml_pci_info, nvmlPciInfo_t) *)) \
    X(nvmlDeviceGetUtilizationRates, utilization, knvml_return,                                                  \
      (knvml_device, KNVML_STRUCT(knvml_utilization, nvmlUtilization_t) *))                                      \
    X(nvmlDeviceGetMemoryInfo, memory, knvml_return, (knvml_device, KNVML_STRUCT(knvml_memory, nvmlMemory_t) *)) \
    X(nvmlDeviceGetTemperature, temperature, knvml_return, (knvml_device, unsigned int, unsigned int *))         \
    X(nvmlDeviceGetPowerUsage, power, knvml_return, (knvml_device, unsigned int *))                              \
    X(nvmlDeviceGetTotalEnergyConsumption, energy, knvml_return, (knvml_device, unsigned long long *))           \
    X(nvmlDeviceGetClockInfo, clock, knvml_return, (knvml_device, unsigned int, unsigned int *))                 \
    X(nvmlDeviceGetMaxClockInfo, max_clock, knvml_return, (knvml_device, unsigned int, unsigned int *))          \
    X(nvmlDeviceGetPcieReplayCounter, pcie_replay, knvml_return, (knvml_device, unsigned int *))                 \
    X(nvmlDeviceGetTotalEccErrors, ecc, knvml_return,                                                            \
      (knvml_device, unsigned int, unsigned int, unsigned long long *))                                          \
    X(nvmlDeviceGetRemappedRows, remapped_rows, knvml_return,                                                    \
      (knvml_device, unsigned int *, unsigned int *, unsigned int *, unsigned int *))                            \
    X(nvmlEventSetCreate, event_set_create, knvml_return, (knvml_event_set *))                                   \
    X(nvmlDeviceRegisterEvents, register_events, knvml_return,                                                   \
      (knvml_device, unsigned long long, knvml_event_set))                                                       \
    X(nvmlEventSetWait_v2, event_wait, knvml_return,                                                             \
      (knvml_event_set, KNVML_STRUCT(knvml_event_data, nvmlEventData_t) *, unsigned int))                        \
    X(nvmlEventSetFree, event_set_free, knvml_return, (knvml_event_set))

/* X(name in the library, the older name of the same ABI, keel's field, return, parameters):
 * nvmlDeviceGetCurrentClocksEventReasons is today's name for what older
 * drivers call nvmlDeviceGetCurrentClocksThrottleReasons (a bitmask of
 * KNVML_CLOCKS_EVENT_*). */
#define KNVML_OPTIONAL_FUNCTIONS(X)                                                                          \
    X(nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetCurrentClocksThrottleReasons, clock_event_reasons, \
      knvml_return, (knvml_device, unsigned long long *))

#endif
