/* kernels/peak.c: the MFU yardstick — the FLOP/s this machine can do in the
 * instruction set keel's GEMMs run on, measured and cached per machine.
 *
 * The build machines have been Intel with AMX (fp32 ~230 GF/s per core, AMX
 * bf16 ~3.5 TF/s), AMD Zen 4 (AVX-512 + AVX512_BF16, ~118 GF/s) and AMD Zen 3
 * (AVX2 only). The old yardstick ran 64-byte GNU vectors everywhere, which
 * GCC splits through the stack on AVX2: it read 12.7 GF/s while OpenBLAS ran
 * at 85, and MFU printed 675%. So each instruction set has its own kernel
 * here, chosen like every other kernel (isa.c), and the GEMM library's own
 * rate is measured too: the yardstick is the higher of the two. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cblas.h>

#include "keel/kernels.h"
#include "kernels/amx.h"

typedef struct {
    int64_t iters;
    float sink; /* keeps the work observable */
} peak_ctx;

/* ---- one kernel per instruction set ----------------------------------------
 * Each runs CHAINS independent multiply-add chains in named registers: an
 * array of vectors stayed in memory in the -O2 sanitizer build (its loads
 * and stores checked), and read a quarter of the peak. */
#define CHAINS 12 /* independent chains: > latency (4-5) x FMA ports (2) on any x86 we run on */
#define EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DECLARE(j) V a##j = SET1((float)j);
#define STEP(j) a##j = OP(a##j, x, y);
#define SUM(j) s = ADD(s, a##j);
#define CHAIN_BODY                                  \
    EACH(DECLARE)                                   \
    for (int64_t i = 0; i < c->iters; i++) {        \
        EACH(STEP)                                  \
    }                                               \
    V s = SET1(0.0f);                               \
    EACH(SUM)

__attribute__((target("avx2,fma"))) static void fma_chains_avx2(peak_ctx *c) {
#define V __m256
#define SET1 _mm256_set1_ps
#define OP _mm256_fmadd_ps
#define ADD _mm256_add_ps
    __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-3f);
    CHAIN_BODY
    c->sink = _mm256_cvtss_f32(s);
#undef V
#undef SET1
#undef OP
#undef ADD
}

__attribute__((target("avx512f"))) static void fma_chains_avx512(peak_ctx *c) {
#define V __m512
#define SET1 _mm512_set1_ps
#define OP _mm512_fmadd_ps
#define ADD _mm512_add_ps
    __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
    CHAIN_BODY
    c->sink = _mm512_reduce_add_ps(s);
#undef OP
}

/* VDPBF16PS: 32 bf16 products summed into 16 fp32 lanes, 64 FLOPs. */
__attribute__((target("avx512f,avx512bf16"))) static void dpbf16_chains_avx512bf16(peak_ctx *c) {
#define OP _mm512_dpbf16_ps
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f7f), y = (__m512bh)_mm512_set1_epi16(0x3a83);
    CHAIN_BODY
    c->sink = _mm512_reduce_add_ps(s);
#undef V
#undef SET1
#undef OP
#undef ADD
}

/* AMX: TDPBF16PS multiplies a 16x32 bf16 tile by a 32x16 one (as 16 rows of
 * 16 pairs) into a 16x16 fp32 tile: 16384 FLOPs. Four accumulator tiles from
 * two A and two B tiles cover its latency (~52 cycles at one per 16). The
 * tiles' configuration is amx.h's. */

__attribute__((target("amx-tile,amx-bf16"))) static void tdpbf16_tiles_amx(peak_ctx *c) {
    _Alignas(64) keel_bf16 operand[16 * 32];
    _Alignas(64) float result[16 * 16];
    for (int i = 0; i < 16 * 32; i++) operand[i] = 0x3a83; /* 1e-3 */
    __asm__ volatile("" : : "r"(operand) : "memory"); /* the tile loads read it */
    amx_load_16x64();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, operand, 64);
    _tile_loadd(5, operand, 64);
    _tile_loadd(6, operand, 64);
    _tile_loadd(7, operand, 64);
    for (int64_t i = 0; i < c->iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, result, 64);
    _tile_release();
    c->sink = result[0];
}

typedef struct {
    void (*run)(peak_ctx *);
    double flops_per_iter;
    const char *name;
} peak_kernel;

/* The kernel for the instruction set the GEMMs of this precision run on. */
static peak_kernel kernel_for(bool bf16_gemms) {
    keel_isa isa = keel_isa_active();
    if (bf16_gemms && isa >= KEEL_ISA_AMX)
        return (peak_kernel){tdpbf16_tiles_amx, 4 * 16 * 16 * 32 * 2, "AMX TDPBF16PS"};
    if (bf16_gemms) return (peak_kernel){dpbf16_chains_avx512bf16, CHAINS * 64, "AVX512_BF16 VDPBF16PS"};
    if (isa >= KEEL_ISA_AVX512) return (peak_kernel){fma_chains_avx512, CHAINS * 16 * 2, "AVX-512 FMA"};
    return (peak_kernel){fma_chains_avx2, CHAINS * 8 * 2, "AVX2 FMA"};
}

