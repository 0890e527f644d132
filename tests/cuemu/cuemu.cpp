// tests/cuemu/cuemu.cpp: a host emulator of the CUDA runtime and execution
// model, so that keel's CUDA backend — its kernels, cuBLASLt and NCCL calls,
// streams and events, as written — runs in tests on machines with no GPU.
// It is test infrastructure: nothing timed under it is a GPU number.
//
//   memory    cudaMalloc is host memory (256-byte aligned); copies and
//             memsets check that their device side lies inside one
//             allocation; cudaFree waits for the device first, as CUDA's does.
//   device    one device thread per process works through the streams'
//             queues: a kernel, copy, memset, library call (cuemu_enqueue),
//             event record or event wait at a time, each stream in order.
//             Which stream goes next is a policy (CUEMU_SCHEDULE):
//               compute-first  the legacy default stream whenever it can run:
//                              the other streams run only when it is empty or
//                              waits on them, as late as their waits allow;
//               comm-first     the other streams as soon as their waits allow.
//             A missing event wait between streams reads or overwrites data
//             too early under one policy or the other.
//   kernels   every CUDA thread of a block is a fiber on the device thread;
//             blocks run one at a time. __syncthreads and the warp
//             collectives (__syncwarp, __shfl_xor_sync, __all_sync, and
//             warp_mma.h's mma and ldmatrix) switch fibers, and the
//             collective runs once every lane its mask names has reached
//             one: a lane that exited or waits elsewhere is reported, as a
//             deadlock or undefined behaviour would be on the hardware.
//             Between barriers the warps run one after another, each as far
//             as it can (forward and backward in turn), and within a warp the
//             lanes run in turn between collectives, forward in even rounds
//             and backward in odd ones: a missing __syncthreads or __syncwarp
//             between a write and another thread's read shows up as a
//             different result. The dynamic shared memory is a fresh
//             allocation per block filled with 0xFF (NaN as float and bf16),
//             exactly the requested size (the sanitizers see overruns).
//   launches  checked like the hardware's: threads per block, grid sizes,
//             dynamic shared memory above 48 KiB only up to what
//             cudaFuncSetAttribute allowed, never above 227 KiB; the error
//             comes back from cudaGetLastError.
//   events    completion follows the stream; timing is the host clock.
//   legacy    stream 0 is the legacy default stream: it and the blocking
//             streams wait for each other; non-blocking streams do not.
// Environment: CUEMU_SCHEDULE (compute-first), CUEMU_MEMORY_MIB (16384, the
// memory cudaMemGetInfo reports), CUEMU_DEVICES (1), CUEMU_TIMEOUT_S (600, a
// host wait that lasts longer stops the run with what it waited for).
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_runtime.h" // the shim's: the built-in variables and collectives defined here

// CUEMU_SANITIZED_PROGRAM: this file is built without the sanitizers (its own
// loops are the emulator's cost, not the code under test) into a program whose
// kernels run under ASan, which must still be told of every stack switch
#if defined(__SANITIZE_ADDRESS__) || defined(CUEMU_SANITIZED_PROGRAM)
#include <sanitizer/common_interface_defs.h>
#define CUEMU_ASAN 1
#else
#define CUEMU_ASAN 0
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

extern "C" void cuemu_fail(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuemu: %s\n", line);
    fflush(stderr);
    abort();
}

static double env_number(const char *name, double fallback) {
    const char *s = getenv(name);
    return s && *s ? atof(s) : fallback;
}

// ---- fibers ------------------------------------------------------------------
// cuemu_switch(save, to): saves the callee-saved registers and the stack
// pointer into *save, then resumes the context whose stack pointer is `to`.
extern "C" void cuemu_switch(void **save, void *to);
asm(".text\n"
    ".globl cuemu_switch\n"
    ".type cuemu_switch,@function\n"
    "cuemu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size cuemu_switch,.-cuemu_switch\n"
    ".section .note.GNU-stack,\"\",@progbits\n"
    ".text\n");

