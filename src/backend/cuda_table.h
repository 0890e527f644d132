/* backend/cuda_table.h: the CUDA backend's table (cuda.c), for
 * keel_backend_get, and its collectives (cuda_nccl.c), for the table. */
#ifndef KEEL_BACKEND_CUDA_TABLE_H
#define KEEL_BACKEND_CUDA_TABLE_H

#include "keel/backend.h"

/* keel/cuda.h's kernels as a backend; NULL in a keel built without CUDA. */
const keel_backend *keel_backend_cuda_table(void);

#ifdef KEEL_HAVE_CUDA
/* The CUDA table's collectives (cuda_nccl.c): NCCL, opened on first use. */
keel_status keel_backend_cuda_attach(keel_comm *world);
void keel_backend_cuda_iallgather(keel_comm *c, const void *send, void *recv, size_t count, keel_comm_dtype dtype,
                                  keel_backend_req **req);
void keel_backend_cuda_ireduce_scatter(keel_comm *c, const void *send, void *recv, size_t count,
                                       keel_comm_dtype dtype, keel_backend_req **req);
void keel_backend_cuda_allreduce(keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype);
void keel_backend_cuda_wait(keel_backend_req *req);
void keel_backend_cuda_release_group(keel_comm *c);
double keel_backend_cuda_comm_stall_s(void);
#endif

#endif
