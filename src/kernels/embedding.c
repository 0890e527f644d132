/* kernels/embedding.c: the token embedding's lookup and its gradient. */
#include <string.h>

#include "keel/kernels.h"

void keel_embedding_forward(float *out, const float *table, const int32_t *tokens, int N, int C) {
    for (int i = 0; i < N; i++)
        memcpy(out + (int64_t)i * C, table + (int64_t)tokens[i] * C, sizeof(float) * (size_t)C);
}

void keel_embedding_forward_bf16(float *out, const keel_bf16 *table, const int32_t *tokens, int N, int C) {
    for (int i = 0; i < N; i++) keel_bf16_to_f32(out + (int64_t)i * C, table + (int64_t)tokens[i] * C, C);
}

/* Sequential: a parallel split by rows would add a repeated token's rows in
 * an order that depends on the threads. */
void keel_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int N, int C) {
    for (int i = 0; i < N; i++) {
        float *row = dtable + (int64_t)tokens[i] * C;
        const float *d = dout + (int64_t)i * C;
        for (int j = 0; j < C; j++) row[j] += d[j];
    }
}