namespace {

enum fiber_state { READY, AT_BARRIER, AT_WARP, DONE };
enum warp_op { WARP_SYNC, WARP_SHFL_XOR, WARP_ALL };

#define STACK_BYTES ((size_t)256 << 10)
#define GUARD_BYTES ((size_t)4096)

struct pending_copy { // a cp.async not yet waited for
    void *dst;
    const void *src;
    bool valid;
    int group;
};

struct fiber {
    void *sp = nullptr;
    char *stack = nullptr; // [guard page | STACK_BYTES]
    void *fake_stack = nullptr;
    fiber_state state = READY;
    int line = 0; // of the collective it waits in
    warp_op op = WARP_SYNC;
    unsigned mask = 0;
    uint64_t value = 0, result = 0;
    int lane_mask = 0, width = 32;
    const void *row = nullptr; // ldmatrix: the row this lane points at
    uint32_t regs[6] = {};     // mma: this lane's a[4], b[2]
    std::vector<pending_copy> copies;
    int committed = 0;         // cp.async groups closed
};

// the block being run (the device thread only)
struct block_run {
    std::vector<fiber> fibers;
    int nthreads = 0, current = -1;
    int at_warp = 0; // fibers waiting in a warp collective
    void *sched_sp = nullptr;
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
    void (*body)(void *) = nullptr;
    void *closure = nullptr;
    const char *kernel = "";
    unsigned char *smem = nullptr;
    size_t smem_bytes = 0;
} g_block;

void set_thread_index(int t) {
    threadIdx.x = (unsigned)t % blockDim.x;
    threadIdx.y = (unsigned)t / blockDim.x % blockDim.y;
    threadIdx.z = (unsigned)t / (blockDim.x * blockDim.y);
}

fiber &current_fiber() {
    if (g_block.current < 0) cuemu_fail("a device function ran outside a kernel");
    return g_block.fibers[(size_t)g_block.current];
}

// fiber -> scheduler
void yield_to_scheduler(bool exiting) {
    fiber &f = current_fiber();
#if CUEMU_ASAN
    __sanitizer_start_switch_fiber(exiting ? nullptr : &f.fake_stack, g_block.sched_bottom, g_block.sched_size);
#else
    (void)exiting;
#endif
    cuemu_switch(&f.sp, g_block.sched_sp);
#if CUEMU_ASAN
    __sanitizer_finish_switch_fiber(f.fake_stack, &g_block.sched_bottom, &g_block.sched_size);
#endif
}

extern "C" void fiber_main(void) {
#if CUEMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &g_block.sched_bottom, &g_block.sched_size);
#endif
    g_block.body(g_block.closure);
    current_fiber().state = DONE;
    yield_to_scheduler(true);
    cuemu_fail("a finished fiber was resumed");
}

// scheduler -> fiber t
void resume(int t) {
    fiber &f = g_block.fibers[(size_t)t];
    g_block.current = t;
    set_thread_index(t);
#if CUEMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.stack + GUARD_BYTES, STACK_BYTES);
#endif
    cuemu_switch(&g_block.sched_sp, f.sp);
#if CUEMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    g_block.current = -1;
}

void fiber_start(fiber &f) {
    if (!f.stack) {
        void *m = mmap(nullptr, GUARD_BYTES + STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) cuemu_fail("cannot map a fiber's stack");
        if (mprotect(m, GUARD_BYTES, PROT_NONE) != 0) cuemu_fail("cannot protect a fiber's stack guard");
        f.stack = (char *)m;
    }
    // the top: fiber_main's return address slot (never used), fiber_main, six registers
    // staggered by the thread's index: stacks a power of two apart would put every fiber's
    // top in the same cache sets
    const size_t stagger = (size_t)(&f - g_block.fibers.data()) * 1088 % 65536;
    uintptr_t top = ((uintptr_t)(f.stack + GUARD_BYTES + STACK_BYTES - stagger)) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = nullptr;
    *--sp = (void *)&fiber_main;
    for (int i = 0; i < 6; i++) *--sp = nullptr;
    f.sp = sp;
    f.state = READY;
    f.fake_stack = nullptr;
    f.copies.clear();
    f.committed = 0;
}

const char *state_name(const fiber &f) {
    switch (f.state) {
    case READY: return "running";
    case AT_BARRIER: return "at __syncthreads";
    case AT_WARP: return f.op == WARP_SYNC ? "at __syncwarp" : f.op == WARP_SHFL_XOR ? "at __shfl_xor_sync" : "at __all_sync";
    case DONE: return "exited";
    }
    return "?";
}

[[noreturn]] void block_fail(int t, const char *what) {
    const fiber &f = g_block.fibers[(size_t)t];
    cuemu_fail("kernel %s, block (%u,%u,%u), thread %d (%s, line %d): %s", g_block.kernel, blockIdx.x, blockIdx.y,
               blockIdx.z, t, state_name(f), f.line, what);
}

// Runs the collectives of the warp of threads w0.. whose every named lane has arrived; true if any ran.
bool run_warp_collectives(int w0) {
    bool ran = false;
    const int n = g_block.nthreads;
    {
        const int lanes = n - w0 < 32 ? n - w0 : 32;
        const unsigned present = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1);
        fiber *warp = &g_block.fibers[(size_t)w0];
        unsigned seen = 0; // lanes already looked at as part of a group
        for (int l = 0; l < lanes; l++) {
            fiber &f = warp[l];
            if (f.state != AT_WARP || (seen >> l & 1u)) continue;
            const unsigned mask = f.mask & present;
            seen |= mask;
            if (!(mask >> l & 1u)) block_fail(w0 + l, "a warp collective whose mask leaves out the lane calling it");
            for (int m = 0; m < lanes; m++) {
                if (!(mask >> m & 1u)) continue;
                const fiber &g = warp[m];
                if (g.state != AT_WARP) { // every fiber has run as far as it can: it never will
                    char why[160];
                    snprintf(why, sizeof why, "waits for lane %d, which is %s (line %d)", m, state_name(g), g.line);
                    block_fail(w0 + l, why);
                }
                if (g.op != f.op || g.mask != f.mask) {
                    char why[160];
                    snprintf(why, sizeof why, "lane %d is in another warp collective (%s, line %d)", m,
                             state_name(g), g.line);
                    block_fail(w0 + l, why);
                }
            }
            // every lane of the mask is here: the collective runs
            int every = 1;
            if (f.op == WARP_ALL)
                for (int m = 0; m < lanes; m++)
                    if (mask >> m & 1u) every &= warp[m].value != 0;
            for (int m = 0; m < lanes; m++) {
                if (!(mask >> m & 1u)) continue;
                fiber &g = warp[m];
                if (g.op == WARP_SHFL_XOR) {
                    int src = m ^ g.lane_mask;
                    if (src / g.width > m / g.width || src >= lanes) src = m; // a later group: its own value
                    if (!(mask >> src & 1u)) block_fail(w0 + m, "__shfl_xor_sync reads a lane outside its mask");
                    g.result = warp[src].value;
                } else if (g.op == WARP_ALL) {
                    g.result = (uint64_t)every;
                }
                g.state = READY;
            }
            g_block.at_warp -= __builtin_popcount(mask);
            ran = true;
        }
    }
    return ran;
}

