/* core: status codes, logging, checked allocation, durable file I/O, thread
 * pool, config parsing.
 *
 * Every keel function that can fail returns a keel_status. The function that
 * detects bad user input prints exactly one line naming the file/key/value and
 * the fix (keel_errorf) and returns KEEL_ERR_INPUT; main() turns statuses into
 * exit codes with keel_status_exit_code(). exit() lives only in main.
 *
 *     keel_config cfg;
 *     keel_config_defaults(&cfg);
 *     if (keel_config_load_file(&cfg, "configs/tiny.json") != KEEL_OK) return 2;
 *     if (keel_config_set(&cfg, "train.steps=10") != KEEL_OK) return 2;
 *     if (keel_config_finalize(&cfg) != KEEL_OK) return 2;
 *     char *json = keel_config_to_json(&cfg);   // caller frees
 */
#ifndef KEEL_CORE_H
#define KEEL_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>

#define KEEL_VERSION "0.1.0"

typedef enum {
    KEEL_OK = 0,
    KEEL_ERR_INPUT = 1,    /* bad user input: config, data file, tokenizer, CLI */
    KEEL_ERR_IO = 2,       /* the system failed us: disk full, permission, ... */
    KEEL_ERR_NOMEM = 3,
    KEEL_ERR_NUMERIC = 4,  /* non-finite or diverged loss or gradient */
    KEEL_ERR_INTERNAL = 5, /* a bug in keel */
    KEEL_ERR_STOPPED = 6,  /* stopped on a signal after saving a checkpoint: resume me */
    KEEL_ERR_UNHEALTHY = 7, /* a health check failed where the job runs */
} keel_status;

/* Exit codes of keel train and keel worker (docs/configuration.md, "Exit codes"). */
enum {
    KEEL_EXIT_RESUME = 75,    /* stopped on SIGTERM/SIGUSR1/SIGINT at a step boundary, state
                                 saved: run the same keel train again to go on (EX_TEMPFAIL) */
    KEEL_EXIT_DIVERGED = 76,  /* the loss or gradient norm became NaN/Inf, or the loss
                                 exceeded resilience.max_loss */
    KEEL_EXIT_UNHEALTHY = 77, /* a worker's health check (the mpi all-reduce) failed */
    KEEL_EXIT_PEER_LOST = 78, /* a Slurm task: a peer rank was lost (dead, frozen, stuck or gone with
                                 an error), so this one ended the attempt */
};

/* Exit code for a status: 0 ok, 2 bad input, 75 stopped (resume me),
 * 76 diverged, 1 anything else. */
int keel_status_exit_code(keel_status st);
const char *keel_status_str(keel_status st);

/* ---- logging ------------------------------------------------------------ */

typedef enum { KEEL_LOG_DEBUG, KEEL_LOG_INFO, KEEL_LOG_WARN, KEEL_LOG_ERROR } keel_log_level;

/* Every log and error line is one line, whatever the values formatted into
 * it: a control character is written as an escape (\n, \r, \t, \x1b, ...,
 * DEL and bytes that are not well-formed UTF-8 or are C1 controls as \xNN),
 * so a config key, a path or a client's header cannot end the line, fake
 * another or drive the terminal; trailing line breaks are dropped (keel adds
 * the one newline). A message longer than KEEL_LOG_MAX_MESSAGE bytes (after
 * escaping) is cut, ending "...[N more bytes]". The same line goes to stderr
 * and to the log file, each in one write. */
#define KEEL_LOG_MAX_MESSAGE 2048

