/* loss.c - mean softmax cross-entropy (forward and backward, optionally with label smoothing),
 * mean sigmoid cross-entropy with logits (binary labels, CTR)
 * and top-k accuracy counts.
 * These check what the kernels assume (2-D shapes, matching dtypes, labels in range) and turn
 * violations into errors naming the row, then call the fused kernels. Labels are backend
 * memory: the range check reads them here only where the host can (host_memory); a caller on a
 * device checks its host copy with fl_labels_check before copying it there. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <math.h>

static int check_logits(const char *what, const fl_tensor *t) {
    char buf[96];
    if (t->ndim != 2)
        return fl_fail(FL_ESHAPE, "softmax_xent: %s %s must be (B, C)", what,
                       fl_shape_str(t->ndim, t->shape, buf, sizeof buf));
    if (t->dtype != FL_DTYPE_F32 && t->dtype != FL_DTYPE_F64)
        return fl_fail(FL_ESHAPE, "softmax_xent: %s is %s (f32 or f64 expected)", what,
                       fl_dtype_name(t->dtype));
    if (t->shape[0] > 0 && t->shape[1] < 1)
        return fl_fail(FL_ESHAPE, "softmax_xent: %s has no classes", what);
    return FL_OK;
}

static int check_pair(const char *a_name, const fl_tensor *a, const char *b_name,
                      const fl_tensor *b) {
    char sa[96], sb[96];
    FL_TRY(check_logits(a_name, a));
    if (a->dtype != b->dtype || !fl_tensor_same_shape(a, b))
        return fl_fail(FL_ESHAPE, "softmax_xent: %s %s %s does not match %s %s %s", b_name,
                       fl_dtype_name(b->dtype), fl_shape_str(b->ndim, b->shape, sb, sizeof sb),
                       a_name, fl_dtype_name(a->dtype),
                       fl_shape_str(a->ndim, a->shape, sa, sizeof sa));
    return FL_OK;
}

int fl_labels_check(const int32_t *labels, int64_t rows, int64_t classes) {
    FL_ASSERT(labels || rows == 0);
    for (int64_t r = 0; r < rows; r++)
        if (labels[r] < 0 || labels[r] >= classes)
            return fl_fail(FL_EINVAL, "softmax_xent: label %d of row %lld is outside [0, %lld)",
                           (int)labels[r], (long long)r, (long long)classes);
    return FL_OK;
}

int fl_softmax_xent_forward(const fl_backend *k, const fl_tensor *logits,
                            const int32_t *labels, fl_tensor *probs, double *loss) {
    if (!k)
        k = fl_backend_cpu();
    FL_TRY(check_pair("logits", logits, "probs", probs));
    int64_t b = logits->shape[0], c = logits->shape[1];
    if (k->host_memory)
        FL_TRY(fl_labels_check(labels, b, c));
    double total = k->softmax_xent_forward(logits->dtype, logits->data, labels, probs->data, b, c);
    *loss = b > 0 ? total / (double)b : 0.0;
    return FL_OK;
}

int fl_softmax_xent_backward(const fl_backend *k, const fl_tensor *probs,
                             const int32_t *labels, fl_tensor *dlogits) {
    if (!k)
        k = fl_backend_cpu();
    FL_TRY(check_pair("probs", probs, "dlogits", dlogits));
    int64_t b = probs->shape[0], c = probs->shape[1];
    if (k->host_memory)
        FL_TRY(fl_labels_check(labels, b, c));
    if (b > 0)
        k->softmax_xent_backward(probs->dtype, probs->data, labels, dlogits->data, b, c,
                                 1.0 / (double)b);
    return FL_OK;
}

/* Label smoothing: with q = (1 - e) onehot + e / C, -sum_j q_j log p_j = (1 - e) (lse - x_l)
 * + e (lse - mean_j x_j), lse = log sum_j exp x_j. The softmax kernel gives the first part's
 * sum; the backend's xent_smooth_term the second, from the logits (never from log p, which
 * underflows). */

static int check_epsilon(double e) {
    if (!(e >= 0 && e < 1))
        return fl_fail(FL_EINVAL, "softmax_xent: label smoothing epsilon %g is outside [0, 1)", e);
    return FL_OK;
}

int fl_softmax_xent_smooth_forward(const fl_backend *k, const fl_tensor *logits,
                                   const int32_t *labels, double epsilon, fl_tensor *probs,
                                   double *loss) {
    FL_TRY(check_epsilon(epsilon));
    double ce = 0;
    FL_TRY(fl_softmax_xent_forward(k, logits, labels, probs, &ce));
    int64_t b = logits->shape[0];
    if (!k)
        k = fl_backend_cpu();
    double extra = epsilon > 0 && b > 0
                       ? k->xent_smooth_term(logits->dtype, logits->data, b, logits->shape[1]) /
                             (double)b
                       : 0.0;
    *loss = (1 - epsilon) * ce + epsilon * extra;
    return FL_OK;
}

int fl_softmax_xent_smooth_backward(const fl_backend *k, const fl_tensor *probs,
                                    const int32_t *labels, double epsilon, fl_tensor *dlogits) {
    FL_TRY(check_epsilon(epsilon));
    FL_TRY(fl_softmax_xent_backward(k, probs, labels, dlogits));
    int64_t b = probs->shape[0], c = probs->shape[1];
    if (epsilon == 0 || b == 0)
        return FL_OK;
    /* (p - q) / B = (p - onehot) / B + e (onehot - 1 / C) / B */
    double on = epsilon / (double)b, all = epsilon / ((double)c * (double)b);
    if (!k)
        k = fl_backend_cpu();
    k->xent_smooth_backward(dlogits->dtype, labels, dlogits->data, b, c, on, all);
    return FL_OK;
}