// One warp as far as it goes: its fibers in turn (forward in even rounds,
// backward in odd ones), then its collectives, until every fiber of it waits
// at __syncthreads, has exited, or waits in a collective that cannot run.
void run_warp(int w0) {
    const int lanes = g_block.nthreads - w0 < 32 ? g_block.nthreads - w0 : 32;
    for (unsigned round = 0;; round++) {
        for (int i = 0; i < lanes; i++) {
            const int t = w0 + (round % 2 ? lanes - 1 - i : i);
            if (g_block.fibers[(size_t)t].state == READY) resume(t);
        }
        if (!g_block.at_warp || !run_warp_collectives(w0)) return;
    }
}

// The warps one after another, each up to the next __syncthreads (forward in
// even phases, backward in odd ones): warps drift apart as far as the
// barriers let them, so a missing __syncthreads between one warp's write and
// another's read (or overwrite) shows up as a different result.
void run_block() {
    const int n = g_block.nthreads, warps = (n + 31) / 32;
    if (g_block.fibers.size() < (size_t)n) g_block.fibers.resize((size_t)n);
    for (int t = 0; t < n; t++) fiber_start(g_block.fibers[(size_t)t]);
    for (unsigned phase = 0;; phase++) {
        for (int i = 0; i < warps; i++) run_warp(32 * (phase % 2 ? warps - 1 - i : i));
        int live = 0, barrier = 0, first_other = -1;
        for (int t = 0; t < n; t++) {
            const fiber &f = g_block.fibers[(size_t)t];
            if (f.state == DONE) continue;
            live++;
            if (f.state == AT_BARRIER) barrier++;
            else if (first_other < 0) first_other = t;
        }
        if (live == 0) {
            for (int t = 0; t < n; t++)
                if (!g_block.fibers[(size_t)t].copies.empty())
                    block_fail(t, "ended with cp.async copies it never waited for (cp_async_wait)");
            return;
        }
        if (barrier < live) {
            // a warp collective that cannot complete, with others at a barrier: a deadlock on the hardware
            block_fail(first_other, "can never go on (the rest of the block waits at __syncthreads)");
        }
        for (int t = 0; t < n; t++)
            if (g_block.fibers[(size_t)t].state == AT_BARRIER) g_block.fibers[(size_t)t].state = READY;
    }
}

} // namespace

