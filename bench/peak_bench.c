/* peak_bench: the MFU yardstick's parts at the instruction set KEEL_MAX_ISA
 * leaves (bench/peak.sh runs it at each level): one markdown row per
 * precision, for the threads given (default 2). Not a test. */
#include <stdio.h>
#include <stdlib.h>

#include "keel/kernels.h"

int main(int argc, char **argv) {
    int threads = keel_kernels_init(argc > 1 ? atoi(argv[1]) : 2);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        const char *path = "fp32 (OpenBLAS sgemm)";
        if (bf16) keel_bf16_native(&path);
        double kernel = keel_peak_kernel_flops(bf16), library = keel_peak_library_flops(bf16);
        printf("| %s | %d | %s | %s | %.1f | %.1f | %.1f |\n", keel_isa_name(keel_isa_active()), threads,
               bf16 ? "bf16" : "fp32", path, kernel / 1e9, library / 1e9,
               (kernel > library ? kernel : library) / 1e9);
    }
    keel_kernels_shutdown();
    return 0;
}
