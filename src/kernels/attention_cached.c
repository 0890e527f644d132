/* kernels/attention_cached.c: attention of new query rows against a KV cache,
 * for generation (keel_attention_cached in keel/kernels.h).
 *
 * Each (row, query head) is one task on keel's pool: its query meets the
 * keys 0..pos of its sequence a tile at a time with an online softmax (a
 * running max and sum, FlashAttention's), so no scores are stored and the
 * context may be as long as the cache. Decoding reads every cached key and
 * value once per head group: memory, not arithmetic, sets its time. */
#include <math.h>
#include <string.h>

#include "keel/kernels.h"

enum { KEY_TILE = 64 };

typedef struct {
    float *out;
    const float *q;
    const float *kc, *vc;
    const int32_t *seq, *pos;
    int NH, NKV, HS, T_max;
} cached_ctx;

/* a · b over n floats, in eight partial sums the compiler vectorizes */
static float dot(const float *a, const float *b, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) t += a[i] * b[i];
    return t;
}

static void attend(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    const cached_ctx *c = p;
    int HS = c->HS, KVD = c->NKV * HS, group = c->NH / c->NKV;
    float scale = 1.0f / sqrtf((float)HS), score[KEY_TILE];
    for (int64_t task = begin; task < end; task++) {
        int64_t i = task / c->NH;
        int h = (int)(task % c->NH), kvh = h / group, last = c->pos[i];
        const float *q = c->q + (i * c->NH + h) * HS;
        int64_t base = (int64_t)c->seq[i] * c->T_max * KVD + (int64_t)kvh * HS;
        float *o = c->out + (i * c->NH + h) * HS;
        memset(o, 0, sizeof(float) * (size_t)HS);
        float run_max = -INFINITY, run_sum = 0;
        for (int j0 = 0; j0 <= last; j0 += KEY_TILE) {
            int n = last + 1 - j0 < KEY_TILE ? last + 1 - j0 : KEY_TILE;
            float tile_max = -INFINITY;
            for (int j = 0; j < n; j++) {
                score[j] = scale * dot(q, c->kc + base + (int64_t)(j0 + j) * KVD, HS);
                tile_max = fmaxf(tile_max, score[j]);
            }
            float new_max = fmaxf(run_max, tile_max), rescale = expf(run_max - new_max);
            if (rescale != 1.0f) {
                run_sum *= rescale;
                for (int d = 0; d < HS; d++) o[d] *= rescale;
            }
            for (int j = 0; j < n; j++) {
                float w = expf(score[j] - new_max);
                run_sum += w;
                const float *v = c->vc + base + (int64_t)(j0 + j) * KVD;
                for (int d = 0; d < HS; d++) o[d] += w * v[d];
            }
            run_max = new_max;
        }
        float inv = 1.0f / run_sum;
        for (int d = 0; d < HS; d++) o[d] *= inv;
    }
}

void keel_attention_cached(float *out, const float *q, const float *k, const float *v, float *kcache, float *vcache,
                           const int32_t *seq, const int32_t *pos, int N, int NH, int NKV, int HS, int T_max) {
    size_t KVD = (size_t)NKV * HS;
    for (int i = 0; i < N; i++) { /* every row's key and value first: a later row may read an earlier one's */
        size_t at = ((size_t)seq[i] * (size_t)T_max + (size_t)pos[i]) * KVD;
        memcpy(kcache + at, k + (size_t)i * KVD, sizeof(float) * KVD);
        memcpy(vcache + at, v + (size_t)i * KVD, sizeof(float) * KVD);
    }
    cached_ctx c = {out, q, kcache, vcache, seq, pos, NH, NKV, HS, T_max};
    keel_pool_for((int64_t)N * NH, 1, attend, &c);
}