namespace cuemu {

void *dynamic_smem() {
    if (g_block.current < 0) cuemu_fail("dynamic shared memory outside a kernel");
    return g_block.smem;
}

void syncthreads(int line) {
    fiber &f = current_fiber();
    f.state = AT_BARRIER;
    f.line = line;
    yield_to_scheduler(false);
}

static uint64_t warp_collective(int line, warp_op op, unsigned mask, uint64_t value, int lane_mask, int width) {
    fiber &f = current_fiber();
    if (width < 1 || width > 32 || (width & (width - 1))) cuemu_fail("line %d: shuffle width %d", line, width);
    f.state = AT_WARP;
    g_block.at_warp++;
    f.line = line;
    f.op = op;
    f.mask = mask;
    f.value = value;
    f.lane_mask = lane_mask;
    f.width = width;
    yield_to_scheduler(false);
    return current_fiber().result;
}

void syncwarp(int line, unsigned mask) { warp_collective(line, WARP_SYNC, mask, 0, 0, 32); }
uint64_t shfl_xor_bits(int line, unsigned mask, uint64_t bits, int lane_mask, int width) {
    return warp_collective(line, WARP_SHFL_XOR, mask, bits, lane_mask, width);
}
int all_sync(int line, unsigned mask, int pred) { return (int)warp_collective(line, WARP_ALL, mask, pred != 0, 0, 32); }

// ---- warp_mma.h's PTX (cuemu_warp_mma.h) ----
static void check_smem(int line, const void *p, size_t bytes, const char *what) {
    const unsigned char *c = (const unsigned char *)p;
    if ((uintptr_t)p % 16 != 0 || c < g_block.smem || c + bytes > g_block.smem + g_block.smem_bytes)
        block_fail(g_block.current, (std::string(what) + " at line " + std::to_string(line) +
                                     ": not a 16-byte aligned address inside the block's dynamic shared memory")
                                        .c_str());
}
static fiber *warp_base(int &lane) {
    lane = g_block.current % 32;
    if (g_block.current - lane + 32 > g_block.nthreads)
        block_fail(g_block.current, "mma or ldmatrix in a warp of fewer than 32 threads");
    return &g_block.fibers[(size_t)(g_block.current - lane)];
}
static float bf16_at(uint32_t reg, int half) { return __uint_as_float((reg >> (16 * half) & 0xffffu) << 16); }

void mma_16816(int line, float d[4], const uint32_t a[4], const uint32_t b[2]) {
    fiber &f = current_fiber();
    memcpy(f.regs, a, 4 * sizeof *a);
    memcpy(f.regs + 4, b, 2 * sizeof *b);
    syncwarp(line, 0xffffffffu);
    int lane;
    const fiber *w = warp_base(lane);
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float acc = d[i];
        for (int k = 0; k < 16; k++) {
            // A(row, k): lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) + 2 (k >= 8);
            // B(k, col): lane col * 4 + (k % 8) / 2, register b[k >= 8]; half k % 2
            const float x = bf16_at(w[(row % 8) * 4 + (k % 8) / 2].regs[(row >= 8) + 2 * (k >= 8)], k % 2);
            const float y = bf16_at(w[col * 4 + (k % 8) / 2].regs[4 + (k >= 8)], k % 2);
            acc += x * y; // exact: 8-bit significands
        }
        d[i] = acc;
    }
    syncwarp(line, 0xffffffffu); // every lane has read the others' registers
}

void ldsm_x4(int line, uint32_t r[4], const void *row, bool trans) {
    check_smem(line, row, 16, trans ? "ldmatrix .trans" : "ldmatrix");
    current_fiber().row = row;
    syncwarp(line, 0xffffffffu);
    int lane;
    const fiber *w = warp_base(lane);
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        uint16_t lo, hi;
        if (!trans) { // row g of matrix i, elements 2t, 2t + 1
            const uint16_t *p = (const uint16_t *)w[8 * i + g].row;
            lo = p[2 * t], hi = p[2 * t + 1];
        } else { // (2t, g) and (2t + 1, g)
            lo = ((const uint16_t *)w[8 * i + 2 * t].row)[g];
            hi = ((const uint16_t *)w[8 * i + 2 * t + 1].row)[g];
        }
        r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    syncwarp(line, 0xffffffffu);
}