void keel_log_set_level(keel_log_level level);
/* Also write every log and error line to f (NULL: stop); not owned. */
void keel_log_set_file(FILE *f);
void keel_log(keel_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define keel_log_debug(...) keel_log(KEEL_LOG_DEBUG, __VA_ARGS__)
#define keel_log_info(...) keel_log(KEEL_LOG_INFO, __VA_ARGS__)
#define keel_log_warn(...) keel_log(KEEL_LOG_WARN, __VA_ARGS__)
/* One-line user-facing error: "keel: error: <message>" on stderr. */
void keel_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* While on, this thread's keel_errorf lines are kept instead of printed: for
 * errors keel recovers from and reports its own way (a damaged checkpoint, a
 * failed background save). keel_last_error is this thread's last error line,
 * printed or kept (since the last capture(true); escaped like a printed line
 * and cut to 1023 bytes): what a caller passes on to another process. */
void keel_error_capture(bool on);
const char *keel_last_error(void);

/* Always-on internal invariant (never for user input): prints file:line and aborts. */
#define KEEL_CHECK(cond, ...)                                                 \
    do {                                                                      \
        if (!(cond)) keel_check_failed(__FILE__, __LINE__, #cond, __VA_ARGS__); \
    } while (0)
_Noreturn void keel_check_failed(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- checked allocation --------------------------------------------------- */

/* Allocate or abort with a message naming `what` and the size: keel treats an
 * out-of-memory as fatal (like redis' zmalloc). Memory is 64-byte aligned and,
 * for keel_xcalloc, zeroed. Free with keel_free. */
void *keel_xmalloc(size_t bytes, const char *what);
void *keel_xcalloc(size_t bytes, const char *what);
void *keel_xrealloc(void *p, size_t bytes, const char *what); /* not aligned beyond malloc's */
char *keel_xstrdup(const char *s);
/* A growable string: printf appends (aborts on out-of-memory like the
 * allocators); s is NUL-ended once anything is in it; free s with keel_free. */
typedef struct {
    char *s;
    size_t n, cap;
} keel_strbuf;
void keel_strbuf_printf(keel_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void keel_free(void *p);
/* For sizes a file asked for (a tensor, a shard, a vocabulary): the memory, or
 * NULL — without a message, so the caller's one line can name the file and
 * the field — when it cannot be had or is more than this machine's physical
 * memory (an absurd size from a damaged file is refused before malloc sees
 * it). 64-byte aligned like keel_xmalloc; free with keel_free. */
void *keel_try_malloc(size_t bytes);

/* ---- JSON numbers and text (json.c) --------------------------------------- */

/* A JSON value (cJSON) as an integer in [lo, hi]: false unless it is a number
 * with no fraction, at most 2^53 in magnitude (beyond that a double no longer
 * says which integer the file wrote) and inside the range. Every parser reads
 * integers through this, so no file can drive a float-to-int conversion out
 * of range (1e19, 1e300, inf are refused, not converted). */
struct cJSON;
bool keel_json_int(const struct cJSON *v, int64_t lo, int64_t hi, int64_t *out);
/* Whether JSON text of n bytes holds a "\u0000" escape: cJSON ends its string
 * there, so a value would read shorter than the file shows (a check on the
 * prefix alone). Spec parsers refuse such text. */
bool keel_json_escaped_nul(const char *text, size_t n);

/* ---- this process and machine (host.c) ----------------------------------- */

/* Peak resident set size of this process in bytes (VmHWM), 0 if unknown. */
uint64_t keel_peak_rss_bytes(void);
uint64_t keel_rss_bytes(void); /* resident now (VmRSS) */
/* The kernel's estimate of memory available to new work (MemAvailable), 0 if unknown. */
uint64_t keel_mem_available_bytes(void);
/* Monotonic wall clock in seconds (durations). */
double keel_now_s(void);
/* Wall-clock time in seconds since the epoch (timestamps other processes read). */
double keel_unix_s(void);
/* CPU seconds this process has used, all its threads together. */
double keel_cpu_s(void);
/* Sorts x (n > 0) ascending in place and returns x[n / 2]: the median of an
 * odd count, the upper of the middle two of an even one. */
double keel_median(double *x, int64_t n);
void keel_sleep_s(double s);
/* Cores online, and cores this process may run on (its affinity mask: fewer
 * when a launcher bound it to its share). */
int keel_cores_online(void);
int keel_cores_allowed(void);
/* This node's name, one word: SLURMD_NODENAME (emulated Slurm nodes share a
 * hostname) or the hostname. */
void keel_node_name(char *out, size_t n);
/* Block the asynchronous signals (SIGINT, SIGTERM, SIGUSR1/2, SIGHUP,
 * SIGALRM, SIGQUIT) on the calling thread: a helper thread's, so that they
 * reach the threads that act on them (a run's stop signals). */
void keel_block_async_signals(void);
/* 'R', 'S', 'T' (stopped), 'Z' (zombie)... of a pid of this machine (/proc),
 * or 0 when gone. */
char keel_pid_state(int pid);
bool keel_pid_alive(int pid);

/* ---- this machine's NVIDIA GPUs, read through NVML (gpu.c) ------------------ */
/* NVML is opened with dlopen (libnvidia-ml.so.1, the driver's; $KEEL_NVML_LIB
 * names another file): keel builds and runs where there is none, and a machine
 * without it has no GPU readings, never invented ones. A reading the GPU does
 * not support is NAN. The field names are DCGM's (dcgm-exporter's metric
 * names), so dashboards made for it work on keel's endpoint.
 *
 *     char why[256];
 *     keel_gpus *g;
 *     keel_status st = keel_gpus_open(&g, why, sizeof why);   // g NULL: why says why
 *     keel_gpu_sample s;
 *     for (int i = 0; i < keel_gpus_count(g); i++) keel_gpus_read(g, i, &s);
 *     keel_gpus_close(g);
 */
typedef enum {
    KEEL_GPU_UTIL,              /* DCGM_FI_DEV_GPU_UTIL: percent */
    KEEL_GPU_MEM_COPY_UTIL,     /* DCGM_FI_DEV_MEM_COPY_UTIL: percent */
    KEEL_GPU_FB_USED,           /* DCGM_FI_DEV_FB_USED: MiB */
    KEEL_GPU_FB_FREE,           /* DCGM_FI_DEV_FB_FREE: MiB */
    KEEL_GPU_TEMP,              /* DCGM_FI_DEV_GPU_TEMP: degrees C */
    KEEL_GPU_POWER_USAGE,       /* DCGM_FI_DEV_POWER_USAGE: W */
    KEEL_GPU_TOTAL_ENERGY,      /* DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: mJ since the driver loaded */
    KEEL_GPU_SM_CLOCK,          /* DCGM_FI_DEV_SM_CLOCK: MHz */
    KEEL_GPU_MAX_SM_CLOCK,      /* DCGM_FI_DEV_MAX_SM_CLOCK: MHz */
    KEEL_GPU_MEM_CLOCK,         /* DCGM_FI_DEV_MEM_CLOCK: MHz */
    KEEL_GPU_PCIE_REPLAY,       /* DCGM_FI_DEV_PCIE_REPLAY_COUNTER */
    KEEL_GPU_XID_ERRORS,        /* DCGM_FI_DEV_XID_ERRORS: the last XID seen since open, 0 = none */
    KEEL_GPU_XID_COUNT,         /* XIDs seen since keel_gpus_open (not since boot) */
    KEEL_GPU_ECC_SBE_VOL,       /* DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: corrected, since the driver loaded */
    KEEL_GPU_ECC_DBE_VOL,       /* DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: uncorrected */
    KEEL_GPU_CORRECTABLE_REMAPPED_ROWS,   /* DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS */
    KEEL_GPU_UNCORRECTABLE_REMAPPED_ROWS, /* DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS */
    KEEL_GPU_ROW_REMAP_PENDING, /* a remap waits for a GPU reset: 0/1 */
    KEEL_GPU_ROW_REMAP_FAILURE, /* DCGM_FI_DEV_ROW_REMAP_FAILURE: 0/1 */
    KEEL_GPU_CLOCK_EVENT_REASONS, /* DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: why the clocks are below
                                   * their maximum, a bitmask of KEEL_GPU_CLOCKS_* */
    KEEL_GPU_N_FIELDS
} keel_gpu_field;
/* NVML's clock event (throttle) reasons, KEEL_GPU_CLOCK_EVENT_REASONS's bits */
#define KEEL_GPU_CLOCKS_GPU_IDLE 0x1u
#define KEEL_GPU_CLOCKS_APPLICATIONS_CLOCKS_SETTING 0x2u
#define KEEL_GPU_CLOCKS_SW_POWER_CAP 0x4u
#define KEEL_GPU_CLOCKS_HW_SLOWDOWN 0x8u
#define KEEL_GPU_CLOCKS_SYNC_BOOST 0x10u
#define KEEL_GPU_CLOCKS_SW_THERMAL_SLOWDOWN 0x20u
#define KEEL_GPU_CLOCKS_HW_THERMAL_SLOWDOWN 0x40u
#define KEEL_GPU_CLOCKS_HW_POWER_BRAKE_SLOWDOWN 0x80u
#define KEEL_GPU_CLOCKS_DISPLAY_CLOCK_SETTING 0x100u
#define KEEL_GPU_NEW_XIDS_MAX 16
typedef struct {
    int index;              /* NVML's device index */
    unsigned minor;         /* /dev/nvidia<minor> */
    char uuid[96], model[96], pci_bus_id[32];
    double v[KEEL_GPU_N_FIELDS]; /* NAN: not supported by this GPU */
    /* XID events that arrived since this GPU's previous keel_gpus_read (the
     * first KEEL_GPU_NEW_XIDS_MAX; n_new_xids counts them all) */
    unsigned new_xids[KEEL_GPU_NEW_XIDS_MAX];
    int n_new_xids;
} keel_gpu_sample;
typedef struct keel_gpus keel_gpus;
/* KEEL_OK with *out NULL: no NVML on this machine (no driver: not an error).
 * KEEL_ERR_IO: NVML is there and does not answer (driver not loaded?).
 * KEEL_ERR_INPUT: $KEEL_NVML_LIB names a file that does not load. Each says
 * why in `why` (on KEEL_OK with GPUs: how many, through which file); none prints. */
keel_status keel_gpus_open(keel_gpus **out, char *why, size_t why_n);
int keel_gpus_count(const keel_gpus *g); /* 0 for NULL */
const char *keel_gpus_library(const keel_gpus *g); /* the file dlopen loaded */
/* One GPU's readings now (KEEL_GPU_XID_*: the XID events since open; new_xids:
 * those since this GPU's previous read). */
keel_status keel_gpus_read(keel_gpus *g, int i, keel_gpu_sample *s);
void keel_gpus_close(keel_gpus *g);

/* ---- durable file I/O ------------------------------------------------------ */
/* Every file keel writes or reads whole goes through these (src/core/fsio.c),
 * so the crash-safety protocol lives in one place: a file that must survive a
 * crash is written as a tmp file beside it, fsync'd, renamed over it, and the
 * directory fsync'd (redis' rule). A single read/write moves at most ~2 GiB on
 * Linux, so every transfer loops; sizes and offsets are 64-bit throughout.
 *
 * Errors print one line naming the file (keel_errorf) and return a status:
 * KEEL_ERR_IO when the system failed (errno is kept for the caller), and
 * KEEL_ERR_INPUT when the file itself is missing or too short. The
 * fd-level functions take `path` only for that line; a NULL path makes them
 * quiet, for callers that word the error themselves from errno.
 *
 *     keel_write_file_atomic("RUN/summary.json", text, strlen(text));
 *     char *text;
 *     if (keel_read_file("RUN/config.json", &text, NULL) != KEEL_OK) return st;
 *     ...
 *     keel_free(text);
 */

/* Create dir and its parents (mode 0755); existing directories are fine.
 * An error names the path (KEEL_ERR_IO). */
keel_status keel_mkdirs(const char *dir);
/* Write all `bytes` to fd, looping over partial writes and EINTR. Errors name
 * `path` (NULL: no message) and keep errno. */
keel_status keel_write_all(int fd, const void *data, size_t bytes, const char *path);
/* pwrite / pread the whole range at offset (>= 0), looping. A read that hits
 * EOF early is KEEL_ERR_INPUT, "PATH: truncated: expected N bytes at offset O,
 * got G"; other failures KEEL_ERR_IO. path NULL: no message. */
keel_status keel_pwrite_all(int fd, const void *data, size_t bytes, int64_t offset, const char *path);
keel_status keel_pread_all(int fd, void *data, size_t bytes, int64_t offset, const char *path);
/* fsync a directory (so a rename into it is durable) / the directory holding
 * path. A file system that cannot sync directories (EINVAL) counts as done. */
keel_status keel_fsync_dir(const char *dir);
keel_status keel_fsync_parent(const char *path);

/* Write `bytes` to path durably: tmp file in the same directory (unique name),
 * write-all, fsync, close, rename over path, fsync the directory. On any error
 * the old file is untouched, the tmp is removed, and one error line names the
 * file. */
keel_status keel_write_file_atomic(const char *path, const void *data, size_t bytes);
/* The same for a file made of two buffers, head then body (a header and a
 * payload that is written from where it lies, never copied). */
keel_status keel_write_file_atomic2(const char *path, const void *head, size_t head_bytes,
                                    const void *body, size_t body_bytes);

/* A durable write streamed by the caller (a payload converted chunk by
 * chunk, a header filled in last with keel_pwrite_all):
 *
 *     keel_atomic_file f;
 *     if ((st = keel_atomic_begin(&f, path)) != KEEL_OK) return st;
 *     if ((st = keel_write_all(f.fd, buf, n, path)) != KEEL_OK) goto fail;
 *     return keel_atomic_commit(&f);
 *   fail:
 *     keel_atomic_abort(&f);
 */
typedef struct {
    int fd;     /* the tmp file, open for writing; -1 once committed or aborted */
    char *path; /* the file it becomes */
    char *tmp;  /* its name until then */
} keel_atomic_file;
/* Create a uniquely named tmp file beside path. On error one line names path
 * and *f needs no cleanup. */
keel_status keel_atomic_begin(keel_atomic_file *f, const char *path);
/* fsync, close, rename over path, fsync the directory; always releases *f.
 * On error the tmp is removed, one line names path, and the old file is
 * untouched (unless only the directory fsync failed: the new file is then in
 * place but not yet known to be durable). */
keel_status keel_atomic_commit(keel_atomic_file *f);
/* Give up: close and remove the tmp, silently. Safe after a commit. */
void keel_atomic_abort(keel_atomic_file *f);

/* Move a finished directory into place durably (a checkpoint's step_N.tmp,
 * an export's staging directory): fsync tmp_dir (its files must be durable
 * already), rename it to dir, fsync dir's parent. An error is one line
 * naming dir; tmp_dir is then left as it was (or in place, if only the last
 * fsync failed). */
keel_status keel_commit_dir(const char *tmp_dir, const char *dir);

/* Open a file a user named, for reading, the one way keel does it: never
 * blocking in open() (a FIFO that nobody writes to would hang it, so it is
 * opened O_NONBLOCK and then fstat'd), and only a regular file — or with
 * pipes_ok also a pipe or FIFO (read as a stream; one without a writer reads
 * as empty). A directory, device, socket (or FIFO) is refused. On success *fd
 * is open (blocking reads again). On failure *fd is -1, `why` says it in words
 * ("No such file or directory", "is a FIFO, not a regular file"), errno is
 * kept (EISDIR for a directory, EINVAL for other kinds), and the status is
 * KEEL_ERR_INPUT for a missing or wrong kind of file, KEEL_ERR_IO otherwise.
 * Nothing is printed: the caller's line names the file, what it should be
 * and the fix. */
keel_status keel_open_read(const char *path, bool pipes_ok, int *fd, char *why, size_t why_n);

/* Read a whole file into a new NUL-terminated buffer (*out, free with
 * keel_free; *len excludes the NUL; len may be NULL). A missing file is
 * KEEL_ERR_INPUT with one line naming it; other failures KEEL_ERR_IO. Pipes
 * and /proc files work too (read to EOF); devices and sockets are refused. */
keel_status keel_read_file(const char *path, char **out, size_t *len);
/* The same without any message, for optional files and for callers that
 * word the error themselves: errno says why (EFBIG when the file is larger
 * than max_bytes; max_bytes 0 = no limit). A missing file, a directory, a
 * device, a file over max_bytes or too large for memory is KEEL_ERR_INPUT,
 * anything else KEEL_ERR_IO. */
keel_status keel_read_file_quiet(const char *path, size_t max_bytes, char **out, size_t *len);
/* keel_read_file_quiet for a file format: a regular file only (see
 * keel_open_read), and the reason in `why` ("is a FIFO, not a regular file",
 * "larger than N bytes", strerror). */
keel_status keel_read_regular(const char *path, size_t max_bytes, char **out, size_t *len, char *why,
                              size_t why_n);
/* true when path exists (any type; symlinks followed, like `test -e`). */
bool keel_path_exists(const char *path);
/* "dir/name" in a new string (keel_free). */
char *keel_path_join(const char *dir, const char *name);

/* ---- thread pool ---------------------------------------------------------- */
/* keel's own threads for non-GEMM kernels. Workers block on a condition
 * variable between jobs (never spin), so they cannot steal cycles from the
 * BLAS threads that run between two of our parallel regions. */

/* chunk is in [0, keel_pool_threads()): a fixed slot for per-chunk partial
 * results, so reductions are deterministic for a given thread count. */
typedef void (*keel_pool_fn)(void *ctx, int64_t begin, int64_t end, int chunk);

/* Start `threads` - 1 workers (the caller is the last one). threads >= 1. */
void keel_pool_init(int threads);
void keel_pool_shutdown(void);
int keel_pool_threads(void);
/* Split [0, n) into contiguous chunks, one per thread, and run fn on each;
 * returns when all are done. Runs inline when n < min_chunk * 2 or 1 thread. */
void keel_pool_for(int64_t n, int64_t min_chunk, keel_pool_fn fn, void *ctx);

/* ---- bfloat16 ------------------------------------------------------------ */
/* The bit pattern of a bfloat16 (the top half of an fp32). */
typedef uint16_t keel_bf16;

/* Round to nearest even; NaNs stay NaNs (quietened). */
/* splitmix64's finalizer: a bijective, well-mixed 64-bit hash — keel's
 * counter-based random numbers (initialisation, dropout masks, the data
 * order, sampling) are this of a seeded counter. */
static inline uint64_t keel_hash64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline keel_bf16 keel_bf16_from_float(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (keel_bf16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (keel_bf16)(u >> 16);
}

static inline float keel_bf16_to_float(keel_bf16 x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- config ------------------------------------------------------------- */

/* Names the config parses once into enums (config.c holds each list's one
 * table; enums only grow at the end). */
typedef enum {                   /* fsdp.strategy, DESIGN §3 */
    KEEL_FSDP_FULL_SHARD = 0,    /* shard over all ranks; free a unit after use */
    KEEL_FSDP_SHARD_GRAD_OP = 1, /* shard over all ranks; keep units from forward to backward */
    KEEL_FSDP_NO_SHARD = 2,      /* full copies on every rank, gradients all-reduced (DDP) */
    KEEL_FSDP_HYBRID_SHARD = 3,  /* FULL_SHARD within groups of K ranks, replicas across groups */
} keel_fsdp_strategy;
typedef enum { KEEL_DTYPE_FP32 = 0, KEEL_DTYPE_BF16 = 1 } keel_dtype;
typedef enum {                   /* resilience.straggler_action */
    KEEL_STRAGGLER_REPORT = 0,   /* an event and the metric */
    KEEL_STRAGGLER_DRAIN = 1,    /* also: its node is treated as one that failed a health check */
} keel_straggler_action;

typedef enum {                   /* fsdp.unit: what one gather holds */
    KEEL_UNIT_BLOCK = 0,         /* a transformer block (PyTorch's per-block wrap) */
    KEEL_UNIT_MATRIX = 1,        /* a block's weight matrices, norms with their neighbour */
} keel_unit_kind;
typedef enum {                   /* resilience.health_checks, keel health --checks */
    KEEL_CHECK_GEMM = 0,
    KEEL_CHECK_MEMORY = 1,
    KEEL_CHECK_CHECKPOINT_DIR = 2,
    KEEL_CHECK_MPI = 3,
    KEEL_CHECK_GPU = 4,
    KEEL_CHECK_COUNT
} keel_health_check;
/* "full_shard", "bf16", "checkpoint_dir", ...: the names config files use. */
const char *keel_strategy_name(keel_fsdp_strategy s);
const char *keel_dtype_name(keel_dtype d);
const char *keel_unit_kind_name(keel_unit_kind k);
const char *keel_health_check_name(keel_health_check c);
/* A comma-separated list of check names as a mask of (1u << check); an
 * unknown name is one error line naming origin and the choices. */
keel_status keel_health_checks_parse(const char *list, const char *origin, unsigned *mask);
/* The mask's names, comma-separated ("" for none). */
void keel_health_checks_format(unsigned mask, char *out, size_t n);

/* model.rope_scaling: how RoPE's frequencies are stretched for a context
 * longer than the one the model was pretrained on. */
typedef enum { KEEL_ROPE_SCALING_LLAMA3 } keel_rope_scaling_type;
typedef struct {
    bool on;              /* false: plain RoPE (the section absent or false) */
    keel_rope_scaling_type type;
    double factor;        /* low frequencies are divided by it */
    double low_freq_factor, high_freq_factor; /* the band between them is blended */
    int original_max_position_embeddings;     /* the pretraining context */
} keel_rope_scaling;

typedef struct {
    int dim;              /* C */
    int n_layers;         /* L */
    int n_heads;          /* NH */
    int n_kv_heads;       /* NKV (0 in a file means = n_heads) */
    int vocab_size;       /* V */
    int multiple_of;      /* Llama 2 hidden-size rule */
    double ffn_dim_multiplier; /* 0 = none */
    double norm_eps;
    double rope_theta;
    keel_rope_scaling rope_scaling;
    int max_seq_len;      /* T: training sequence length */
    bool tie_embeddings;
} keel_model_config;

/* train.lora: low-rank adapters (LoRA) on a frozen base (docs/lora.md). The
 * targets are a block's matrices by their Hugging Face names, in the block's
 * order (keel/model.h). */
typedef enum {
    KEEL_LORA_Q, KEEL_LORA_K, KEEL_LORA_V, KEEL_LORA_O, KEEL_LORA_GATE, KEEL_LORA_UP, KEEL_LORA_DOWN,
    KEEL_LORA_TARGETS
} keel_lora_target;
const char *keel_lora_target_name(keel_lora_target t); /* "q_proj", ... */
/* A mask of targets as their names, comma-separated. */
void keel_lora_targets_format(unsigned mask, char *out, size_t n);
typedef struct {
    bool on;              /* false: every parameter is trained (the section absent or false) */
    int rank;             /* r */
    double alpha;         /* an adapter's output is scaled by alpha / r */
    double dropout;       /* on an adapter's input, in training */
    unsigned targets;     /* mask of (1u << keel_lora_target) */
    char *init_from;      /* an adapter checkpoint whose adapters start the run (NULL: PEFT's initialisation) */
} keel_lora_config;

typedef struct {
    int steps;
    uint64_t seed;
    int micro_batch_size; /* B, sequences per micro-batch per rank */
    int grad_accum_steps;
    double lr;
    double min_lr;        /* cosine floor */
    int warmup_steps;
    double weight_decay;
    bool decay_norms_and_embeddings;
    double beta1, beta2, adam_eps;
    double grad_clip;     /* 0 = off */
    int threads;          /* 0 = all cores */
    int eval_every;       /* 0 = never */
    int eval_batches;
    int profile_steps;    /* 0 = off */
    int sample_every;     /* 0 = off: text samples into RUN/samples.jsonl every N steps */
    char **sample_prompts; /* NULL-terminated; NULL: one empty prompt (BOS alone) */
    int sample_max_tokens;
    double sample_temperature;
    uint64_t sample_seed;
    keel_lora_config lora;
} keel_train_config;

/* A token's flags, one byte a token wherever tokens travel with them (data
 * fetches them from token shards, the model reads them). */
#define KEEL_TOKEN_TRAIN 1u     /* trained on as a target (a loss mask's 1) */
#define KEEL_TOKEN_DOC_START 2u /* the first token of a document */

/* One dataset of a mixture (data.sources). */
typedef struct {
    char *path;           /* a prepared directory (or one shard file) */
    double weight;        /* >= 0: its share of the sequences is weight / (sum of weights) */
} keel_data_source;

typedef struct {
    keel_data_source *v;  /* (n); NULL when n = 0 */
    int n;
} keel_data_sources;

typedef struct {
    char *path;           /* token shards from `keel data prepare` (dir or file); NULL = synthetic */
    keel_data_sources sources; /* a weighted mixture instead of path (n = 0: none) */
    bool document_mask;   /* attention stays inside each packed document */
    char *tokenizer;      /* optional SentencePiece model; vocab checked against model */
    bool synthetic;       /* set when "synthetic" is present */
    uint64_t synthetic_seed;
    int synthetic_branching;  /* successors per token */
    int synthetic_vocab;      /* tokens used (0 = min(vocab, 64)) */
} keel_data_config;

#define KEEL_CHECKPOINT_ALL (-1)

typedef struct {
    keel_fsdp_strategy strategy;
    int shard_group_size; /* hybrid_shard: ranks per shard group (0 = 2) */
    /* How many blocks, from the first, keep only their input and recompute
     * the rest in backward: KEEL_CHECKPOINT_ALL (true in JSON) every block,
     * 0 (false) none; keel_config_checkpoint_blocks resolves it. */
    int activation_checkpointing;
    bool prefetch;        /* start the next unit's all-gather before computing this one */
    bool node_windows;    /* a shard group's ranks on one machine gather into memory they all map */
    keel_dtype mixed_precision; /* GEMM weights and inputs */
    keel_dtype reduce_dtype;    /* gradient reductions */
    keel_unit_kind unit;        /* what one gather holds */
} keel_fsdp_config;

typedef struct {
    int every_steps;      /* 0 = not by steps */
    double every_seconds; /* 0 = not by time */
    int keep_last;        /* 0 = keep all */
    bool async;
} keel_checkpoint_config;

#define KEEL_METRICS_DEFAULT_PORT 9477 /* clear of node-exporter 9100, dcgm-exporter 9400, Prometheus 9090-9093 */
/* A metrics.port the user did not set moves past busy ports to the first free
 * one of this many from the default (9477-9508): a second run on the machine
 * still serves. A port the user set is served or refused, never moved. */
#define KEEL_METRICS_PORT_RANGE 32
typedef struct {
    int port;    /* 0 = no endpoint */
    char *bind;  /* address to listen on; NULL = 127.0.0.1 */
    /* Host names and addresses the dashboard and /api/run also answer to
     * (beside localhost, 127.0.0.1, [::1] and the bind address): a
     * NULL-terminated list, NULL when empty (src/monitor/http.c) */
    char **allowed_hosts;
} keel_metrics_config;

typedef struct {
    int max_restarts;
    double hang_timeout_s;   /* 0 = automatic: hang_factor x median step (>= hang_floor_s) once steady */
    double startup_timeout_s; /* MPI start-up and the first collective (0, JSON null: from the world size) */
    double hang_factor, hang_floor_s;
    double backoff_s;
    int snapshot_every_steps;/* in-memory snapshots under the supervisor (0 = off) */
    int crash_loop;          /* failures in a row, none in a later step than the first, that stop the run */
    double max_loss;         /* a loss above this has diverged (0 = 3 ln V) */
    int spares;              /* Slurm nodes held back as replacements */
    int min_ranks;           /* shrink floor (0 = never shrink) */
    unsigned health_checks;  /* mask of (1u << keel_health_check) */
    double gemm_floor_gflops;
    double straggler_factor; /* a rank this much slower than the others' median... (0 = off) */
    int straggler_steps;     /* ...for this many steps in a row is a straggler */
    keel_straggler_action straggler_action;
} keel_resilience_config;

/* Where the model runs ("device"): the CPU, or NVIDIA GPUs through the CUDA
 * backend (keel/cuda.h, src/backend/cuda.c). */
typedef enum { KEEL_BACKEND_CPU, KEEL_BACKEND_CUDA } keel_backend_kind;
const char *keel_backend_kind_name(keel_backend_kind b);

/* Where a key's value came from: the user set it (a config file, --set, or
 * the environment variable that replaces its default) or it is the default. */
typedef enum { KEEL_FROM_DEFAULT, KEEL_FROM_ENV, KEEL_FROM_FILE, KEEL_FROM_SET } keel_config_origin;
#define KEEL_CONFIG_MAX_KEYS 128 /* the schema's keys (config.c checks it has no more) */

typedef struct {
    keel_model_config model;
    keel_train_config train;
    keel_data_config data;
    keel_fsdp_config fsdp;
    keel_checkpoint_config checkpoint;
    keel_resilience_config resilience;
    keel_metrics_config metrics;
    char *init_from;      /* checkpoint directory to start from, or NULL */
    keel_backend_kind device; /* where the model runs */
    char *source;         /* file the config came from (for messages) */
    /* where each key's value came from, by the schema's key order
     * (keel_config_key_origin; the defaults leave it 0: KEEL_FROM_DEFAULT) */
    unsigned char key_origin[KEEL_CONFIG_MAX_KEYS];
} keel_config;

void keel_config_defaults(keel_config *cfg);
void keel_config_free(keel_config *cfg);
/* Merge a JSON file into cfg. Unknown keys and wrong types are errors. */
keel_status keel_config_load_file(keel_config *cfg, const char *path);
keel_status keel_config_load_string(keel_config *cfg, const char *json, const char *origin);
/* Apply one "dotted.key=value" override; value is JSON or a bare string. */
keel_status keel_config_set(keel_config *cfg, const char *assignment);
/* Fill derived defaults (n_kv_heads 0 -> n_heads, data.path set -> not
 * synthetic) and run the cross-field checks (shapes, ranges). */
keel_status keel_config_finalize(keel_config *cfg);
/* Where key's value came from: KEEL_FROM_DEFAULT unless a config file, --set
 * or the key's environment variable ($KEEL_METRICS_PORT) gave it (the last
 * one that did). An unknown key is a bug (KEEL_CHECK). */
keel_config_origin keel_config_key_origin(const keel_config *cfg, const char *key);
/* Resolved config as pretty JSON; caller frees with free(). */
char *keel_config_to_json(const keel_config *cfg);
/* Print the documentation table of every key (markdown) to stdout. */
void keel_config_print_keys(void);
/* fsdp.activation_checkpointing as a count of blocks in [0, model.n_layers]. */
int keel_config_checkpoint_blocks(const keel_config *cfg);
/* An fsdp.activation_checkpointing value as the config writes it: true,
 * false or the count. */
void keel_config_format_checkpointing(int n, char *out, size_t size);

#endif
