/* keel's declarations of NVML (src/core/nvml_abi.h) against the real nvml.h:
 * built only where CMake finds one (KEEL_NVML_INCLUDE), and then any
 * difference in a function's type or a struct's layout fails the build. */
#include <stddef.h>
#include <stdio.h>

#include <nvml.h>

#define KNVML_STRUCT(ours, nvml) nvml
#include "core/nvml_abi.h"

/* Each function: our pointer type (NVML's structs put in for ours) takes the real function without a cast (-Werror). */
#define CHECK(sym, field, ret, params) { ret(*field) params = sym; (void)field; }
static void check_functions(void) {
    KNVML_FUNCTIONS(CHECK)
}
#undef CHECK
/* Each optional function under both its names; headers before the rename know only the older one. */
#ifdef nvmlClocksEventReasonGpuIdle
#define CHECK_CURRENT(sym, older, field, ret, params) { ret(*field) params = sym; (void)field; }
#else
#define CHECK_CURRENT(sym, older, field, ret, params)
#endif
#define CHECK_OPTIONAL(sym, older, field, ret, params) \
    { ret(*field) params = older; (void)field; } CHECK_CURRENT(sym, older, field, ret, params)
static void check_optional_functions(void) {
    KNVML_OPTIONAL_FUNCTIONS(CHECK_OPTIONAL)
}
#undef CHECK_OPTIONAL
#undef CHECK_CURRENT

#define SAME(ours, theirs, member) \
    _Static_assert(offsetof(ours, member) == offsetof(theirs, member), #theirs "." #member " moved");
_Static_assert(sizeof(knvml_pci_info) == sizeof(nvmlPciInfo_t), "nvmlPciInfo_t changed size");
SAME(knvml_pci_info, nvmlPciInfo_t, busId)
SAME(knvml_pci_info, nvmlPciInfo_t, pciSubSystemId)
_Static_assert(sizeof(knvml_utilization) == sizeof(nvmlUtilization_t), "nvmlUtilization_t changed size");
SAME(knvml_utilization, nvmlUtilization_t, memory)
_Static_assert(sizeof(knvml_memory) == sizeof(nvmlMemory_t), "nvmlMemory_t changed size");
SAME(knvml_memory, nvmlMemory_t, used)
_Static_assert(sizeof(knvml_event_data) == sizeof(nvmlEventData_t), "nvmlEventData_t changed size");
SAME(knvml_event_data, nvmlEventData_t, eventType)
SAME(knvml_event_data, nvmlEventData_t, eventData)
SAME(knvml_event_data, nvmlEventData_t, computeInstanceId)
#define SAME_VALUE(ours, nvml) _Static_assert((long)(ours) == (long)(nvml), #nvml " differs");
SAME_VALUE(KNVML_SUCCESS, NVML_SUCCESS)
SAME_VALUE(KNVML_ERROR_TIMEOUT, NVML_ERROR_TIMEOUT)
SAME_VALUE(KNVML_CLOCK_SM, NVML_CLOCK_SM)
SAME_VALUE(KNVML_CLOCK_MEM, NVML_CLOCK_MEM)
SAME_VALUE(KNVML_TEMPERATURE_GPU, NVML_TEMPERATURE_GPU)
SAME_VALUE(KNVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_CORRECTED)
SAME_VALUE(KNVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
SAME_VALUE(KNVML_VOLATILE_ECC, NVML_VOLATILE_ECC)
_Static_assert(KNVML_EVENT_TYPE_XID_CRITICAL_ERROR == nvmlEventTypeXidCriticalError, "XID event type");
/* the older names: every nvml.h has them */
SAME_VALUE(KNVML_CLOCKS_EVENT_GPU_IDLE, nvmlClocksThrottleReasonGpuIdle)
SAME_VALUE(KNVML_CLOCKS_EVENT_APPLICATIONS_CLOCKS_SETTING, nvmlClocksThrottleReasonApplicationsClocksSetting)
SAME_VALUE(KNVML_CLOCKS_EVENT_SW_POWER_CAP, nvmlClocksThrottleReasonSwPowerCap)
SAME_VALUE(KNVML_CLOCKS_EVENT_HW_SLOWDOWN, nvmlClocksThrottleReasonHwSlowdown)
SAME_VALUE(KNVML_CLOCKS_EVENT_SYNC_BOOST, nvmlClocksThrottleReasonSyncBoost)
SAME_VALUE(KNVML_CLOCKS_EVENT_SW_THERMAL_SLOWDOWN, nvmlClocksThrottleReasonSwThermalSlowdown)
SAME_VALUE(KNVML_CLOCKS_EVENT_HW_THERMAL_SLOWDOWN, nvmlClocksThrottleReasonHwThermalSlowdown)
SAME_VALUE(KNVML_CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN, nvmlClocksThrottleReasonHwPowerBrakeSlowdown)
SAME_VALUE(KNVML_CLOCKS_EVENT_DISPLAY_CLOCK_SETTING, nvmlClocksThrottleReasonDisplayClockSetting)

int main(void) {
    check_functions();
    check_optional_functions();
    puts("PASS: src/core/nvml_abi.h matches " "nvml.h (API " NVML_API_VERSION_STR ")");
    return 0;
}
