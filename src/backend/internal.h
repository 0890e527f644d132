/* backend/internal.h: the CUDA backend's table (cuda.c), for keel_backend_get. */
#ifndef KEEL_BACKEND_INTERNAL_H
#define KEEL_BACKEND_INTERNAL_H

#include "keel/backend.h"

/* keel/cuda.h's kernels as a backend; NULL in a keel built without CUDA. */
const keel_backend *keel_backend_cuda_table(void);

#endif