/* One core, best of five runs of >= 5 ms: on these shared VMs a second vCPU's
 * speed swings by +-30% from run to run, and MFU should charge that to
 * keel's run, not move the yardstick; a run disturbed by a neighbour is only
 * ever slower, so the best is the truest. */
static double kernel_rate(peak_kernel k) {
    peak_ctx c = {.iters = 1 << 12};
    for (;;) { /* iterations for ~5 ms, whatever the kernel's speed */
        double t0 = keel_now_s();
        k.run(&c);
        if (keel_now_s() - t0 >= 5e-3 || c.iters >= (int64_t)1 << 40) break;
        c.iters *= 2;
    }
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = keel_now_s();
        k.run(&c);
        double dt = keel_now_s() - t0;
        if (dt > 0 && (double)c.iters * k.flops_per_iter / dt > best)
            best = (double)c.iters * k.flops_per_iter / dt;
    }
    return best;
}

static bool bf16_gemms(bool bf16) { return bf16 && keel_bf16_native(NULL); }

double keel_peak_kernel_flops(bool bf16) {
    return kernel_rate(kernel_for(bf16_gemms(bf16))) * keel_pool_threads();
}

/* The library's best over a few (M,N,K) = (1024,1024,1024) GEMMs through
 * keel's own entry points (keel's pool, as in training): a yardstick below
 * what the library reaches would be wrong whatever the kernels say (e.g.
 * OpenBLAS on AVX-512 under KEEL_MAX_ISA=avx2 without OPENBLAS_CORETYPE). */
double keel_peak_library_flops(bool bf16) {
    enum { S = 1024 };
    bool native = bf16_gemms(bf16);
    size_t elems = (size_t)S * S;
    float *out = keel_xmalloc(sizeof(float) * elems, "peak GEMM");
    float *x = keel_xmalloc(sizeof(float) * elems * 2, "peak GEMM");
    keel_bf16 *h = keel_xmalloc(sizeof(keel_bf16) * elems * 2, "peak GEMM");
    for (size_t i = 0; i < 2 * elems; i++) x[i] = (float)(i % 17) * 0.01f - 0.08f;
    keel_f32_to_bf16(h, x, (int64_t)(2 * elems));
    double best = 0, spent = 0;
    for (int rep = 0; rep < 12 && (rep < 4 || spent < 0.05); rep++) { /* the first warms up */
        double t0 = keel_now_s();
        if (native) keel_gemm_bf16(out, h, false, h + elems, true, S, S, S, false);
        else keel_matmul_forward(out, x, x + elems, S, S, S, false);
        double dt = keel_now_s() - t0;
        if (rep > 0) spent += dt;
        if (rep > 0 && dt > 0 && 2.0 * S * S * S / dt > best) best = 2.0 * S * S * S / dt;
    }
    keel_free(out);
    keel_free(x);
    keel_free(h);
    return best;
}

/* ---- the per-machine cache -------------------------------------------------- */

/* "<model name> (family F, model M, stepping S)": VMs often show a bare
 * "AMD EPYC" for different generations; the numbers tell them apart. */
static void cpu_name(char *out, size_t n) {
    char name[256] = "unknown CPU", family[32] = "?", model[32] = "?", stepping[32] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *v = colon + 1 + (colon[1] == ' ');
        v[strcspn(v, "\n")] = '\0';
        if (!strncmp(line, "model name", 10)) snprintf(name, sizeof name, "%s", v);
        else if (!strncmp(line, "cpu family", 10)) snprintf(family, sizeof family, "%s", v);
        else if (!strncmp(line, "model\t", 6)) snprintf(model, sizeof model, "%s", v);
        else if (!strncmp(line, "stepping", 8)) snprintf(stepping, sizeof stepping, "%s", v);
        else if (!strncmp(line, "processor", 9) && strcmp(family, "?"))
            break; /* the first processor is enough */
    }
    if (f) fclose(f);
    snprintf(out, n, "%s (family %s, model %s, stepping %s)", name, family, model, stepping);
}

/* Everything the yardstick depends on. */
static void cache_key(char *out, size_t n, bool bf16) {
    char cpu[400];
    cpu_name(cpu, sizeof cpu);
    const char *core = openblas_get_corename();
    snprintf(out, n, "%s | cpu %s | isa %s | openblas %s | %d threads | %s", cpu,
             keel_isa_name(keel_isa_cpu()), keel_isa_name(keel_isa_active()), core ? core : "?",
             keel_pool_threads(), bf16_gemms(bf16) ? "bf16" : "fp32");
}

static bool cache_path(char *out, size_t n, bool dir_only) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w;
    if (xdg && xdg[0] == '/') w = snprintf(out, n, "%s/keel%s", xdg, dir_only ? "" : "/peak.json");
    else if (home && home[0]) w = snprintf(out, n, "%s/.cache/keel%s", home, dir_only ? "" : "/peak.json");
    else return false;
    return w > 0 && (size_t)w < n;
}

/* The whole cache file, or NULL when there is none yet; *damaged when there
 * is one that is not a cache (then it is rewritten from scratch). */
