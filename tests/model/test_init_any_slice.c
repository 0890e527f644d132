/* Initialisation is a function of (seed, tensor, element): any slice of the
 * canonical vector, filled alone, equals the same slice of a whole
 * initialisation — so every FSDP rank fills only its shard and any world size
 * gets the same model. The values are N(0, 0.02^2) (norm weights 1), and a
 * different seed gives a different model. The fill runs on keel's pool: the
 * whole filled by one thread equals it filled by three. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/model.h"

#include "../testlib.h"

int main(void) {
    keel_model_config mc = {.dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 3001,
                            .multiple_of = 16, .norm_eps = 1e-5, .rope_theta = 10000, .max_seq_len = 16};
    keel_model_layout lay;
    keel_model_layout_init(&lay, &mc);
    int64_t n = lay.n_params;
    float *whole = keel_xmalloc(sizeof(float) * (size_t)n, "whole"), *part = keel_xmalloc(sizeof(float) * (size_t)n, "part");
    keel_model_init_params(&lay, 7, whole); /* one thread: the pool is not started */
    keel_pool_init(3);
    keel_model_init_params(&lay, 7, part);
    EXPECT(!memcmp(part, whole, sizeof(float) * (size_t)n), "three threads fill the model one thread fills, bit for bit");

    /* slices of every parity and size, crossing tensor and unit boundaries */
    uint64_t x = 12345;
    int bad = 0, tried = 0;
    for (int k = 0; k < 400; k++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int64_t begin = (int64_t)((x >> 20) % (uint64_t)n), len = (int64_t)((x >> 5) % 5000) + 1;
        if (begin + len > n) len = n - begin;
        keel_model_init_range(&lay, 7, begin, len, part);
        bad += memcmp(part, whole + begin, sizeof(float) * (size_t)len) != 0;
        tried++;
    }
    EXPECT(bad == 0, "%d of %d random slices equal the whole initialisation bit for bit", tried - bad, tried);
    /* the slices of a 3-way shard of every unit, put together, are the whole */
    memset(part, 0, sizeof(float) * (size_t)n);
    for (int u = 0; u < lay.n_units; u++)
        for (int r = 0; r < 3; r++) {
            int64_t size = lay.unit_size[u], per = (size + 2) / 3, b = r * per, e = b + per < size ? b + per : size;
            if (b < e) keel_model_init_range(&lay, 7, lay.unit_offset[u] + b, e - b, part + lay.unit_offset[u] + b);
        }
    EXPECT(!memcmp(part, whole, sizeof(float) * (size_t)n), "three ranks' shards make the same model as one");

    double sum = 0, sumsq = 0;
    int64_t count = 0;
    bool norms_one = true;
    for (int i = 0; i < lay.n_tensors; i++) {
        const keel_tensor_info *t = &lay.tensors[i];
        for (int64_t j = 0; j < t->rows * t->cols; j++) {
            float v = whole[t->offset + j];
            if (t->cols == 1) norms_one &= v == 1.0f;
            else sum += v, sumsq += (double)v * v, count++;
        }
    }
    double mean = sum / (double)count, sd = sqrt(sumsq / (double)count - mean * mean);
    /* bounds: 5 standard errors of the mean and of the standard deviation */
    double se = 0.02 / sqrt((double)count);
    EXPECT(norms_one, "norm weights are 1");
    EXPECT(fabs(mean) < 5 * se && fabs(sd - 0.02) < 5 * 0.02 / sqrt(2.0 * (double)count),
           "N(0, 0.02^2): mean %.2e, sd %.5f over %lld values", mean, sd, (long long)count);
    keel_model_init_params(&lay, 8, part);
    EXPECT(memcmp(part, whole, sizeof(float) * (size_t)n) != 0, "another seed, another model");
    keel_free(whole);
    keel_free(part);
    keel_model_layout_free(&lay);
    keel_pool_shutdown();
    return test_summary("test_init_any_slice");
}
