/*
 * gguf.h — a bounds-checked reader for GGUF files (versions 2 and 3), mapped read-only.
 *
 * Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata count, the
 * metadata key/values, the tensor infos (name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset),
 * padding to general.alignment (default 32), then the tensor data. Every count, string length,
 * offset and tensor extent is checked against the file size before it is used, so that a truncated
 * or corrupted file gives STRATA_ERR_FORMAT with a message and never a read outside the mapping.
 * Keys, names and string values point into the mapping and are not NUL-terminated.
 *
 * Split models (llama.cpp's gguf-split and gguf-py's writer make them): PREFIX-00001-of-0000N.gguf ..
 * PREFIX-0000N-of-0000N.gguf, each a complete GGUF file whose header says split.no (u16, 0-based),
 * split.count (u16, N) and split.tensors.count (i32, the tensors of all parts together). The metadata
 * is in the first part; the tensors are spread over the parts, each part's offsets counted from its own
 * data section. gguf_open on the first part maps every part and merges their tensor lists, so a
 * split model reads as one file: tensors[i].data points into whichever part holds it.
 */
#ifndef STRATA_GGUF_H
#define STRATA_GGUF_H

#include <stdint.h>

#include "error.h"

enum gguf_vtype {
    GGUF_VT_UINT8 = 0,
    GGUF_VT_INT8 = 1,
    GGUF_VT_UINT16 = 2,
    GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5,
    GGUF_VT_FLOAT32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10,
    GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
    GGUF_VT_COUNT
};

#define GGUF_MAX_DIMS 4

typedef struct gguf_kv {
    const char *key; /* not NUL-terminated */
    uint64_t key_len;
    uint32_t type;      /* gguf_vtype */
    const uint8_t *val; /* the value's bytes (for arrays: the first element) */
    uint32_t arr_type;  /* arrays: element type */
    uint64_t arr_n;     /* arrays: element count */
} gguf_kv;

typedef struct gguf_tensor {
    const char *name; /* not NUL-terminated */
    uint64_t name_len;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the row length (contiguous); unused dims are 1 */
    uint32_t type;             /* GGUF (ggml) type id */
    uint64_t offset;           /* from the start of the data section */
    uint64_t bytes;            /* extent in the file */
    const uint8_t *data;       /* into the mapping */
} gguf_tensor;

typedef struct gguf_file {
    int fd;
    uint8_t *map; /* whole file, read-only */
    uint64_t size;
    uint32_t version;
    uint64_t n_kv;
    gguf_kv *kv; /* [n_kv] */
    uint64_t n_tensors;
    gguf_tensor *tensors; /* [n_tensors] */
    uint64_t alignment;
    uint64_t data_off;       /* start of the tensor data */
    uint32_t n_parts;        /* 1, or split.count for a split model (map and size are then the first part's) */
    struct gguf_file *parts; /* a split model's parts 2..n_parts ([n_parts - 1]; their kv belong to them) */
    uint64_t total_size;     /* the bytes of every part together */
} gguf_file;

/* Map and parse a file, and the other parts when it is the first part of a split model. On failure f is
 * left closed and err says what is wrong (for a split model: which part, and why). */
strata_status gguf_open(const char *path, gguf_file *f, errbuf *err);
/* Parse a file already in memory (no ownership taken; used by gguf_open). */
strata_status gguf_parse(gguf_file *f, errbuf *err);
void gguf_close(gguf_file *f);
/* The mapping of part i (0-based, < f->n_parts), for callers that page-lock what is mapped. */
void gguf_part_map(const gguf_file *f, uint32_t i, uint8_t **map, uint64_t *size);

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);
/* Read a scalar as integer (any integer type or bool); 0 when the type does not fit. */
int gguf_kv_get_int(const gguf_kv *kv, int64_t *out);
/* Read a scalar as a number (integers or floats); 0 when not numeric. */
int gguf_kv_get_float(const gguf_kv *kv, double *out);
/* Copy a string value into buf (truncated, NUL-terminated); 0 when not a string. */
int gguf_kv_get_str(const gguf_kv *kv, char *buf, uint64_t cap);
/* Name of a value type ("uint32"), for messages. */
const char *gguf_vtype_name(uint32_t t);

#endif
