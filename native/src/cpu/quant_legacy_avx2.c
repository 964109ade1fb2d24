/*
 * quant_legacy_avx2.c — avx2 overrides of the legacy family's kernels (see quant_blocks.h).
 */
#include <immintrin.h>

#include "quant_blocks.h"
#include "strata.h"

void quant_legacy_avx2(quant_traits t[]) { (void)t; }