#define STAMP_TOPK(T, S)                                                                   \
    static int64_t topk_##S(const T *x, const int32_t *labels, int64_t rows, int64_t cols,  \
                            int k) {                                                       \
        int64_t correct = 0;                                                               \
        for (int64_t r = 0; r < rows; r++) {                                               \
            const T *row = x + r * cols;                                                   \
            int32_t lab = labels[r];                                                       \
            if (lab < 0 || lab >= cols || isnan(row[lab]))                                 \
                continue;                                                                  \
            int64_t ahead = 0; /* classes that beat or tie the label's logit */            \
            for (int64_t j = 0; j < cols && ahead < k; j++)                                \
                if (j != lab && row[j] >= row[lab])                                        \
                    ahead++;                                                               \
            correct += ahead < k;                                                          \
        }                                                                                  \
        return correct;                                                                    \
    }
STAMP_TOPK(float, f32)
STAMP_TOPK(double, f64)

int64_t fl_topk_correct(const fl_tensor *logits, const int32_t *labels, int k) {
    FL_ASSERT(logits->ndim == 2);
    FL_ASSERT(fl_tensor_on_host(logits)); /* a device's logits: copy them to the host first */
    int64_t rows = logits->shape[0], cols = logits->shape[1];
    if (k < 1 || rows == 0)
        return 0;
    FL_ASSERT(labels);
    if (logits->dtype == FL_DTYPE_F32)
        return topk_f32(logits->data, labels, rows, cols, k);
    FL_ASSERT(logits->dtype == FL_DTYPE_F64);
    return topk_f64(logits->data, labels, rows, cols, k);
}

/* Sigmoid cross-entropy with logits: -y log s(z) - (1 - y) log(1 - s(z)) rewritten as
 * max(z, 0) - z y + log1p(exp(-|z|)), which neither overflows nor loses the small probabilities
 * (Paddle's sigmoid_cross_entropy_with_logits kernel has the same form). */

static int check_binary(const char *what, const fl_tensor *t, const fl_tensor *like) {
    char buf[96];
    bool shape = t->ndim == 1 || (t->ndim == 2 && t->shape[1] == 1);
    if (!shape || (t->dtype != FL_DTYPE_F32 && t->dtype != FL_DTYPE_F64))
        return fl_fail(FL_ESHAPE, "sigmoid_xent: %s %s %s must be f32 or f64 (B) or (B, 1)",
                       what, fl_dtype_name(t->dtype), fl_shape_str(t->ndim, t->shape, buf,
                                                                   sizeof buf));
    if (like && (t->dtype != like->dtype || t->shape[0] != like->shape[0]))
        return fl_fail(FL_ESHAPE, "sigmoid_xent: %s %s of %lld rows does not match the logits' "
                       "%s of %lld", what, fl_dtype_name(t->dtype), (long long)t->shape[0],
                       fl_dtype_name(like->dtype), (long long)like->shape[0]);
    FL_ASSERT(fl_tensor_on_host(t)); /* a host function: copy a device's logits back first */
    return FL_OK;
}

static int check_binary_labels(const int32_t *labels, int64_t b) {
    FL_ASSERT(labels || b == 0);
    for (int64_t r = 0; r < b; r++)
        if (labels[r] != 0 && labels[r] != 1)
            return fl_fail(FL_EINVAL, "sigmoid_xent: label %d of row %lld is not 0 or 1",
                           (int)labels[r], (long long)r);
    return FL_OK;
}

static double logit_at(const fl_tensor *t, int64_t i) {
    return t->dtype == FL_DTYPE_F32 ? (double)((const float *)t->data)[i]
                                    : ((const double *)t->data)[i];
}

static void store_at(fl_tensor *t, int64_t i, double v) {
    if (t->dtype == FL_DTYPE_F32)
        ((float *)t->data)[i] = (float)v;
    else
        ((double *)t->data)[i] = v;
}

static double sigmoid(double z) {
    double e = exp(-fabs(z)); /* in (0, 1]: never overflows */
    return z >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

int fl_sigmoid_xent_forward(const fl_tensor *logits, const int32_t *labels, fl_tensor *probs,
                            double *loss) {
    FL_ASSERT(logits && loss);
    FL_TRY(check_binary("logits", logits, NULL));
    if (probs)
        FL_TRY(check_binary("probs", probs, logits));
    int64_t b = logits->shape[0];
    FL_TRY(check_binary_labels(labels, b));
    double total = 0;
    for (int64_t i = 0; i < b; i++) {
        double z = logit_at(logits, i);
        total += fmax(z, 0.0) - z * (double)labels[i] + log1p(exp(-fabs(z)));
        if (probs)
            store_at(probs, i, sigmoid(z));
    }
    *loss = b > 0 ? total / (double)b : 0.0;
    return FL_OK;
}

int fl_sigmoid_xent_backward(const fl_tensor *logits, const int32_t *labels,
                             fl_tensor *dlogits) {
    FL_ASSERT(logits && dlogits);
    FL_TRY(check_binary("logits", logits, NULL));
    FL_TRY(check_binary("dlogits", dlogits, logits));
    int64_t b = logits->shape[0];
    FL_TRY(check_binary_labels(labels, b));
    double inv = b > 0 ? 1.0 / (double)b : 0.0;
    for (int64_t i = 0; i < b; i++)
        store_at(dlogits, i, (sigmoid(logit_at(logits, i)) - (double)labels[i]) * inv);
    return FL_OK;
}
