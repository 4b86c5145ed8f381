/* tensor.c - dtype table, tensor allocation and views, aligned allocation. */
#include "fleet/tensor.h"

#include "fleet/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
    bool is_float;
} dtype_info[FL_DTYPE_COUNT] = {
    [FL_DTYPE_F32] = {"f32", 4, true},   [FL_DTYPE_F64] = {"f64", 8, true},
    [FL_DTYPE_F16] = {"f16", 2, true},   [FL_DTYPE_BF16] = {"bf16", 2, true},
    [FL_DTYPE_I32] = {"i32", 4, false},  [FL_DTYPE_I64] = {"i64", 8, false},
    [FL_DTYPE_U8] = {"u8", 1, false},
};

size_t fl_dtype_size(fl_dtype t) {
    FL_ASSERT((unsigned)t < FL_DTYPE_COUNT);
    return dtype_info[t].size;
}

const char *fl_dtype_name(fl_dtype t) {
    return (unsigned)t < FL_DTYPE_COUNT ? dtype_info[t].name : "?";
}

bool fl_dtype_is_float(fl_dtype t) {
    FL_ASSERT((unsigned)t < FL_DTYPE_COUNT);
    return dtype_info[t].is_float;
}

int fl_dtype_parse(const char *name, fl_dtype *out) {
    static const struct {
        const char *alias;
        fl_dtype t;
    } aliases[] = {
        {"float32", FL_DTYPE_F32}, {"float", FL_DTYPE_F32},  {"float64", FL_DTYPE_F64},
        {"double", FL_DTYPE_F64},  {"float16", FL_DTYPE_F16}, {"half", FL_DTYPE_F16},
        {"bfloat16", FL_DTYPE_BF16}, {"int32", FL_DTYPE_I32}, {"int64", FL_DTYPE_I64},
        {"uint8", FL_DTYPE_U8},
    };
    for (int t = 0; t < FL_DTYPE_COUNT; t++) {
        if (strcmp(name, dtype_info[t].name) == 0) {
            *out = (fl_dtype)t;
            return FL_OK;
        }
    }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (strcmp(name, aliases[i].alias) == 0) {
            *out = aliases[i].t;
            return FL_OK;
        }
    }
    return fl_fail(FL_EINVAL, "unknown dtype '%s' (expected f32, f64, f16, bf16, i32, i64 or u8)",
                   name);
}

void *fl_alloc_aligned(size_t nbytes) {
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    return aligned_alloc(64, rounded ? rounded : 64);
}

void fl_free_aligned(void *p) { free(p); }

int64_t fl_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

size_t fl_tensor_nbytes(const fl_tensor *x) {
    return (size_t)x->numel * fl_dtype_size(x->dtype);
}

bool fl_tensor_same_shape(const fl_tensor *a, const fl_tensor *b) {
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

char *fl_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t len = 0;
    len += (size_t)snprintf(buf + len, cap - len, "(");
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (len < cap)
        snprintf(buf + len, cap - len, ")");
    return buf;
}

void fl_tensor_view(fl_tensor *x, fl_dtype t, int ndim, const int64_t *shape, void *data) {
    FL_ASSERT(ndim >= 0 && ndim <= FL_MAX_DIMS);
    memset(x, 0, sizeof *x);
    x->dtype = t;
    x->device.type = FL_DEVICE_CPU;
    x->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        x->shape[i] = shape[i];
    x->numel = fl_shape_numel(ndim, shape);
    x->data = data;
    x->owns_data = false;
}

static int check_shape(fl_dtype t, int ndim, const int64_t *shape) {
    if ((unsigned)t >= FL_DTYPE_COUNT)
        return fl_fail(FL_EINVAL, "tensor: bad dtype %d", (int)t);
    if (ndim < 0 || ndim > FL_MAX_DIMS)
        return fl_fail(FL_EINVAL, "tensor: %d dimensions (at most %d)", ndim, FL_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return fl_fail(FL_EINVAL, "tensor: dimension %d is negative (%lld)", i,
                           (long long)shape[i]);
    return FL_OK;
}

fl_tensor *fl_tensor_create(fl_dtype t, int ndim, const int64_t *shape) {
    if (check_shape(t, ndim, shape) < 0)
        return NULL;
    fl_tensor *x = malloc(sizeof *x);
    if (!x) {
        fl_fail(FL_ENOMEM, "tensor: out of memory");
        return NULL;
    }
    fl_tensor_view(x, t, ndim, shape, NULL);
    size_t nbytes = fl_tensor_nbytes(x);
    x->data = fl_alloc_aligned(nbytes);
    if (!x->data) {
        free(x);
        fl_fail(FL_ENOMEM, "tensor: cannot allocate %zu bytes", nbytes);
        return NULL;
    }
    memset(x->data, 0, nbytes);
    x->owns_data = true;
    return x;
}

fl_tensor *fl_tensor_create_view(fl_dtype t, int ndim, const int64_t *shape, void *data) {
    if (check_shape(t, ndim, shape) < 0)
        return NULL;
    fl_tensor *x = malloc(sizeof *x);
    if (!x) {
        fl_fail(FL_ENOMEM, "tensor: out of memory");
        return NULL;
    }
    fl_tensor_view(x, t, ndim, shape, data);
    return x;
}

void fl_tensor_free(fl_tensor *x) {
    if (!x)
        return;
    if (x->owns_data)
        fl_free_aligned(x->data);
    free(x);
}
