/* backend/cuda_nccl.c: the CUDA backend's collectives (keel/backend.h) —
 * NCCL on one communication stream, ordered against the compute stream (the
 * legacy default stream every keel kernel runs on) by events, so the host
 * never blocks on a transfer:
 *
 *   compute stream  ..kernel──●issued                 wait(req)──►kernel..
 *                              ╲                          ▲
 *   comm stream                 ╰─►ncclAllGather──●done───╯
 *
 * One comm stream for every group: NCCL kernels then run in issue order,
 * which every rank shares (SPMD), so two communicators' kernels can never
 * wait on each other in opposite orders on two GPUs. Each group gets its
 * communicator on its first collective: its rank 0 makes the unique id, the
 * group's MPI broadcasts it. Every failure is fatal with a line (MPI is
 * fail-stop too). */
#include "backend/cuda_table.h"

#if defined(KEEL_HAVE_CUDA) && !defined(KEEL_HAVE_NCCL)
/* A CUDA build without nccl.h: one GPU trains; ranks on GPUs are refused at attach. */
keel_status keel_backend_cuda_attach(keel_comm *world) {
    (void)world;
    keel_errorf("device cuda with --nproc: this keel was built without NCCL (CMake found no nccl.h); rebuild with "
                "-DKEEL_NCCL_INCLUDE=DIR, or train on one GPU without --nproc");
    return KEEL_ERR_INPUT;
}
#define UNREACHABLE KEEL_CHECK(false, "a collective without NCCL: attach refuses first")
void keel_backend_cuda_iallgather(keel_comm *c, const void *send, void *recv, size_t count, keel_comm_dtype dtype,
                                  keel_backend_req **req) {
    (void)c, (void)send, (void)recv, (void)count, (void)dtype, (void)req;
    UNREACHABLE;
}
void keel_backend_cuda_ireduce_scatter(keel_comm *c, const void *send, void *recv, size_t count,
                                       keel_comm_dtype dtype, keel_backend_req **req) {
    (void)c, (void)send, (void)recv, (void)count, (void)dtype, (void)req;
    UNREACHABLE;
}
void keel_backend_cuda_allreduce(keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype) {
    (void)c, (void)buf, (void)count, (void)dtype;
    UNREACHABLE;
}
void keel_backend_cuda_wait(keel_backend_req *req) {
    (void)req;
    UNREACHABLE;
}
void keel_backend_cuda_release_group(keel_comm *c) { (void)c; } /* nothing was made */
double keel_backend_cuda_comm_stall_s(void) { return 0; }
#elif defined(KEEL_HAVE_CUDA)
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/cuda.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 13, 0)
#error "nccl.h is older than NCCL 2.13 (ncclGetLastError): point KEEL_NCCL_INCLUDE at a newer one"
#endif

/* NCCL is opened on the first use (dlopen), not linked: like cuBLASLt
 * (src/cuda/gemm.cu), loading it at start would cost every keel command, GPU
 * or not. Its header gives the functions' types. */
#define NCCL_FUNCTIONS(X)                \
    X(ncclGetVersion, get_version)       \
    X(ncclGetErrorString, error_string)  \
    X(ncclGetUniqueId, get_unique_id)    \
    X(ncclCommInitRank, comm_init_rank)  \
    X(ncclCommDestroy, comm_destroy)     \
    X(ncclAllGather, all_gather)         \
    X(ncclReduceScatter, reduce_scatter) \
    X(ncclAllReduce, all_reduce)

static struct {
#define FIELD(sym, field) __typeof__(&sym) field;
    NCCL_FUNCTIONS(FIELD)
#undef FIELD
    __typeof__(&ncclGetLastError) last_error; /* NULL before NCCL 2.13 */
} nccl;

#define NCCL_FIX "put NCCL's lib directory on LD_LIBRARY_PATH (PyTorch wheels have it at site-packages/nvidia/nccl/lib)"

/* The library and its functions, once; false after a line saying why. */
static bool nccl_load(void) {
    static int loaded; /* 0 not tried, 1 ok, -1 failed */
    if (loaded) return loaded > 0;
    loaded = -1;
    const char *names[] = {"libnccl.so.2", "libnccl.so"};
    char first_error[512] = "";
    void *lib = NULL;
    for (size_t i = 0; !lib && i < sizeof names / sizeof *names; i++) {
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib && i == 0) snprintf(first_error, sizeof first_error, "%s", dlerror());
    }
    if (!lib) {
        keel_errorf("cannot load NCCL (%s); %s", first_error, NCCL_FIX);
        return false;
    }
    /* A function pointer from dlsym goes through memcpy: ISO C has no cast between data and code pointers. */
