/*
 * quant.c — the type registry: block sizes of every GGUF type, and one traits table per kernel
 * level, filled by the type families (see quant.h), chosen at run time from the CPU's features.
 */
#include "quant.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "cpu/quant_blocks.h"
#include "cpu/quant_low.h"
#include "strata.h"
#include "trace.h"

/* ---- block geometry of every GGUF type (whether or not strata has kernels for it) -------------- */

typedef struct type_geom {
    const char *name;
    int32_t block;
    int32_t bytes;
} type_geom;

static const type_geom k_geom[QUANT_N_TYPES] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},      [3] = {"Q4_1", 32, 20},
    [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},      [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 36},
    [10] = {"Q2_K", 256, 84},    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66}, [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},   [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},   [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},        [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},   [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},
};

const char *quant_type_name(int32_t type) {
    if (type < 0 || type >= QUANT_N_TYPES) return NULL;
    return k_geom[type].name;
}

int64_t quant_row_bytes(int32_t type, int64_t n) {
    if (type < 0 || type >= QUANT_N_TYPES || !k_geom[type].name || n < 0) return -1;
    if (n % k_geom[type].block != 0) return -1;
    return n / k_geom[type].block * k_geom[type].bytes;
}

/* ---- the families ------------------------------------------------------------------------------ */

static const quant_register_fn k_families[] = {
    quant_register_base,   /* F32 F16 BF16 Q8_0 */
    quant_register_legacy, /* Q4_0 Q4_1 Q5_0 Q5_1 */
    quant_register_k,      /* Q2_K Q3_K Q4_K Q5_K Q6_K, Q8_K activations */
    quant_register_iq,     /* IQ4_NL IQ4_XS IQ3_XXS IQ3_S IQ2_XS */
    quant_register_low,    /* IQ2_XXS IQ2_S IQ1_S IQ1_M MXFP4 */
};

/* ---- CPU features ------------------------------------------------------------------------------ */

static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

static int cpu_has_avx512(void) {
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}

int32_t quant_cpu_best(void) {
    const int32_t best = cpu_has_avx512() ? STRATA_SIMD_AVX512 : cpu_has_avx2() ? STRATA_SIMD_AVX2 : STRATA_SIMD_SCALAR;
    const int32_t cap = env_simd_cap(); /* STRATA_SIMD: run auto as a smaller CPU would */
    return cap >= STRATA_SIMD_SCALAR && cap < best ? cap : best;
}

int quant_simd_supported(int32_t simd) {
    switch (simd) {
    case STRATA_SIMD_AUTO:
    case STRATA_SIMD_SCALAR: return 1;
    case STRATA_SIMD_AVX2: return cpu_has_avx2();
    case STRATA_SIMD_AVX512: return cpu_has_avx512();
    default: return 0;
    }
}

/* Filled once: the feature names as /proc/cpuinfo spells them (avx512_vnni aside). */
static char g_features[192];

static void features_fill(void) {
    size_t k = 0;
    __builtin_cpu_init();
#define FEAT(name)                                                                                                     \
    if (__builtin_cpu_supports(name) && k < sizeof g_features)                                                         \
        k += (size_t)snprintf(g_features + k, sizeof g_features - k, "%s%s", k ? " " : "", name);
    FEAT("avx")
    FEAT("avx2") FEAT("fma") FEAT("f16c") FEAT("avx512f") FEAT("avx512bw") FEAT("avx512vl") FEAT("avx512dq")
        FEAT("avx512vnni") FEAT("avx512bf16")
#undef FEAT
}

const char *quant_cpu_features(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, features_fill);
    return g_features;
}

/* ---- the tables -------------------------------------------------------------------------------- */

float quant_f16_lut[1 << 16];

/* Index 0 is unused (AUTO); levels 1..3 are SCALAR, AVX2, AVX512. */
static quant_traits g_tables[4][QUANT_N_TYPES];
static quant_dot_x4_fn g_x4[4][QUANT_N_TYPES];
static quant_dot_xn_fn g_xn[4][QUANT_N_TYPES];
static quant_dot_4xn_fn g_4xn[4][QUANT_N_TYPES];

/* The level of a table (or of a traits record inside one), or -1. */
static int level_of(const quant_traits *p) {
    for (int l = STRATA_SIMD_SCALAR; l <= STRATA_SIMD_AVX512; l++)
        if (p >= g_tables[l] && p < g_tables[l] + QUANT_N_TYPES) return l;
    return -1;
}

void quant_set_x4(const quant_traits table[], int32_t type, quant_dot_x4_fn fn) {
    int l = level_of(table);
    if (l >= 0 && type >= 0 && type < QUANT_N_TYPES) g_x4[l][type] = fn;
}

quant_dot_x4_fn quant_get_x4(const quant_traits *traits) {
    int l = traits ? level_of(traits) : -1;
    return l >= 0 ? g_x4[l][traits - g_tables[l]] : NULL;
}

void quant_set_xn(const quant_traits table[], int32_t type, quant_dot_xn_fn fn) {
    int l = level_of(table);
    if (l >= 0 && type >= 0 && type < QUANT_N_TYPES) g_xn[l][type] = fn;
}

quant_dot_xn_fn quant_get_xn(const quant_traits *traits) {
    int l = traits ? level_of(traits) : -1;
    return l >= 0 ? g_xn[l][traits - g_tables[l]] : NULL;
}

void quant_set_4xn(const quant_traits table[], int32_t type, quant_dot_4xn_fn fn) {
    int l = level_of(table);
    if (l >= 0 && type >= 0 && type < QUANT_N_TYPES) g_4xn[l][type] = fn;
}

quant_dot_4xn_fn quant_get_4xn(const quant_traits *traits) {
    int l = traits ? level_of(traits) : -1;
    return l >= 0 ? g_4xn[l][traits - g_tables[l]] : NULL;
}

static void tables_build(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) quant_f16_lut[h] = strata_f16_to_f32((uint16_t)h);
    for (int32_t level = STRATA_SIMD_SCALAR; level <= STRATA_SIMD_AVX512; level++) {
        /* Registering a level's kernels only stores pointers; they are run only on CPUs that have
         * the level (quant_simd_supported), so every table can be built everywhere. */
        for (size_t f = 0; f < sizeof k_families / sizeof k_families[0]; f++) k_families[f](g_tables[level], level);
    }
}

const quant_traits *quant_table(int32_t simd) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, tables_build);
    if (simd == STRATA_SIMD_AUTO) simd = quant_cpu_best();
    if (simd < STRATA_SIMD_SCALAR || simd > STRATA_SIMD_AVX512) return NULL;
    return g_tables[simd];
}

const quant_traits *quant_lookup(const quant_traits *table, int32_t type) {
    if (!table || type < 0 || type >= QUANT_N_TYPES) return NULL;
    const quant_traits *t = &table[type];
    return (t->dequant && t->vec_dot) ? t : NULL;
}

/* ---- the process-wide level of the kernel entry points (strata_matvec & co.) ------------------- */

static _Atomic int32_t g_level = STRATA_SIMD_AUTO;

int32_t quant_select(int32_t simd) {
    if (!quant_simd_supported(simd)) return -1;
    if (simd == STRATA_SIMD_AUTO) simd = quant_cpu_best();
    atomic_store(&g_level, simd);
    return simd;
}

const quant_traits *quant_current_table(void) { return quant_table(atomic_load(&g_level)); }

const quant_traits *quant_get(int32_t type) { return quant_lookup(quant_current_table(), type); }
