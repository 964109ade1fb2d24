/* norm.c — RMSNorm over rows on the host (the blocks and the output head use it). */
#include <math.h>

#include "engine_internal.h"

void rmsnorm_rows(float *out, const float *x, const float *w, int32_t n, int32_t D, float eps) {
    for (int32_t i = 0; i < n; i++) {
        const float *xi = x + (int64_t)i * D;
        float *oi = out + (int64_t)i * D;
        double ss = 0.0;
        for (int32_t d = 0; d < D; d++) ss += (double)xi[d] * (double)xi[d];
        float r = (float)(1.0 / sqrt(ss / D + (double)eps));
        for (int32_t d = 0; d < D; d++) oi[d] = xi[d] * r * w[d];
    }
}
