/* infer/logprobs.c: a row of logits as log-probabilities — the log-sum-exp
 * and the k most likely tokens (infer/logprobs.h). */
#include <math.h>

#include "infer/logprobs.h"

double infer_logsumexp(const float *z, int V, int32_t *best) {
    int32_t b = 0;
    for (int j = 1; j < V; j++)
        if (z[j] > z[b]) b = j;
    double mx = z[b], sum = 0;
    for (int j = 0; j < V; j++) sum += exp((double)z[j] - mx);
    if (best) *best = b;
    return mx + log(sum);
}

void infer_top_tokens(const float *z, int V, double lse, int k, int32_t *ids, double *logprobs) {
    if (k <= 0) return;
    int n = 0;
    for (int j = 0; j < V; j++) {
        if (n == k && !(z[j] > z[ids[k - 1]])) continue;
        int at = n < k ? n++ : k - 1; /* full: the last one drops out */
        while (at > 0 && z[j] > z[ids[at - 1]]) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = j;
    }
    for (int i = 0; i < k; i++) {
        if (i >= n) ids[i] = -1;
        logprobs[i] = i < n ? (double)z[ids[i]] - lse : -INFINITY;
    }
}
