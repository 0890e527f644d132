/* backend/profiled.c: a backend that times another's calls
 * (keel_backend_profiled in keel/backend.h, train.profile_steps). While the
 * window is open every call is bracketed by the wrapped backend's sync, so
 * its time is the call's alone on the device, with nothing before it still
 * running and nothing beside it; closed, a call costs one branch. The
 * totals are the one thread's that opens the window. */
#include <stdlib.h>
#include <string.h>

#include "backend/passthrough.h"
#include "keel/backend.h"

enum {
#define OP(name, params, args) P_##name,
    KEEL_BACKEND_FLOP_CALLS(OP) KEEL_BACKEND_OTHER_CALLS(OP) KEEL_BACKEND_DOUBLE_CALLS(OP)
#undef OP
    P_iallgather, P_ireduce_scatter, P_allreduce, P_wait, P_COUNT
};
static const char *const OP_NAMES[P_COUNT] = {
#define OP(name, params, args) #name,
    KEEL_BACKEND_FLOP_CALLS(OP) KEEL_BACKEND_OTHER_CALLS(OP) KEEL_BACKEND_DOUBLE_CALLS(OP)
#undef OP
    "all_gather", "reduce_scatter", "all_reduce", "collective_wait",
};

_Static_assert(P_COUNT <= KEEL_BACKEND_PROFILE_OPS, "keel/backend.h's bound on the profile's calls");

static const keel_backend *inner;
static keel_backend table;
/* Open in the thread that opened it only: the calls another thread makes
 * meanwhile (a CPU run's snapshot copies, beside the step) are not the step's. */
static _Thread_local bool window;
static keel_status pending = KEEL_OK; /* the first failure a timing sync saw, for the next sync */
static keel_backend_op_time stats[P_COUNT];

static void settle(void) {
    keel_status st = inner->sync();
    if (pending == KEEL_OK) pending = st;
}
/* The start of a timed call: -1 when the window is closed. */
static double begin(void) {
    if (!window) return -1;
    settle();
    return keel_now_s();
}
static void end(int op, double t0, double flops) {
    if (t0 < 0) return;
    settle();
    stats[op].calls++;
    stats[op].seconds += keel_now_s() - t0;
    stats[op].flops += flops;
}

/* The FLOPs a call does: 2 per multiply-add of its products. Attention is
 * causal: a head's query i meets keys 0..i, T(T+1)/2 pairs, each 2 products
 * of HS multiply-adds forward (QKᵀ, PV) and 5 backward (S again, dV, dP, dQ, dK). */
static double attention_flops(int products, int B, int T, int NH, int HS) {
    return 2.0 * products * B * NH * HS * ((double)T * (T + 1) / 2);
}
#define FLOPS_matmul_forward(o, i, w, M, N, K, acc) (2.0 * (M) * (N) * (K))
#define FLOPS_matmul_backward(di, dw, dy, i, w, M, N, K, acc) (((di) ? 4.0 : 2.0) * (M) * (N) * (K))
#define FLOPS_gemm_bf16(o, a, at, b, bt, M, N, K, acc) (2.0 * (M) * (N) * (K))
#define FLOPS_matmul_few_rows FLOPS_matmul_forward
#define FLOPS_matmul_few_rows_bf16 FLOPS_matmul_forward
#define FLOPS_attention_forward(o, l, q, k, v, ks, B, T, NH, NKV, HS) attention_flops(2, B, T, NH, HS)
#define FLOPS_attention_forward_bf16 FLOPS_attention_forward
#define FLOPS_attention_backward(dq, dk, dv, dy, o, l, q, k, v, ks, B, T, NH, NKV, HS) \
    attention_flops(5, B, T, NH, HS)
#define FLOPS_attention_backward_bf16 FLOPS_attention_backward

#define TIMED_FLOPS(name, params, args)                                                                                \
    static void p_##name params {                                                                                      \
        double t0 = begin();                                                                                           \
        inner->name args;                                                                                              \
        end(P_##name, t0, FLOPS_##name args);                                                                          \
    }
#define TIMED(name, params, args)                                                                                      \
    static void p_##name params {                                                                                      \
        double t0 = begin();                                                                                           \
        inner->name args;                                                                                              \
        end(P_##name, t0, 0);                                                                                          \
    }
