/*
 * gguf.c — GGUF parsing with every read checked against the file size (see gguf.h).
 *
 * The parser walks the header with a cursor (pos) and a limit (size). Every read goes through
 * rd_need(), which fails when fewer than n bytes remain; counts read from the file are checked
 * against the bytes left before anything is allocated for them, so a huge count in a small file is
 * a format error rather than a huge allocation.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "quant.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ARRAY_DEPTH 8 /* arrays of arrays nest at most this deep */

typedef struct cursor {
    const uint8_t *base;
    uint64_t pos;
    uint64_t size;
    errbuf *err;
} cursor;

static int rd_need(cursor *c, uint64_t n) { return n <= c->size - c->pos; }

static strata_status rd_u32(cursor *c, uint32_t *v, const char *what) {
    if (!rd_need(c, 4))
        return err_set(c->err, STRATA_ERR_FORMAT,
                       "GGUF file is truncated: %s at byte %llu needs 4 bytes, the file has %llu", what,
                       (unsigned long long)c->pos, (unsigned long long)c->size);
    memcpy(v, c->base + c->pos, 4);
    c->pos += 4;
    return STRATA_OK;
}

static strata_status rd_u64(cursor *c, uint64_t *v, const char *what) {
    if (!rd_need(c, 8))
        return err_set(c->err, STRATA_ERR_FORMAT,
                       "GGUF file is truncated: %s at byte %llu needs 8 bytes, the file has %llu", what,
                       (unsigned long long)c->pos, (unsigned long long)c->size);
    memcpy(v, c->base + c->pos, 8);
    c->pos += 8;
    return STRATA_OK;
}

/* A string is a u64 length and that many bytes; the length is checked against the bytes left. */
static strata_status rd_str(cursor *c, const char **s, uint64_t *len, const char *what) {
    uint64_t n = 0;
    STRATA_TRY(rd_u64(c, &n, what));
    if (!rd_need(c, n))
        return err_set(c->err, STRATA_ERR_FORMAT,
                       "GGUF file is malformed: %s at byte %llu claims %llu bytes but only %llu remain "
                       "(the file is truncated or corrupted)",
                       what, (unsigned long long)(c->pos - 8), (unsigned long long)n,
                       (unsigned long long)(c->size - c->pos));
    *s = (const char *)(c->base + c->pos);
    *len = n;
    c->pos += n;
    return STRATA_OK;
}

static const uint8_t k_scalar_size[GGUF_VT_COUNT] = {
    [GGUF_VT_UINT8] = 1,  [GGUF_VT_INT8] = 1,  [GGUF_VT_UINT16] = 2,  [GGUF_VT_INT16] = 2,
    [GGUF_VT_UINT32] = 4, [GGUF_VT_INT32] = 4, [GGUF_VT_FLOAT32] = 4, [GGUF_VT_BOOL] = 1,
    [GGUF_VT_UINT64] = 8, [GGUF_VT_INT64] = 8, [GGUF_VT_FLOAT64] = 8,
};

const char *gguf_vtype_name(uint32_t t) {
    static const char *names[GGUF_VT_COUNT] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                               "bool",  "string", "array",  "uint64", "int64",  "float64"};
    return t < GGUF_VT_COUNT ? names[t] : "unknown";
}

