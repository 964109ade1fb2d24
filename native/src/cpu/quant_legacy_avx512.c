/*
 * quant_legacy_avx512.c — avx512 overrides of the legacy family's kernels (see quant_blocks.h).
 */
#include <immintrin.h>

#include "quant_blocks.h"
#include "strata.h"

void quant_legacy_avx512(quant_traits t[]) { (void)t; }
