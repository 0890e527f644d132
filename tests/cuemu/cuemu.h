/* tests/cuemu/cuemu.h: what the CUDA emulator's runtime (cuemu.cpp) offers
 * its stand-in libraries (fake_cublaslt.c, fake_nccl.c) beyond the CUDA
 * runtime API it implements.
 *
 * The emulator runs keel's CUDA code on the host, for tests on machines with
 * no GPU: "device" memory is host memory, kernels run on one device thread
 * (each CUDA thread a fiber), streams are queues that thread works through
 * in order, honouring events. Nothing measured under it is a GPU number. */
#ifndef KEEL_CUEMU_H
#define KEEL_CUEMU_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Runs fn(arg) on the device thread in order on stream s (0: the legacy
 * default stream), as a kernel issued there would run; fn owns arg. `what`
 * names the work in errors (a static string). The host returns at once. */
void cuemu_enqueue(cudaStream_t s, const char *what, void (*fn)(void *arg), void *arg);

/* Prints "cuemu: <message>" and aborts: for misuse no real library would survive. */
void cuemu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#ifdef __cplusplus
}
#endif
#endif