/* Skip over one value of type t (recursing into arrays), checking every extent. */
static strata_status skip_value(cursor *c, uint32_t t, int depth, const char *key) {
    if (t >= GGUF_VT_COUNT)
        return err_set(c->err, STRATA_ERR_FORMAT, "GGUF metadata '%s' has value type %u, which does not exist (0..12)",
                       key, t);
    if (t == GGUF_VT_STRING) {
        const char *s = NULL;
        uint64_t n = 0;
        return rd_str(c, &s, &n, "a string value");
    }
    if (t == GGUF_VT_ARRAY) {
        if (depth >= GGUF_MAX_ARRAY_DEPTH)
            return err_set(c->err, STRATA_ERR_FORMAT, "GGUF metadata '%s' nests arrays more than %d deep", key,
                           GGUF_MAX_ARRAY_DEPTH);
        uint32_t et = 0;
        uint64_t n = 0;
        STRATA_TRY(rd_u32(c, &et, "an array's element type"));
        STRATA_TRY(rd_u64(c, &n, "an array's length"));
        if (et >= GGUF_VT_COUNT)
            return err_set(c->err, STRATA_ERR_FORMAT, "GGUF metadata '%s' is an array of type %u, which does not exist",
                           key, et);
        if (et != GGUF_VT_STRING && et != GGUF_VT_ARRAY) {
            uint64_t es = k_scalar_size[et];
            if (n > (c->size - c->pos) / es)
                return err_set(c->err, STRATA_ERR_FORMAT,
                               "GGUF metadata '%s' claims %llu elements of %s, more than the %llu bytes "
                               "left in the file",
                               key, (unsigned long long)n, gguf_vtype_name(et), (unsigned long long)(c->size - c->pos));
            c->pos += n * es;
            return STRATA_OK;
        }
        /* Strings and arrays take at least 8 bytes each: a count larger than that is corrupt. */
        if (n > (c->size - c->pos) / 8)
            return err_set(c->err, STRATA_ERR_FORMAT,
                           "GGUF metadata '%s' claims %llu elements, more than the file can hold", key,
                           (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) STRATA_TRY(skip_value(c, et, depth + 1, key));
        return STRATA_OK;
    }
    if (!rd_need(c, k_scalar_size[t]))
        return err_set(c->err, STRATA_ERR_FORMAT, "GGUF file is truncated inside the value of '%s'", key);
    c->pos += k_scalar_size[t];
    return STRATA_OK;
}

static int name_eq(const char *a, uint64_t alen, const char *b) {
    size_t blen = strlen(b);
    return alen == blen && memcmp(a, b, blen) == 0;
}

/* A printable copy of a name from the file, for messages. */
static const char *printable(const char *s, uint64_t n, char *buf, size_t cap) {
    size_t k = 0;
    for (uint64_t i = 0; i < n && k + 1 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        buf[k++] = (ch >= 32 && ch < 127) ? (char)ch : '?';
    }
    buf[k] = '\0';
    return buf;
}

strata_status gguf_parse(gguf_file *f, errbuf *err) {
    cursor c = {f->map, 0, f->size, err};
    uint32_t magic;
    if (f->size < 24)
        return err_set(err, STRATA_ERR_FORMAT, "not a GGUF file: %llu bytes is shorter than the 24-byte GGUF header",
                       (unsigned long long)f->size);
    STRATA_TRY(rd_u32(&c, &magic, "the magic"));
    if (magic != GGUF_MAGIC)
        return err_set(err, STRATA_ERR_FORMAT,
                       "not a GGUF file: it starts with bytes %02x %02x %02x %02x instead of \"GGUF\"", f->map[0],
                       f->map[1], f->map[2], f->map[3]);
    STRATA_TRY(rd_u32(&c, &f->version, "the version"));
    if (f->version != 2 && f->version != 3) {
        if (f->version == 1)
            return err_set(err, STRATA_ERR_UNSUPPORTED,
                           "GGUF version 1 is not supported; convert the model again with a current "
                           "gguf-py or llama.cpp (versions 2 and 3 are read)");
        if ((f->version & 0xffffu) == 0)
            return err_set(err, STRATA_ERR_UNSUPPORTED,
                           "this GGUF file is big-endian (version field %u); strata reads little-endian "
                           "files only",
                           f->version);
        return err_set(err, STRATA_ERR_FORMAT, "GGUF version %u is not one strata knows (2 and 3 are read)",
                       f->version);
    }
    STRATA_TRY(rd_u64(&c, &f->n_tensors, "the tensor count"));
    STRATA_TRY(rd_u64(&c, &f->n_kv, "the metadata count"));
    /* Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes, each tensor info at
     * least 8 + 4 + 4 + 8: reject counts that cannot fit before allocating for them. */
    uint64_t left = f->size - c.pos;
    if (f->n_kv > left / 13)
        return err_set(err, STRATA_ERR_FORMAT,
                       "GGUF header claims %llu metadata entries, more than a %llu-byte file can hold",
                       (unsigned long long)f->n_kv, (unsigned long long)f->size);
    if (f->n_tensors > left / 24)
        return err_set(err, STRATA_ERR_FORMAT, "GGUF header claims %llu tensors, more than a %llu-byte file can hold",
                       (unsigned long long)f->n_tensors, (unsigned long long)f->size);

    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors)
        return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory reading the GGUF header");

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        STRATA_TRY(rd_str(&c, &kv->key, &kv->key_len, "a metadata key"));
        STRATA_TRY(rd_u32(&c, &kv->type, "a metadata value type"));
        char kb[96];
        printable(kv->key, kv->key_len, kb, sizeof kb);
        if (kv->type == GGUF_VT_ARRAY) {
            /* Peek at the element type and count, then let skip_value check the extent. */
            uint64_t at = c.pos;
            STRATA_TRY(rd_u32(&c, &kv->arr_type, "an array's element type"));
            STRATA_TRY(rd_u64(&c, &kv->arr_n, "an array's length"));
            kv->val = f->map + c.pos;
            c.pos = at;
        } else {
            kv->val = f->map + c.pos;
        }
        STRATA_TRY(skip_value(&c, kv->type, 0, kb));
        if (name_eq(kv->key, kv->key_len, "general.alignment")) {
            int64_t a;
            if (!gguf_kv_get_int(kv, &a) || kv->type == GGUF_VT_BOOL)
                return err_set(err, STRATA_ERR_FORMAT, "general.alignment is a %s, not an integer",
                               gguf_vtype_name(kv->type));
            if (a <= 0 || (a & (a - 1)) != 0 || a > (1 << 20))
                return err_set(err, STRATA_ERR_FORMAT,
                               "general.alignment is %lld; it must be a power of two up to 1 MiB", (long long)a);
            f->alignment = (uint64_t)a;
        }
    }

    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        STRATA_TRY(rd_str(&c, &t->name, &t->name_len, "a tensor name"));
        char nb[96];
        printable(t->name, t->name_len, nb, sizeof nb);
        STRATA_TRY(rd_u32(&c, &t->n_dims, "a tensor's dimension count"));
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
            return err_set(err, STRATA_ERR_FORMAT, "tensor '%s' has %u dimensions (1..%d are valid)", nb, t->n_dims,
                           GGUF_MAX_DIMS);
        uint64_t total = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t v = 0;
            STRATA_TRY(rd_u64(&c, &v, "a tensor dimension"));
            /* Each dimension and the product stay below 2^62 so that byte counts cannot overflow. */
            if (v == 0 || v > (1ull << 40) || total > (1ull << 62) / v)
                return err_set(err, STRATA_ERR_FORMAT,
                               "tensor '%s' has dimension %u = %llu, which is zero or too large", nb, d,
                               (unsigned long long)v);
            t->ne[d] = (int64_t)v;
            total *= v;
        }
        STRATA_TRY(rd_u32(&c, &t->type, "a tensor type"));
        STRATA_TRY(rd_u64(&c, &t->offset, "a tensor offset"));
        int64_t rb = quant_row_bytes((int32_t)t->type, t->ne[0]);
        if (rb < 0) {
            if (quant_type_name((int32_t)t->type) == NULL)
                return err_set(err, STRATA_ERR_FORMAT, "tensor '%s' has type id %u, which is not a GGUF type", nb,
                               t->type);
            return err_set(err, STRATA_ERR_FORMAT,
                           "tensor '%s' has rows of %lld values, not a whole number of %s blocks", nb,
                           (long long)t->ne[0], quant_type_name((int32_t)t->type));
        }
        uint64_t rows = total / (uint64_t)t->ne[0];
        if ((uint64_t)rb != 0 && rows > (1ull << 62) / (uint64_t)rb)
            return err_set(err, STRATA_ERR_FORMAT, "tensor '%s' is too large", nb);
        t->bytes = (uint64_t)rb * rows;
        for (uint64_t j = 0; j < i; j++)
            if (f->tensors[j].name_len == t->name_len && memcmp(f->tensors[j].name, t->name, t->name_len) == 0)
                return err_set(err, STRATA_ERR_FORMAT, "tensor '%s' appears twice in the file", nb);
    }

    f->data_off = STRATA_ALIGN_UP(c.pos, f->alignment);
    if (f->data_off > f->size && f->n_tensors > 0)
        return err_set(err, STRATA_ERR_FORMAT,
                       "GGUF file is truncated: the tensor data would start at byte %llu, after the "
                       "end of the %llu-byte file",
                       (unsigned long long)f->data_off, (unsigned long long)f->size);
    uint64_t data_size = f->data_off <= f->size ? f->size - f->data_off : 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        char nb[96];
        printable(t->name, t->name_len, nb, sizeof nb);
        if (t->offset % f->alignment != 0)
            return err_set(err, STRATA_ERR_FORMAT,
                           "tensor '%s' starts at data offset %llu, which is not a multiple of the "
                           "alignment %llu",
                           nb, (unsigned long long)t->offset, (unsigned long long)f->alignment);
        if (t->offset > data_size || t->bytes > data_size - t->offset)
            return err_set(err, STRATA_ERR_FORMAT,
                           "tensor '%s' spans data bytes %llu..%llu but the file holds only %llu bytes of "
                           "tensor data (the file is truncated or the offset is corrupt)",
                           nb, (unsigned long long)t->offset, (unsigned long long)(t->offset + t->bytes),
                           (unsigned long long)data_size);
        t->data = f->map + f->data_off + t->offset;
    }
    return STRATA_OK;
}