void cp_async16(int line, void *smem, const void *global, bool valid) {
    check_smem(line, smem, 16, "cp.async");
    if ((uintptr_t)global % 16 != 0) block_fail(g_block.current, "cp.async from a global address not 16-byte aligned");
    fiber &f = current_fiber();
    memset(smem, 0xff, 16); // undefined until waited for
    f.copies.push_back(pending_copy{smem, global, valid, f.committed});
}

void cp_async_close_group() { current_fiber().committed++; }

void cp_async_wait_groups(int pending) {
    fiber &f = current_fiber();
    std::vector<pending_copy> left;
    for (const pending_copy &c : f.copies) {
        if (c.group >= f.committed - pending) { // in a newer group, or in none yet
            left.push_back(c);
            continue;
        }
        if (c.valid) memcpy(c.dst, c.src, 16);
        else memset(c.dst, 0, 16);
    }
    f.copies.swap(left);
}

} // namespace cuemu

// ---- streams, events and the device thread --------------------------------

struct CUstream_st {
    enum kind { WORK, RECORD, WAIT };
    struct op {
        kind k;
        const char *what;
        void (*fn)(void *);
        void *arg;
        CUevent_st *event; // RECORD
        uint64_t event_gen;
        CUstream_st *on; // WAIT: until `on` has done `upto` ops
        uint64_t upto;
    };
    std::deque<op> queue;
    uint64_t issued = 0, done = 0;
    bool blocking = false, legacy = false;
    int id = 0;
};

struct CUevent_st {
    CUstream_st *stream = nullptr; // of the last record; null: never recorded (complete)
    uint64_t seq = 0, gen = 0;
    bool timing = true, timed = false;
    double ms = 0; // host clock when the last record ran
};

namespace {

std::mutex g_mu;
std::condition_variable g_work, g_progress;
std::vector<CUstream_st *> g_streams;
CUstream_st g_legacy;
bool g_started, g_shutdown, g_device_idle = true;
enum { COMPUTE_FIRST, COMM_FIRST } g_schedule;
std::thread g_device;
std::map<uintptr_t, size_t> g_allocs; // device allocations: start -> bytes
std::map<uintptr_t, size_t> g_pinned;
size_t g_allocated, g_memory;
std::map<const void *, int> g_max_dynamic_smem; // kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;
int g_devices = 1;

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool runnable(const CUstream_st *s) {
    if (s->queue.empty()) return false;
    const CUstream_st::op &o = s->queue.front();
    return o.k != CUstream_st::WAIT || o.on->done >= o.upto;
}

CUstream_st *pick() {
    CUstream_st *best = nullptr;
    for (CUstream_st *s : g_streams) {
        if (!runnable(s)) continue;
        if (!best) best = s;
        else if (g_schedule == COMPUTE_FIRST ? s->legacy : (best->legacy && !s->legacy)) best = s;
    }
    return best;
}

void device_main() {
    std::unique_lock<std::mutex> lk(g_mu);
    for (;;) {
        CUstream_st *s = nullptr;
        g_device_idle = true;
        g_progress.notify_all();
        g_work.wait(lk, [&] { return g_shutdown || (s = pick()) != nullptr; });
        if (g_shutdown) return;
        g_device_idle = false;
        CUstream_st::op o = s->queue.front();
        s->queue.pop_front();
        lk.unlock();
        if (o.k == CUstream_st::WORK) o.fn(o.arg);
        lk.lock();
        if (o.k == CUstream_st::RECORD && o.event->gen == o.event_gen) {
            o.event->ms = now_ms();
            o.event->timed = true;
        }
        s->done++;
        g_progress.notify_all();
    }
}

// At exit: the device stops after the op it is running (CUDA drops queued
// work at exit too), waited for a few seconds; an op that never ends (a
// collective with a dead peer) must not hold up the exit.
void stop_device() {
    {
        std::unique_lock<std::mutex> lk(g_mu);
        g_shutdown = true;
        g_work.notify_all();
        g_progress.wait_for(lk, std::chrono::seconds(5), [] { return g_device_idle; });
    }
    if (g_device.joinable()) g_device.detach();
}

// under g_mu
void start() {
    if (g_started) return;
    g_started = true;
    const char *sched = getenv("CUEMU_SCHEDULE");
    if (!sched || !*sched || !strcmp(sched, "compute-first")) g_schedule = COMPUTE_FIRST;
    else if (!strcmp(sched, "comm-first")) g_schedule = COMM_FIRST;
    else cuemu_fail("CUEMU_SCHEDULE=%s: expected compute-first or comm-first", sched);
    g_memory = (size_t)(env_number("CUEMU_MEMORY_MIB", 16384) * 1024 * 1024);
    g_devices = (int)env_number("CUEMU_DEVICES", 1);
    g_legacy.legacy = true;
    g_legacy.blocking = true;
    g_streams.push_back(&g_legacy);
    g_device = std::thread(device_main);
    atexit(stop_device);
}

CUstream_st *stream_of(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy) return &g_legacy;
    if (s == cudaStreamPerThread) cuemu_fail("cudaStreamPerThread is not emulated");
    return s;
}