static cJSON *cache_load(bool *damaged) {
    char path[4096];
    *damaged = false;
    if (!cache_path(path, sizeof path, false)) return NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char buf[1 << 16];
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    bool whole = feof(f);
    fclose(f);
    buf[got] = '\0';
    cJSON *j = whole ? cJSON_Parse(buf) : NULL;
    cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "keel-peak-cache") ||
        !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "entries"))) {
        keel_log_warn("%s is not a keel peak cache (damaged?): ignored, it will be rewritten", path);
        cJSON_Delete(j);
        *damaged = true;
        return NULL;
    }
    return j;
}

static double cache_get(const char *key) {
    bool damaged;
    cJSON *j = cache_load(&damaged);
    cJSON *e = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "entries"), key);
    cJSON *flops = cJSON_GetObjectItemCaseSensitive(e, "flops");
    double v = cJSON_IsNumber(flops) && isfinite(flops->valuedouble) && flops->valuedouble > 0
                   ? flops->valuedouble : 0;
    cJSON_Delete(j);
    return v;
}

static void mkdir_p(char *path) {
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    mkdir(path, 0755);
}

/* Adds or replaces one entry. A temp file renamed over the old one, so that
 * ranks and runs reading at the same time see a whole file; no fsync: after a
 * crash a damaged cache is only measured again. Failures are not errors. */
static void cache_put(const char *key, double flops, double kernel, double library,
                      const char *kernel_name) {
    char dir[4096], path[4200], tmp[4300];
    if (!cache_path(dir, sizeof dir, true)) return;
    mkdir_p(dir);
    snprintf(path, sizeof path, "%s/peak.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    bool damaged;
    cJSON *j = cache_load(&damaged);
    if (!j) {
        j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "format", "keel-peak-cache");
        cJSON_AddNumberToObject(j, "version", 1);
        cJSON_AddObjectToObject(j, "entries");
    }
    cJSON *entries = cJSON_GetObjectItemCaseSensitive(j, "entries");
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "flops", flops);
    cJSON_AddNumberToObject(e, "kernel_flops", kernel);
    cJSON_AddNumberToObject(e, "library_flops", library);
    cJSON_AddStringToObject(e, "kernel", kernel_name);
    cJSON_DeleteItemFromObjectCaseSensitive(entries, key);
    cJSON_AddItemToObject(entries, key, e);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fputs(text, f) >= 0;
    if (f) ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        keel_log_debug("peak cache %s not written: %s", path, strerror(errno));
        unlink(tmp);
    }
    free(text);
}

/* ---- the yardstick ----------------------------------------------------------- */

static double override_flops(void) {
    const char *env = getenv("KEEL_PEAK_FLOPS");
    return env && atof(env) > 0 ? atof(env) : 0;
}

/* Measures both, logs what was found, caches the higher. */
static double measure_and_cache(const char *key, bool bf16, const char *why) {
    peak_kernel k = kernel_for(bf16_gemms(bf16));
    double per_core = kernel_rate(k), kernel = per_core * keel_pool_threads();
    double library = keel_peak_library_flops(bf16);
    double peak = kernel > library ? kernel : library;
    keel_log_info("%s peak %.1f GF/s (%s): %s %.1f GF/s per core x %d thread(s), %s GEMMs %.1f "
                  "GF/s; cached", bf16_gemms(bf16) ? "bf16" : "fp32", peak / 1e9, why, k.name,
                  per_core / 1e9, keel_pool_threads(), bf16_gemms(bf16) ? "oneDNN" : "OpenBLAS",
                  library / 1e9);
    cache_put(key, peak, kernel, library, k.name);
    return peak;
}

double keel_peak_flops(bool bf16) {
    double env = override_flops();
    if (env > 0) return env;
    char key[1024];
    cache_key(key, sizeof key, bf16);
    double cached = cache_get(key);
    return cached > 0 ? cached : measure_and_cache(key, bf16, "measured on this machine");
}

double keel_peak_revise(double peak, double achieved, int ranks, bool bf16) {
    static bool logged;
    if (!(achieved > peak)) return peak;
    if (ranks < 1) ranks = 1;
    bool first = !logged;
    logged = true;
    if (override_flops() > 0) {
        if (first)
            keel_log_warn("a step ran at %.1f GF/s, above KEEL_PEAK_FLOPS (%.1f GF/s over %d "
                          "rank(s)): MFU is against what the steps reach from here",
                          achieved / 1e9, peak / 1e9, ranks);
        return achieved;
    }
    char key[1024];
    cache_key(key, sizeof key, bf16);
    if (first) {
        keel_log_warn("a step ran at %.1f GF/s, above the MFU yardstick (%.1f GF/s over %d "
                      "rank(s)): the yardstick was wrong (measured while the machine was busy, "
                      "or a stale cache), measuring again", achieved / 1e9, peak / 1e9, ranks);
        double fresh = measure_and_cache(key, bf16, "measured again") * ranks;
        if (fresh >= achieved) return fresh;
    }
    /* the steps themselves beat every measurement: they are the yardstick */
    cache_put(key, achieved / ranks, 0, 0, "a training step's own rate");
    return achieved;
}