#define LOAD(sym, field)                                                                    \
    {                                                                                       \
        void *p = dlsym(lib, #sym);                                                         \
        if (!p) {                                                                           \
            keel_errorf("the NCCL library found has no %s (too old?); %s", #sym, NCCL_FIX); \
            return false;                                                                   \
        }                                                                                   \
        memcpy(&nccl.field, &p, sizeof p);                                                  \
    }
    NCCL_FUNCTIONS(LOAD)
#undef LOAD
    void *p = dlsym(lib, "ncclGetLastError");
    if (p) memcpy(&nccl.last_error, &p, sizeof p);
    int version = 0;
    /* NCCL_VERSION(2, 10, 0): bf16 reductions */
    if (nccl.get_version(&version) != ncclSuccess || version < 21000) {
        bool old = version < 10000; /* codes before 2.9 are X*1000 + Y*100 + Z */
        int major = old ? version / 1000 : version / 10000, minor = old ? version / 100 % 10 : version / 100 % 100;
        keel_errorf("NCCL %d.%d is too old: keel needs 2.10 or newer (bf16); %s", major, minor, NCCL_FIX);
        return false;
    }
    loaded = 1;
    return true;
}

static void cuda_must(cudaError_t e, const char *call) {
    if (e == cudaSuccess) return;
    keel_errorf("CUDA %s: %s", call, cudaGetErrorString(e));
    abort();
}

/* comm, when there is one, adds NCCL's own account of the failure (on one line). */
static void nccl_must(ncclResult_t r, const char *call, ncclComm_t comm) {
    if (r == ncclSuccess) return;
    char detail[512] = "";
    const char *last = nccl.last_error ? nccl.last_error(comm) : NULL;
    if (last && *last) {
        snprintf(detail, sizeof detail, " (%s)", last);
        for (char *s = detail; *s; s++)
            if (*s == '\n' || *s == '\r') *s = ' ';
    }
    keel_errorf("NCCL %s: %s%s", call, nccl.error_string(r), detail);
    abort();
}

/* ---- the streams, events and requests ----------------------------------- */

#define COMPUTE ((cudaStream_t)0) /* the legacy default stream: keel's kernels and copies */

static cudaStream_t g_comm;   /* non-blocking: no implicit sync with COMPUTE */
static cudaEvent_t g_issued;  /* recorded on COMPUTE before each collective */
static cudaEvent_t g_reduced; /* allreduce's end, waited for by COMPUTE at once */

struct keel_backend_req {
    cudaEvent_t done;       /* recorded on g_comm after the collective */
    keel_backend_req *next; /* in the free list */
};
static keel_backend_req *g_free_reqs; /* recycled: no event made or destroyed per call */

/* On the device attach chose: made on the first collective. */
static void streams_init(void) {
    if (g_comm) return;
    /* the highest priority, so a collective's kernels get SMs as soon as
     * blocks free up instead of queueing behind the compute kernels they overlap */
    int least = 0, greatest = 0;
    cuda_must(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    cuda_must(cudaStreamCreateWithPriority(&g_comm, cudaStreamNonBlocking, greatest),
              "cudaStreamCreateWithPriority (the communication stream)");
    cuda_must(cudaEventCreateWithFlags(&g_issued, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cuda_must(cudaEventCreateWithFlags(&g_reduced, cudaEventDisableTiming), "cudaEventCreateWithFlags");
}

/* the comm stream goes on once COMPUTE has done everything issued so far
 * (the collective reads what those calls left) */
static void comm_after_compute(void) {
    cuda_must(cudaEventRecord(g_issued, COMPUTE), "cudaEventRecord (compute stream)");
    cuda_must(cudaStreamWaitEvent(g_comm, g_issued, 0), "cudaStreamWaitEvent (communication stream)");
}

/* a request whose event marks the end of what g_comm has been given so far */
static keel_backend_req *req_now(void) {
    keel_backend_req *r = g_free_reqs;
    if (r) {
        g_free_reqs = r->next;
    } else {
        r = keel_xcalloc(sizeof *r, "a collective's request");
        cuda_must(cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
    cuda_must(cudaEventRecord(r->done, g_comm), "cudaEventRecord (communication stream)");
    return r;
}

/* ---- the compute stream's stalls, timed on the GPU -----------------------
 * The host never waits for a collective, so its clock cannot say how long
 * compute waited for one. Each wait is bracketed by two timed events on
 * COMPUTE: the first completes when the work before the wait is done, the
 * second when the collective is too; their gap is the compute stream's
 * idle time (~0 when communication was hidden). comm_stall_s reads and
 * recycles them once the step is over (the events are complete then: the
 * loss has come back to the host). */

#define MAX_STALLS 65536 /* one step's waits, many times over; beyond, the oldest are read at once */

static struct {
    cudaEvent_t before, after;
} *g_stalls;
static int g_nstalls, g_stall_cap;
static double g_stalled_s; /* read but not yet returned */

static void read_stalls(void) {
    for (int i = 0; i < g_nstalls; i++) {
        float ms = 0;
        cuda_must(cudaEventSynchronize(g_stalls[i].after), "cudaEventSynchronize");
        cuda_must(cudaEventElapsedTime(&ms, g_stalls[i].before, g_stalls[i].after), "cudaEventElapsedTime");
        g_stalled_s += ms / 1e3;
    }
    g_nstalls = 0;
}

/* COMPUTE waits for ev, timed */
static void compute_waits_for(cudaEvent_t ev) {
    if (g_nstalls == MAX_STALLS) read_stalls();
    if (g_nstalls == g_stall_cap) { /* the first steps only: the same waits every step */
        int cap = g_stall_cap ? 2 * g_stall_cap : 256;
        g_stalls = keel_xrealloc(g_stalls, sizeof *g_stalls * (size_t)cap, "stall events");
        for (int i = g_stall_cap; i < cap; i++) {
            cuda_must(cudaEventCreate(&g_stalls[i].before), "cudaEventCreate");
            cuda_must(cudaEventCreate(&g_stalls[i].after), "cudaEventCreate");
        }
        g_stall_cap = cap;
    }
    cuda_must(cudaEventRecord(g_stalls[g_nstalls].before, COMPUTE), "cudaEventRecord (compute stream)");
    cuda_must(cudaStreamWaitEvent(COMPUTE, ev, 0), "cudaStreamWaitEvent (compute stream)");
    cuda_must(cudaEventRecord(g_stalls[g_nstalls].after, COMPUTE), "cudaEventRecord (compute stream)");
    g_nstalls++;
}

double keel_backend_cuda_comm_stall_s(void) {
    read_stalls();
    double s = g_stalled_s;
    g_stalled_s = 0;
    return s;
}

/* ---- communicators, one per group --------------------------------------- */

#define MAX_GROUPS 64

static struct {
    const keel_comm *group; /* the key; rank and size guard a freed group's address reused unreleased */
    int rank, size;
    ncclComm_t nccl;
} g_groups[MAX_GROUPS];
static int g_ngroups;

/* c's communicator, made on its first collective: collective over c, like the collective itself. */
static ncclComm_t group_nccl(keel_comm *c) {
    int rank = keel_comm_rank(c), size = keel_comm_size(c);
    for (int i = 0; i < g_ngroups; i++)
        if (g_groups[i].group == c) {
            KEEL_CHECK(g_groups[i].rank == rank && g_groups[i].size == size,
                       "a group freed without release_group: its address now names another");
            return g_groups[i].nccl;
        }
    KEEL_CHECK(g_ngroups < MAX_GROUPS, "more than %d groups with NCCL communicators", MAX_GROUPS);
    if (!nccl_load()) abort(); /* it has said why */
    streams_init();
    /* broadcast as doubles: keel_comm moves them untouched, and 8 divides the id's size */
    _Static_assert(sizeof(ncclUniqueId) % sizeof(double) == 0, "ncclUniqueId is not a whole number of doubles");
    union {
        ncclUniqueId id;
        double words[sizeof(ncclUniqueId) / sizeof(double)];
    } u;
    memset(&u, 0, sizeof u);
    if (rank == 0) nccl_must(nccl.get_unique_id(&u.id), "ncclGetUniqueId", NULL);
    if (keel_comm_broadcast(c, u.words, sizeof u.words / sizeof u.words[0], KEEL_COMM_F64, 0) != KEEL_OK) {
        keel_errorf("NCCL: the broadcast of a group's ncclUniqueId failed");
        abort();
    }
    ncclComm_t comm = NULL;
    nccl_must(nccl.comm_init_rank(&comm, size, u.id, rank), "ncclCommInitRank", NULL);
    g_groups[g_ngroups].group = c;
    g_groups[g_ngroups].rank = rank;
    g_groups[g_ngroups].size = size;
    g_groups[g_ngroups].nccl = comm;
    g_ngroups++;
    return comm;
}

static ncclDataType_t nccl_type(keel_comm_dtype dtype) {
    switch (dtype) {
    case KEEL_COMM_F32: return ncclFloat32;
    case KEEL_COMM_BF16: return ncclBfloat16;
    case KEEL_COMM_F64: return ncclFloat64;
    }
    KEEL_CHECK(false, "collective of unknown dtype %d", (int)dtype);
}

static bool overlap(const void *a, size_t an, const void *b, size_t bn) {
    const char *x = a, *y = b;
    return x < y + bn && y < x + an;
}

/* ---- the table's entries ------------------------------------------------- */

keel_status keel_backend_cuda_attach(keel_comm *world) {
    char why[256];
    int gpus = keel_cuda_device_count(why, sizeof why);
    int local = keel_comm_local_size(world), local_rank = keel_comm_local_rank(world);
    if (gpus == 0) {
        keel_errorf("device cuda: %s", why);
        return KEEL_ERR_INPUT;
    }
    /* A launcher that gives each task its own GPU (Slurm's --gpus-per-task,
     * CUDA_VISIBLE_DEVICES per rank) shows every rank one GPU: its own. */
    int device = local_rank;
    if (gpus == 1 && local > 1 && getenv("CUDA_VISIBLE_DEVICES")) device = 0;
    else if (local > gpus) {
        keel_errorf("device cuda: %d ranks on this machine but %d GPU(s): FSDP runs one rank per GPU; run at most %d "
                    "ranks per machine", local, gpus, gpus);
        return KEEL_ERR_INPUT;
    }
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        keel_errorf("CUDA cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
        return KEEL_ERR_IO;
    }
    /* here, not at the first collective: a run without NCCL stops before it starts */
    return nccl_load() ? KEEL_OK : KEEL_ERR_INPUT;
}

void keel_backend_cuda_iallgather(keel_comm *c, const void *send, void *recv, size_t count, keel_comm_dtype dtype,
                                  keel_backend_req **req) {
    size_t bytes = count * keel_comm_dtype_size(dtype);
    int rank = keel_comm_rank(c), size = keel_comm_size(c);
    KEEL_CHECK(send == (const char *)recv + (size_t)rank * bytes || !overlap(send, bytes, recv, bytes * size),
               "allgather: send overlaps recv other than in place (recv + rank*count)");
    ncclComm_t comm = group_nccl(c);
    comm_after_compute();
    nccl_must(nccl.all_gather(send, recv, count, nccl_type(dtype), comm, g_comm), "ncclAllGather", comm);
    *req = req_now();
}

void keel_backend_cuda_ireduce_scatter(keel_comm *c, const void *send, void *recv, size_t count,
                                       keel_comm_dtype dtype, keel_backend_req **req) {
    size_t bytes = count * keel_comm_dtype_size(dtype);
    int rank = keel_comm_rank(c), size = keel_comm_size(c);
    KEEL_CHECK(recv == (const char *)send + (size_t)rank * bytes || !overlap(send, bytes * size, recv, bytes),
               "reduce-scatter: recv overlaps send other than in place (send + rank*count)");
    ncclComm_t comm = group_nccl(c);
    comm_after_compute();
    nccl_must(nccl.reduce_scatter(send, recv, count, nccl_type(dtype), ncclSum, comm, g_comm), "ncclReduceScatter",
              comm);
    *req = req_now();
}

void keel_backend_cuda_allreduce(keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype) {
    ncclComm_t comm = group_nccl(c);
    comm_after_compute();
    nccl_must(nccl.all_reduce(buf, buf, count, nccl_type(dtype), ncclSum, comm, g_comm), "ncclAllReduce", comm);
    cuda_must(cudaEventRecord(g_reduced, g_comm), "cudaEventRecord (communication stream)");
    compute_waits_for(g_reduced);
}

/* The compute stream waits for the collective; the host does not. */
void keel_backend_cuda_wait(keel_backend_req *req) {
    KEEL_CHECK(req, "wait for a NULL request");
    compute_waits_for(req->done);
    req->next = g_free_reqs; /* the wait above holds the event's current record: re-recording it later is safe */
    g_free_reqs = req;
}

void keel_backend_cuda_release_group(keel_comm *c) {
    for (int i = 0; i < g_ngroups; i++)
        if (g_groups[i].group == c) {
            /* nothing of the group may still run when its communicator goes */
            cuda_must(cudaStreamSynchronize(g_comm), "cudaStreamSynchronize (communication stream)");
            nccl_must(nccl.comm_destroy(g_groups[i].nccl), "ncclCommDestroy", NULL);
            g_groups[i] = g_groups[--g_ngroups];
            return;
        }
}
#endif