// under g_mu: the legacy stream and the blocking streams wait for each other
void push(CUstream_st *s, CUstream_st::op o) {
    auto wait_for = [&](CUstream_st *on) {
        if (on == s || on->issued == on->done) return;
        s->queue.push_back(CUstream_st::op{CUstream_st::WAIT, "implicit", nullptr, nullptr, nullptr, 0, on, on->issued});
        s->issued++;
    };
    if (s->legacy) {
        for (CUstream_st *b : g_streams)
            if (b->blocking && !b->legacy) wait_for(b);
    } else if (s->blocking) {
        wait_for(&g_legacy);
    }
    s->queue.push_back(o);
    s->issued++;
    g_work.notify_one();
}

void enqueue(cudaStream_t stream, const char *what, void (*fn)(void *), void *arg) {
    std::lock_guard<std::mutex> lk(g_mu);
    start();
    push(stream_of(stream), CUstream_st::op{CUstream_st::WORK, what, fn, arg, nullptr, 0, nullptr, 0});
}

// under lk: waits until done() holds, or stops the run after CUEMU_TIMEOUT_S
template <typename F> void wait_until(std::unique_lock<std::mutex> &lk, const char *what, F done) {
    const double timeout = env_number("CUEMU_TIMEOUT_S", 600);
    if (!g_progress.wait_for(lk, std::chrono::duration<double>(timeout), done))
        cuemu_fail("%s waited %.0f s for the device (CUEMU_TIMEOUT_S)", what, timeout);
}

void stream_sync(std::unique_lock<std::mutex> &lk, CUstream_st *s, const char *what) {
    const uint64_t target = s->issued;
    wait_until(lk, what, [&] { return s->done >= target; });
}

void device_sync(std::unique_lock<std::mutex> &lk, const char *what) {
    std::vector<std::pair<CUstream_st *, uint64_t>> targets;
    for (CUstream_st *s : g_streams) targets.emplace_back(s, s->issued);
    wait_until(lk, what, [&] {
        for (auto &t : targets)
            if (t.first->done < t.second) return false;
        return true;
    });
}

// under g_mu: the allocation [p, p + bytes) lies in, or false
bool in_device_memory(const void *p, size_t bytes) {
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return false;
    --it;
    return (uintptr_t)p >= it->first && (uintptr_t)p + bytes <= it->first + it->second;
}

struct copy_args {
    void *dst;
    const void *src;
    size_t bytes;
    int value;
};

void run_copy(void *p) {
    copy_args *c = (copy_args *)p;
    memmove(c->dst, c->src, c->bytes);
    delete c;
}
void run_set(void *p) {
    copy_args *c = (copy_args *)p;
    memset(c->dst, c->value, c->bytes);
    delete c;
}

// under g_mu: the device sides of a copy lie in device memory, the host sides do not
cudaError_t check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return cudaSuccess;
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost)
        cuemu_fail("cudaMemcpy kind %d is not emulated", (int)kind);
    if (dst_dev != in_device_memory(dst, bytes) || src_dev != in_device_memory(src, bytes))
        cuemu_fail("cudaMemcpy of %zu bytes from %p to %p (kind %d): %s", bytes, src, dst, (int)kind,
                   dst_dev != in_device_memory(dst, bytes)
                       ? (dst_dev ? "the destination is not inside one device allocation"
                                  : "the destination is device memory")
                       : (src_dev ? "the source is not inside one device allocation" : "the source is device memory"));
    return cudaSuccess;
}

} // namespace

extern "C" void cuemu_enqueue(cudaStream_t s, const char *what, void (*fn)(void *arg), void *arg) {
    enqueue(s, what, fn, arg);
}

// ---- launches ------------------------------------------------------------------

