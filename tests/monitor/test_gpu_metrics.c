/* GPU gauges named as dcgm-exporter names them, read through NVML: with the
 * stand-in library of two GPUs (tests/monitor/nvml_stand_in.c, fixed readings)
 * every reading appears with its labels and unit conversion, a reading a GPU
 * does not support has no sample (not a zero), an XID is kept across scrapes;
 * with no NVML there is no GPU sample at all and keel_nvml_up is 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/monitor.h"

#include "../testlib.h"

/* The value of the sample whose line starts with `series ` (NAN when absent). */
static double sample(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
    return NAN;
}

static double gpu(const char *text, const char *name, int i) {
    char node[256], series[1024];
    keel_node_name(node, sizeof node);
    snprintf(series, sizeof series,
             "%s{gpu=\"%d\",UUID=\"GPU-0000000%d-1111-2222-3333-444444444444\",pci_bus_id=\"00000000:%02X:00.0\","
             "device=\"nvidia%d\",modelName=\"NVIDIA H200\",Hostname=\"%s\"}",
             name, i, i, 0x19 + i, i, node);
    return sample(text, series);
}

int main(void) {
    const char *stand_in = getenv("KEEL_NVML_STAND_IN");
    EXPECT(stand_in && *stand_in, "KEEL_NVML_STAND_IN names the stand-in library (set by CMake)");
    if (!stand_in) return test_summary("test_gpu_metrics");
    char dir[256];
    if (!temp_dir_create(dir, sizeof dir, "gpu-metrics")) return 1;

    setenv("KEEL_NVML_LIB", stand_in, 1);
    keel_exporter *x = keel_exporter_new(dir);
    char *t = keel_exporter_render(x);
    EXPECT(sample(t, "keel_nvml_up") == 1, "keel_nvml_up %g", sample(t, "keel_nvml_up"));
    EXPECT(gpu(t, "DCGM_FI_DEV_GPU_UTIL", 0) == 87 && gpu(t, "DCGM_FI_DEV_GPU_UTIL", 1) == 12 &&
               gpu(t, "DCGM_FI_DEV_MEM_COPY_UTIL", 0) == 41,
           "utilisation per GPU with dcgm-exporter's labels: %g %g", gpu(t, "DCGM_FI_DEV_GPU_UTIL", 0),
           gpu(t, "DCGM_FI_DEV_GPU_UTIL", 1));
    EXPECT(gpu(t, "DCGM_FI_DEV_FB_USED", 0) == 30000 && gpu(t, "DCGM_FI_DEV_FB_FREE", 0) == 143771 - 30000,
           "framebuffer in MiB: used %g free %g", gpu(t, "DCGM_FI_DEV_FB_USED", 0), gpu(t, "DCGM_FI_DEV_FB_FREE", 0));
    EXPECT(gpu(t, "DCGM_FI_DEV_POWER_USAGE", 0) == 412.345 && isnan(gpu(t, "DCGM_FI_DEV_POWER_USAGE", 1)),
           "power in W; GPU 1 does not report it, so it has no sample (%g)", gpu(t, "DCGM_FI_DEV_POWER_USAGE", 1));
    EXPECT(gpu(t, "DCGM_FI_DEV_GPU_TEMP", 0) == 61 && gpu(t, "DCGM_FI_DEV_SM_CLOCK", 0) == 1980 &&
               gpu(t, "DCGM_FI_DEV_MAX_SM_CLOCK", 1) == 1980 &&
               gpu(t, "DCGM_FI_DEV_MEM_CLOCK", 1) == 3201 && gpu(t, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 0) == 3 &&
               gpu(t, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1) == 123456790,
           "temperature, clocks, PCIe replays, energy");
    EXPECT(gpu(t, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0) == 5 && gpu(t, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0) == 0,
           "ECC counts");
    EXPECT(gpu(t, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 0) == 2 && gpu(t, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 0) == 0 &&
               isnan(gpu(t, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1)),
           "remapped rows on GPU 0; none reported by GPU 1");
    EXPECT(gpu(t, "DCGM_FI_DEV_XID_ERRORS", 1) == 79 && gpu(t, "DCGM_FI_DEV_XID_ERRORS", 0) == 0,
           "XID 79 on GPU 1 (%g), none on GPU 0", gpu(t, "DCGM_FI_DEV_XID_ERRORS", 1));
    EXPECT(strstr(t, "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n") &&
               strstr(t, "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n"),
           "DCGM types declared");
    keel_free(t);
    t = keel_exporter_render(x);
    EXPECT(gpu(t, "DCGM_FI_DEV_XID_ERRORS", 1) == 79, "the XID stays the last one at the next scrape");
    keel_free(t);
    keel_exporter_free(x);

    /* no NVML: no GPU sample, and the exporter says so */
    setenv("KEEL_NVML_LIB", "/nonexistent/libnvidia-ml.so.1", 1);
    x = keel_exporter_new(dir);
    t = keel_exporter_render(x);
    EXPECT(sample(t, "keel_nvml_up") == 0 && !strstr(t, "DCGM_FI_"), "without NVML: keel_nvml_up %g, DCGM lines %s",
           sample(t, "keel_nvml_up"), strstr(t, "DCGM_FI_") ? "present" : "absent");
    keel_free(t);
    keel_exporter_free(x);
    remove_tree(dir);
    return test_summary("test_gpu_metrics");
}