/* Map and parse one file. */
static strata_status open_one(const char *path, gguf_file *f, errbuf *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (!path) return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "no model path given");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, STRATA_ERR_IO, "cannot open model file '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, STRATA_ERR_IO, "model path '%s' is not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return err_set(err, STRATA_ERR_FORMAT,
                       "'%s' is not a GGUF file: %lld bytes is shorter than the 24-byte GGUF header", path,
                       (long long)st.st_size);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        return err_set(err, STRATA_ERR_IO, "cannot map model file '%s': %s", path, strerror(e));
    }
    f->fd = fd;
    f->map = m;
    f->size = (uint64_t)st.st_size;
    f->n_parts = 1;
    f->total_size = f->size;
    strata_status s = gguf_parse(f, err);
    if (s != STRATA_OK) {
        err_prefix(err, "%s: ", path);
        gguf_close(f);
    }
    return s;
}

/* ---- split models ------------------------------------------------------------------------------ */

#define GGUF_SPLIT_MAX 99999 /* part numbers have five digits in the names */

enum { SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS };

/* split.no, split.count and split.tensors.count of a parsed file; -1 for a key it does not have. */
static strata_status split_keys(const gguf_file *f, const char *path, int64_t v[3], errbuf *err) {
    static const char *keys[3] = {"split.no", "split.count", "split.tensors.count"};
    for (int i = 0; i < 3; i++) {
        const gguf_kv *kv = gguf_find_kv(f, keys[i]);
        v[i] = -1;
        if (kv && (kv->type == GGUF_VT_BOOL || !gguf_kv_get_int(kv, &v[i]) || v[i] < 0))
            return err_set(err, STRATA_ERR_FORMAT, "%s: %s is a %s, not a count", path, keys[i],
                           gguf_vtype_name(kv->type));
    }
    return STRATA_OK;
}