#define TIMED_DOUBLE(name, params, args)                                                                               \
    static double p_##name params {                                                                                    \
        double t0 = begin();                                                                                           \
        double r = inner->name args;                                                                                   \
        end(P_##name, t0, 0);                                                                                          \
        return r;                                                                                                      \
    }
KEEL_BACKEND_FLOP_CALLS(TIMED_FLOPS)
KEEL_BACKEND_OTHER_CALLS(TIMED)
KEEL_BACKEND_DOUBLE_CALLS(TIMED_DOUBLE)
#define COLLECTIVE_PARAMS                                                                                              \
    (keel_comm *c, const void *send, void *recv, size_t count, keel_comm_dtype dtype, keel_backend_req **req)
#define COLLECTIVE_ARGS (c, send, recv, count, dtype, req)
TIMED(iallgather, COLLECTIVE_PARAMS, COLLECTIVE_ARGS)
TIMED(ireduce_scatter, COLLECTIVE_PARAMS, COLLECTIVE_ARGS)
TIMED(allreduce, (keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype), (c, buf, count, dtype))
TIMED(wait, (keel_backend_req *req), (req))
/* A node window's gather and reduce-scatter are the collectives' issue; its claim and wait are waits */
static void p_window_gather(keel_comm_window *w, int s, void *part, const float *src, int64_t n, bool bf16) {
    double t0 = begin();
    inner->window_gather(w, s, part, src, n, bf16);
    end(P_iallgather, t0, 0);
}
static void p_window_reduce_scatter(keel_comm_window *w, int s, size_t stride, size_t count, keel_comm_dtype dtype,
                                    keel_backend_req **req) {
    double t0 = begin();
    inner->window_reduce_scatter(w, s, stride, count, dtype, req);
    end(P_ireduce_scatter, t0, 0);
}
static void p_window_claim(keel_comm_window *w, int s) {
    double t0 = begin();
    inner->window_claim(w, s);
    end(P_wait, t0, 0);
}
static void p_window_wait(keel_comm_window *w, int s) {
    double t0 = begin();
    inner->window_wait(w, s);
    end(P_wait, t0, 0);
}

static keel_status p_sync(void) {
    keel_status st = inner->sync(), kept = pending;
    pending = KEEL_OK;
    return kept != KEEL_OK ? kept : st;
}

const keel_backend *keel_backend_profiled(const keel_backend *of) {
    KEEL_CHECK(!inner || inner == of, "one profiled backend per process");
    if (inner) return &table;
    inner = of;
    table = *of; /* memory, pinning, attach, stalls: as they are */
/* a call the inner backend lacks (cuda's generation kernels) stays NULL */
#define SET(name, params, args) table.name = of->name ? p_##name : NULL;
    KEEL_BACKEND_FLOP_CALLS(SET) KEEL_BACKEND_OTHER_CALLS(SET) KEEL_BACKEND_DOUBLE_CALLS(SET)
#undef SET
    table.iallgather = p_iallgather, table.ireduce_scatter = p_ireduce_scatter, table.allreduce = p_allreduce;
    table.wait = p_wait, table.sync = p_sync;
    if (of->window_create)
        table.window_claim = p_window_claim, table.window_gather = p_window_gather, table.window_wait = p_window_wait,
        table.window_reduce_scatter = p_window_reduce_scatter;
    return &table;
}

void keel_backend_profile_window(bool open) {
    if (inner && open != window) settle(); /* what came before is not the window's, nor after it */
    window = open;
}

static int by_seconds(const void *a, const void *b) {
    double x = ((const keel_backend_op_time *)a)->seconds, y = ((const keel_backend_op_time *)b)->seconds;
    return (x < y) - (x > y);
}

int keel_backend_profile_read(keel_backend_op_time *out, int cap) {
    int n = 0;
    for (int i = 0; i < P_COUNT && n < cap; i++)
        if (stats[i].calls > 0) {
            out[n] = stats[i];
            out[n++].op = OP_NAMES[i];
        }
    qsort(out, (size_t)n, sizeof *out, by_seconds);
    return n;
}