namespace cuemu {

struct grid_work {
    const char *name;
    dim3 grid, block;
    size_t smem;
    void (*body)(void *);
    void *closure;
    void (*destroy)(void *);
};

static void run_grid(void *p) {
    grid_work *w = (grid_work *)p;
    gridDim = w->grid;
    blockDim = w->block;
    g_block.nthreads = (int)(w->block.x * w->block.y * w->block.z);
    g_block.body = w->body;
    g_block.closure = w->closure;
    g_block.kernel = w->name;
    for (unsigned z = 0; z < w->grid.z; z++)
        for (unsigned y = 0; y < w->grid.y; y++)
            for (unsigned x = 0; x < w->grid.x; x++) {
                blockIdx.x = x, blockIdx.y = y, blockIdx.z = z;
                // as aligned as any __align__ the kernels ask of it, and exactly the size asked for
                void *m = nullptr;
                if (posix_memalign(&m, 1024, w->smem ? w->smem : 1)) cuemu_fail("out of memory for shared memory");
                g_block.smem = (unsigned char *)m;
                g_block.smem_bytes = w->smem;
                memset(g_block.smem, 0xff, w->smem);
                run_block();
                free(g_block.smem);
                g_block.smem = nullptr;
            }
    w->destroy(w->closure);
    delete w;
}

void launch_grid(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                 void (*body)(void *), void *closure, void (*destroy)(void *)) {
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    cudaError_t e = cudaSuccess;
    int allowed = 48 << 10;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_max_dynamic_smem.find(kernel);
        if (it != g_max_dynamic_smem.end() && it->second > allowed) allowed = it->second;
    }
    if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
        e = cudaErrorInvalidConfiguration;
    else if (smem > (size_t)allowed)
        e = cudaErrorInvalidValue; // more than 48 KiB needs cudaFuncSetAttribute first
    if (e != cudaSuccess) {
        t_last_error = e;
        destroy(closure);
        return;
    }
    enqueue(stream, name, run_grid, new grid_work{name, grid, block, smem, body, closure, destroy});
}

} // namespace cuemu

// ---- the runtime API -------------------------------------------------------------

extern "C" {

cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

static cudaError_t fail_with(cudaError_t e) {
    t_last_error = e;
    return e;
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    default: return "unknown error";
    }
}