/* The name ending of part k (1-based) of n: "-0000k-of-0000n.gguf", as llama.cpp's gguf-split and
 * gguf-py's writer name the parts. */
static void part_suffix(char *buf, size_t cap, int64_t k, int64_t n) {
    char tmp[48]; /* callers check n <= GGUF_SPLIT_MAX: five digits each */
    int len = snprintf(tmp, sizeof tmp, "-%05d-of-%05d.gguf", (int)(k % 100000), (int)(n % 100000));
    size_t m = len < 0 ? 0 : (size_t)len < cap ? (size_t)len : cap - 1;
    memcpy(buf, tmp, m);
    buf[m] = '\0';
}

static int by_name(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    uint64_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* f is the parsed first part of an n-part model (sp: its split keys): open parts 2..n next to it, check
 * that each says it is that part of this model, and merge every part's tensors into f->tensors. */
static strata_status open_parts(const char *path, gguf_file *f, const int64_t sp[3], errbuf *err) {
    const int64_t n = sp[SPLIT_COUNT];
    char want[64], got[64]; /* room for any two 64-bit part numbers: no truncation for the Debug build to see */
    if (n > GGUF_SPLIT_MAX)
        return err_set(err, STRATA_ERR_FORMAT, "%s: split.count is %lld; a split model has at most %d parts", path,
                       (long long)n, GGUF_SPLIT_MAX);
    if (sp[SPLIT_NO] >= n)
        return err_set(err, STRATA_ERR_FORMAT, "%s: split.no is %lld but split.count is %lld (parts count from 0)",
                       path, (long long)sp[SPLIT_NO], (long long)n);
    const size_t plen = strlen(path);
    part_suffix(got, sizeof got, sp[SPLIT_NO] + 1, n);
    const size_t slen = strlen(got);
    const int named = plen > slen && strcmp(path + plen - slen, got) == 0;
    if (sp[SPLIT_NO] != 0) {
        part_suffix(want, sizeof want, 1, n);
        if (named)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                           "%s is part %lld of %lld of a split model: open its first part, %.*s%s, which "
                           "finds the others",
                           path, (long long)sp[SPLIT_NO] + 1, (long long)n, (int)(plen - slen), path, want);
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                       "%s is part %lld of %lld of a split model: open its first part (the file whose name ends "
                       "in %s), which finds the others",
                       path, (long long)sp[SPLIT_NO] + 1, (long long)n, want);
    }
    if (sp[SPLIT_TENSORS] < 0)
        return err_set(err, STRATA_ERR_FORMAT, "%s: split.count is %lld but split.tensors.count is missing", path,
                       (long long)n);
    if (!named)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                       "%s is the first of %lld parts of a split model, but its name does not end in %s, so the "
                       "other parts cannot be found: keep the names the parts were written with "
                       "(NAME-00001-of-%05lld.gguf, NAME-00002-of-%05lld.gguf, ...)",
                       path, (long long)n, got, (long long)n, (long long)n);
    f->parts = calloc((size_t)(n - 1), sizeof *f->parts);
    char *pp = malloc(plen + 1);
    if (!f->parts || !pp) {
        free(pp);
        return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory opening a split model");
    }
    f->n_parts = (uint32_t)n;
    for (int64_t i = 0; i < n - 1; i++) f->parts[i].fd = -1; /* gguf_close of f closes what was opened */
    memcpy(pp, path, plen - slen);
    uint64_t n_tensors = f->n_tensors;
    strata_status s = STRATA_OK;
    for (int64_t k = 2; k <= n && s == STRATA_OK; k++) {
        gguf_file *q = &f->parts[k - 2];
        part_suffix(pp + plen - slen, slen + 1, k, n);
        s = open_one(pp, q, err);
        if (s != STRATA_OK) {
            err_prefix(err, "part %lld of %lld of the split model %s: ", (long long)k, (long long)n, path);
            break;
        }
        int64_t qs[3];
        s = split_keys(q, pp, qs, err);
        if (s != STRATA_OK) break;
        if (qs[SPLIT_COUNT] < 0)
            s = err_set(err, STRATA_ERR_FORMAT,
                        "%s is not a part of a split model (it has no split.count), yet %s names it as part %lld "
                        "of %lld: put the model's own part there",
                        pp, path, (long long)k, (long long)n);
        else if (qs[SPLIT_COUNT] != n)
            s = err_set(err, STRATA_ERR_FORMAT,
                        "%s says its model has %lld parts (split.count) but the first part, %s, says %lld: the "
                        "parts come from different splits; put the %lld parts of one split side by side",
                        pp, (long long)qs[SPLIT_COUNT], path, (long long)n, (long long)n);
        else if (qs[SPLIT_NO] != k - 1)
            s = err_set(err, STRATA_ERR_FORMAT,
                        "%s says it is part %lld (split.no = %lld) but its name makes it part %lld of %lld: a part "
                        "was renamed or belongs to another split",
                        pp, (long long)qs[SPLIT_NO] + 1, (long long)qs[SPLIT_NO], (long long)k, (long long)n);
        else if (qs[SPLIT_TENSORS] != sp[SPLIT_TENSORS])
            s = err_set(err, STRATA_ERR_FORMAT,
                        "%s belongs to another model: it counts %lld tensors over all parts (split.tensors.count), "
                        "the first part, %s, counts %lld",
                        pp, (long long)qs[SPLIT_TENSORS], path, (long long)sp[SPLIT_TENSORS]);
        n_tensors += q->n_tensors;
        f->total_size += q->size;
    }
    free(pp);
    if (s != STRATA_OK) return s;
    if (n_tensors != (uint64_t)sp[SPLIT_TENSORS])
        return err_set(err, STRATA_ERR_FORMAT,
                       "split model %s: its %lld parts hold %llu tensors but split.tensors.count says %lld: a part "
                       "belongs to another split of the model",
                       path, (long long)n, (unsigned long long)n_tensors, (long long)sp[SPLIT_TENSORS]);

    /* one tensor list over every part, in part order; a name in two parts is a mixed-up split */
    gguf_tensor *all = calloc(n_tensors ? n_tensors : 1, sizeof *all);
    const gguf_tensor **sorted = calloc(n_tensors ? n_tensors : 1, sizeof *sorted);
    if (!all || !sorted) {
        free(all);
        free(sorted);
        return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory opening a split model");
    }
    uint64_t j = 0;
    for (uint32_t p = 0; p < f->n_parts; p++) {
        const gguf_file *q = p == 0 ? f : &f->parts[p - 1];
        for (uint64_t i = 0; i < q->n_tensors; i++) all[j++] = q->tensors[i];
    }
    for (uint64_t i = 0; i < n_tensors; i++) sorted[i] = &all[i];
    qsort(sorted, n_tensors, sizeof *sorted, by_name);
    for (uint64_t i = 1; i < n_tensors; i++)
        if (by_name(&sorted[i - 1], &sorted[i]) == 0) {
            char nb[96];
            printable(sorted[i]->name, sorted[i]->name_len, nb, sizeof nb);
            free(all);
            free(sorted);
            return err_set(err, STRATA_ERR_FORMAT,
                           "split model %s: tensor '%s' is in two of its parts; a part belongs to another split", path,
                           nb);
        }
    free(sorted);
    free(f->tensors);
    f->tensors = all;
    f->n_tensors = n_tensors;
    return STRATA_OK;
}

