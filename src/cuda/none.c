/* cuda/none.c: a keel built without the CUDA backend (no nvcc at build time,
 * or -DKEEL_CUDA=OFF) still answers keel/cuda.h's questions. */
#include <stdio.h>

#include "keel/cuda.h"

#ifndef KEEL_HAVE_CUDA
bool keel_cuda_built(void) { return false; }

int keel_cuda_device_count(char *why, size_t n) {
    snprintf(why, n, "this keel was built without the CUDA backend (CMake found no nvcc; build where the CUDA "
                     "toolkit is installed, with -DKEEL_CUDA=ON)");
    return 0;
}
#endif
