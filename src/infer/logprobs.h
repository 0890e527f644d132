/* infer/logprobs.h: log-probabilities from a row of logits — its
 * log-sum-exp and its k most likely tokens — which scoring (score.c) and
 * generation's per-token logprobs (generate.c) share. Internal to the infer
 * module. */
#ifndef KEEL_INFER_LOGPROBS_H
#define KEEL_INFER_LOGPROBS_H

#include <stdint.h>

/* log Σ exp(z[j]) over z (V), in double over the fp32 logits; *best (when
 * not NULL) gets the most likely id, the lowest on a tie (torch.argmax's). */
double infer_logsumexp(const float *z, int V, int32_t *best);
/* The k most likely tokens of z (V), most likely first, the lowest id first
 * on a tie, in ids[0, k) with their log-probabilities z - lse; when k > V the
 * entries past V are id -1. */
void infer_top_tokens(const float *z, int V, double lse, int k, int32_t *ids, double *logprobs);

#endif