strata_status gguf_open(const char *path, gguf_file *f, errbuf *err) {
    STRATA_TRY(open_one(path, f, err));
    int64_t sp[3];
    strata_status s = split_keys(f, path, sp, err);
    /* split.count 1 (a model "split" into one file) reads as a plain file */
    if (s == STRATA_OK && (sp[SPLIT_COUNT] > 1 || sp[SPLIT_NO] > 0)) s = open_parts(path, f, sp, err);
    if (s != STRATA_OK) gguf_close(f);
    return s;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->parts)
        for (uint32_t i = 0; i + 1 < f->n_parts; i++) gguf_close(&f->parts[i]);
    free(f->parts);
    free(f->kv);
    free(f->tensors);
    if (f->map && f->fd >= 0) munmap(f->map, (size_t)f->size);
    if (f->fd >= 0) close(f->fd);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

void gguf_part_map(const gguf_file *f, uint32_t i, uint8_t **map, uint64_t *size) {
    const gguf_file *q = i == 0 ? f : &f->parts[i - 1];
    *map = q->map;
    *size = q->size;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (name_eq(f->kv[i].key, f->kv[i].key_len, key)) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (name_eq(f->tensors[i].name, f->tensors[i].name_len, name)) return &f->tensors[i];
    return NULL;
}