cudaError_t cudaGetDeviceCount(int *count) {
    std::lock_guard<std::mutex> lk(g_mu);
    start();
    *count = g_devices > 0 ? g_devices : 0;
    return g_devices > 0 ? cudaSuccess : fail_with(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    std::lock_guard<std::mutex> lk(g_mu);
    start();
    if (device < 0 || device >= g_devices) return fail_with(cudaErrorInvalidDevice);
    t_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = t_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    std::lock_guard<std::mutex> lk(g_mu);
    start();
    if (device < 0 || device >= g_devices) return fail_with(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "cuemu (keel's host CUDA emulator)");
    prop->totalGlobalMem = g_memory;
    prop->sharedMemPerBlock = 48 << 10;
    prop->sharedMemPerBlockOptin = 232448;
    prop->sharedMemPerMultiprocessor = 233472;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    *least = 0;
    *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    std::lock_guard<std::mutex> lk(g_mu);
    start();
    *total = g_memory;
    *free_b = g_memory > g_allocated ? g_memory - g_allocated : 0;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    std::lock_guard<std::mutex> lk(g_mu);
    start();
    *p = nullptr;
    if (g_allocated + bytes > g_memory) return fail_with(cudaErrorMemoryAllocation);
    void *m = aligned_alloc(256, (bytes + 255) / 256 * 256 + (bytes == 0 ? 256 : 0));
    if (!m) return fail_with(cudaErrorMemoryAllocation);
    g_allocs[(uintptr_t)m] = bytes;
    g_allocated += bytes;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    std::unique_lock<std::mutex> lk(g_mu);
    start();
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end()) return fail_with(cudaErrorInvalidValue);
    device_sync(lk, "cudaFree"); // CUDA's cudaFree waits for the device too
    g_allocated -= it->second;
    g_allocs.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned int flags) {
    (void)flags;
    std::lock_guard<std::mutex> lk(g_mu);
    if (!p || !bytes) return fail_with(cudaErrorInvalidValue);
    if (g_pinned.count((uintptr_t)p)) return fail_with(cudaErrorHostMemoryAlreadyRegistered);
    g_pinned[(uintptr_t)p] = bytes;
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_pinned.erase((uintptr_t)p)) return fail_with(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
    std::lock_guard<std::mutex> lk(g_mu);
    start();
    check_copy(dst, src, bytes, kind);
    if (bytes)
        push(stream_of(s), CUstream_st::op{CUstream_st::WORK, "cudaMemcpyAsync", run_copy,
                                           new copy_args{dst, src, bytes, 0}, nullptr, 0, nullptr, 0});
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    std::unique_lock<std::mutex> lk(g_mu);
    start();
    check_copy(dst, src, bytes, kind);
    if (bytes)
        push(&g_legacy, CUstream_st::op{CUstream_st::WORK, "cudaMemcpy", run_copy, new copy_args{dst, src, bytes, 0},
                                        nullptr, 0, nullptr, 0});
    stream_sync(lk, &g_legacy, "cudaMemcpy");
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    std::lock_guard<std::mutex> lk(g_mu);
    start();
    if (bytes && !in_device_memory(p, bytes))
        cuemu_fail("cudaMemsetAsync of %zu bytes at %p: not inside one device allocation", bytes, p);
    if (bytes)
        push(stream_of(s), CUstream_st::op{CUstream_st::WORK, "cudaMemsetAsync", run_set,
                                           new copy_args{p, nullptr, bytes, value}, nullptr, 0, nullptr, 0});
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    std::unique_lock<std::mutex> lk(g_mu);
    start();
    device_sync(lk, "cudaDeviceSynchronize");
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority) {
    (void)priority;
    std::lock_guard<std::mutex> lk(g_mu);
    start();
    CUstream_st *n = new CUstream_st;
    n->blocking = !(flags & cudaStreamNonBlocking);
    n->id = (int)g_streams.size();
    g_streams.push_back(n);
    *s = n;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    return cudaStreamCreateWithPriority(s, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, cudaStreamDefault, 0); }

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    std::unique_lock<std::mutex> lk(g_mu);
    start();
    stream_sync(lk, stream_of(s), "cudaStreamSynchronize");
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::unique_lock<std::mutex> lk(g_mu);
    CUstream_st *st = stream_of(s);
    if (st->legacy) return fail_with(cudaErrorInvalidResourceHandle);
    stream_sync(lk, st, "cudaStreamDestroy"); // work queued before still runs
    for (size_t i = 0; i < g_streams.size(); i++)
        if (g_streams[i] == st) g_streams.erase(g_streams.begin() + (long)i);
    delete st;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    CUevent_st *n = new CUevent_st;
    n->timing = !(flags & cudaEventDisableTiming);
    *e = n;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    std::unique_lock<std::mutex> lk(g_mu);
    // a record still queued refers to it: let it run first
    if (e->stream) wait_until(lk, "cudaEventDestroy", [&] { return e->stream->done >= e->seq; });
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    std::lock_guard<std::mutex> lk(g_mu);
    start();
    CUstream_st *st = stream_of(s);
    e->gen++;
    e->timed = false;
    push(st, CUstream_st::op{CUstream_st::RECORD, "cudaEventRecord", nullptr, nullptr, e, e->gen, nullptr, 0});
    e->stream = st;
    e->seq = st->issued;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    (void)flags;
    std::lock_guard<std::mutex> lk(g_mu);
    start();
    if (!e->stream) return cudaSuccess; // never recorded: nothing to wait for
    push(stream_of(s),
         CUstream_st::op{CUstream_st::WAIT, "cudaStreamWaitEvent", nullptr, nullptr, nullptr, 0, e->stream, e->seq});
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    std::unique_lock<std::mutex> lk(g_mu);
    if (e->stream) wait_until(lk, "cudaEventSynchronize", [&] { return e->stream->done >= e->seq; });
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    std::lock_guard<std::mutex> lk(g_mu);
    return !e->stream || e->stream->done >= e->seq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start_e, cudaEvent_t end_e) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!start_e->timing || !end_e->timing || !start_e->stream || !end_e->stream)
        return fail_with(cudaErrorInvalidResourceHandle);
    if (!start_e->timed || !end_e->timed) return fail_with(cudaErrorNotReady);
    *ms = (float)(end_e->ms - start_e->ms);
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) cuemu_fail("cudaFuncSetAttribute %d is not emulated", attr);
    if (value < 0 || value > 232448) return fail_with(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(g_mu);
    g_max_dynamic_smem[func] = value;
    return cudaSuccess;
}

} // extern "C"
