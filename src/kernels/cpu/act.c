/* act.c - activation names (fl_act) and fl_argmax: small helpers shared by every kernel table and by
 * the layers, configs and metrics that name activations or pick a class. */
#include "fleet/backend.h"
#include "fleet/status.h"

#include <string.h>

static const char *const act_names[] = {
    [FL_ACT_NONE] = "none",
    [FL_ACT_RELU] = "relu",
    [FL_ACT_TANH] = "tanh",
    [FL_ACT_SIGMOID] = "sigmoid",
    [FL_ACT_HARDSWISH] = "hardswish",
    [FL_ACT_HARDSIGMOID] = "hardsigmoid",
};
#define NACTS ((int)(sizeof act_names / sizeof act_names[0]))

int fl_act_parse(const char *name, fl_act *out) {
    for (int a = 0; a < NACTS; a++) {
        if (name && strcmp(name, act_names[a]) == 0) {
            *out = (fl_act)a;
            return FL_OK;
        }
    }
    return fl_fail(FL_EINVAL, "unknown activation '%s' (expected relu, tanh, sigmoid, hardswish, "
                   "hardsigmoid or none)",
                   name ? name : "(null)");
}

const char *fl_act_name(fl_act a) {
    return (unsigned)a < (unsigned)NACTS ? act_names[a] : "?";
}

#define STAMP_ARGMAX(T, S)                                 \
    static int64_t argmax_##S(const T *x, int64_t n) {     \
        int64_t best = 0;                                  \
        for (int64_t i = 1; i < n; i++)                    \
            if (x[i] > x[best])                            \
                best = i;                                  \
        return best;                                       \
    }
STAMP_ARGMAX(float, f32)
STAMP_ARGMAX(double, f64)

int64_t fl_argmax(fl_dtype t, const void *x, int64_t n) {
    FL_ASSERT(n > 0);
    if (t == FL_DTYPE_F32)
        return argmax_f32(x, n);
    FL_ASSERT(t == FL_DTYPE_F64);
    return argmax_f64(x, n);
}