int gguf_kv_get_int(const gguf_kv *kv, int64_t *out) {
    if (!kv) return 0;
    const uint8_t *p = kv->val;
    switch (kv->type) {
    case GGUF_VT_UINT8: *out = p[0]; return 1;
    case GGUF_VT_INT8: *out = (int8_t)p[0]; return 1;
    case GGUF_VT_BOOL: *out = p[0] != 0; return 1;
    case GGUF_VT_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 1;
    }
    case GGUF_VT_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 1;
    }
    case GGUF_VT_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    case GGUF_VT_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    case GGUF_VT_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)v;
        return 1;
    }
    case GGUF_VT_INT64: {
        int64_t v;
        memcpy(&v, p, 8);
        *out = v;
        return 1;
    }
    default: return 0;
    }
}

int gguf_kv_get_float(const gguf_kv *kv, double *out) {
    if (!kv) return 0;
    if (kv->type == GGUF_VT_FLOAT32) {
        float v;
        memcpy(&v, kv->val, 4);
        *out = v;
        return 1;
    }
    if (kv->type == GGUF_VT_FLOAT64) {
        memcpy(out, kv->val, 8);
        return 1;
    }
    int64_t i;
    if (kv->type != GGUF_VT_BOOL && gguf_kv_get_int(kv, &i)) {
        *out = (double)i;
        return 1;
    }
    return 0;
}

int gguf_kv_get_str(const gguf_kv *kv, char *buf, uint64_t cap) {
    if (!kv || kv->type != GGUF_VT_STRING || cap == 0) return 0;
    uint64_t n;
    memcpy(&n, kv->val, 8);
    uint64_t k = n < cap - 1 ? n : cap - 1;
    memcpy(buf, kv->val + 8, k);
    buf[k] = '\0';
    return 1;
}
