/* ctr_model.c - the CTR models of fleet/sparse.h: wide&deep and DeepFM over two sparse tables
 * ("embedding" of DIM, "wide" of 1) and one fl_net for everything dense. The embeddings are
 * pooled straight into the first columns of the network's input, the dense features copied
 * after them; the network's input gradient (fl_net_set_input_grad) is what the embedding's
 * backward reads. The sum of the wide rows and DeepFM's second-order term have no parameters
 * and are added to the network's output here. */
#include "fleet/sparse.h"

#include "fleet/status.h"
#include "nn_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fl_ctr_model {
    fl_ctr_model_config cfg;
    fl_net             *net;
    int64_t             width;   /* W = S * DIM + NDENSE: the network's input */
    fl_sparse_lookup    lk;
    fl_sparse_rows      rows[FL_CTR_NTABLES];
    const fl_ctr_batch *batch;   /* prepared, borrowed */
    bool                prepared, have_forward;
    size_t              esize;   /* of the model's dtype */
    fl_tensor           x;       /* (B, W) the network's input */
    void               *wide;    /* (max_batch, S) the pooled wide rows, then their gradient */
    void               *demb;    /* DeepFM: (max_batch, S * DIM) the embeddings' gradient */
    fl_tensor           logits;  /* (B) */
    fl_tensor           dnet;    /* (B, 1) the network output's gradient */
};

fl_ctr_model_config fl_ctr_model_config_default(fl_ctr_model_type type) {
    fl_ctr_model_config c = {
        .type = type,
        .nslots = FL_CRITEO_SLOTS,
        .ndense = FL_CRITEO_DENSE,
        .embed_dim = 10,
        .nhidden = 3,
        .hidden = {400, 400, 400},
        .pool = FL_SPARSE_SUM,
        .dtype = FL_DTYPE_F32,
        .max_batch = 512,
        .seed = 1,
    };
    return c;
}

const char *fl_ctr_model_type_name(fl_ctr_model_type t) {
    return t == FL_CTR_DEEPFM ? "deepfm" : "wide_deep";
}

int fl_ctr_model_type_parse(const char *name, fl_ctr_model_type *t) {
    if (name && strcmp(name, "wide_deep") == 0)
        *t = FL_CTR_WIDE_DEEP;
    else if (name && strcmp(name, "deepfm") == 0)
        *t = FL_CTR_DEEPFM;
    else
        return fl_fail(FL_EINVAL, "CTR model '%s' is not wide_deep or deepfm", name ? name : "");
    return FL_OK;
}

const char *fl_ctr_model_table_name(int t) {
    return t == FL_CTR_TABLE_EMBEDDING ? "embedding" : t == FL_CTR_TABLE_WIDE ? "wide" : NULL;
}

int fl_ctr_model_table_dim(const fl_ctr_model *m, int t) {
    return t == FL_CTR_TABLE_EMBEDDING ? m->cfg.embed_dim : t == FL_CTR_TABLE_WIDE ? 1 : -1;
}

const fl_ctr_model_config *fl_ctr_model_config_of(const fl_ctr_model *m) { return &m->cfg; }
fl_net *fl_ctr_model_net(fl_ctr_model *m) { return m->net; }
const fl_sparse_lookup *fl_ctr_model_lookup(const fl_ctr_model *m) { return &m->lk; }

fl_sparse_rows *fl_ctr_model_rows(fl_ctr_model *m, int t) {
    FL_ASSERT(t >= 0 && t < FL_CTR_NTABLES);
    return &m->rows[t];
}

static int check_config(const fl_ctr_model_config *c) {
    if (c->type != FL_CTR_WIDE_DEEP && c->type != FL_CTR_DEEPFM)
        return fl_fail(FL_ECONFIG, "ctr model: type %d is not wide_deep or deepfm", (int)c->type);
    if (c->nslots < 1 || c->nslots > FL_CTR_MAX_SLOTS)
        return fl_fail(FL_ECONFIG, "ctr model: nslots %d is outside [1, %d]", c->nslots,
                       FL_CTR_MAX_SLOTS);
    if (c->ndense < 0)
        return fl_fail(FL_ECONFIG, "ctr model: ndense %d is negative", c->ndense);
    if (c->embed_dim < 1 || c->embed_dim > 4096)
        return fl_fail(FL_ECONFIG, "ctr model: embed_dim %d is outside [1, 4096]",
                       c->embed_dim);
    if (c->nhidden < 0 || c->nhidden > FL_CTR_MAX_HIDDEN)
        return fl_fail(FL_ECONFIG, "ctr model: nhidden %d is outside [0, %d]", c->nhidden,
                       FL_CTR_MAX_HIDDEN);
    for (int i = 0; i < c->nhidden; i++)
        if (c->hidden[i] < 1)
            return fl_fail(FL_ECONFIG, "ctr model: hidden[%d] = %lld must be at least 1", i,
                           (long long)c->hidden[i]);
    if (c->pool != FL_SPARSE_SUM && c->pool != FL_SPARSE_MEAN)
        return fl_fail(FL_ECONFIG, "ctr model: pool %d is not sum or mean", (int)c->pool);
    if (c->dtype != FL_DTYPE_F32 && c->dtype != FL_DTYPE_F64)
        return fl_fail(FL_ECONFIG, "ctr model: dtype %s (f32 or f64)", fl_dtype_name(c->dtype));
    if (c->max_batch < 1)
        return fl_fail(FL_ECONFIG, "ctr model: max_batch %lld must be at least 1",
                       (long long)c->max_batch);
    return FL_OK;
}

/* The dense part: linear_0, act_0, ..., linear_H (deep), then dense_slice, wide_part or
 * dense_w_one, and logit = deep + that, when there are dense features. */
static int build_net(const fl_ctr_model_config *c, int64_t width, fl_net **out) {
    fl_net *net = fl_net_create(c->dtype, fl_backend_cpu());
    if (!net)
        return fl_fail(FL_ENOMEM, "ctr model: out of memory");
    char name[32];
    int64_t in = width;
    int rc = FL_OK, deep = -1;
    for (int i = 0; i <= c->nhidden && rc >= 0; i++) {
        int64_t width_out = i < c->nhidden ? c->hidden[i] : 1;
        snprintf(name, sizeof name, "linear_%d", i);
        rc = deep = nn_put(net, fl_fc_create(name, in, width_out, true), -2);
        if (rc >= 0 && i < c->nhidden) {
            snprintf(name, sizeof name, "act_%d", i);
            rc = nn_put(net, fl_activation_create(name, FL_ACT_RELU), -2);
        }
        in = width_out;
    }
    if (rc >= 0 && c->ndense > 0) {
        bool wd = c->type == FL_CTR_WIDE_DEEP;
        rc = nn_put(net, fl_slice_create("dense_slice", width - c->ndense, c->ndense),
                    FL_NET_INPUT);
        if (rc >= 0)
            rc = nn_put(net, fl_fc_create(wd ? "wide_part" : "dense_w_one", c->ndense, 1, wd),
                        -2);
        fl_layer *sum = rc >= 0 ? fl_add_create("logit", false) : NULL;
        rc = sum ? fl_net_add2(net, sum, deep, rc) : -1;
    }
    if (rc < 0) {
        fl_net_free(net);
        return fl_fail_prefix(FL_EINVAL, "building the dense part");
    }
    int64_t shape[1] = {width};
    if (rc >= 0)
        rc = fl_net_set_input_grad(net, true);
    if (rc >= 0)
        rc = fl_net_build(net, 1, shape, c->max_batch, c->seed);
    if (rc < 0) {
        fl_net_free(net);
        return rc;
    }
    *out = net;
    return FL_OK;
}

void fl_ctr_model_free(fl_ctr_model *m) {
    if (!m)
        return;
    fl_net_free(m->net);
    fl_sparse_lookup_free(&m->lk);
    for (int t = 0; t < FL_CTR_NTABLES; t++)
        fl_sparse_rows_free(&m->rows[t]);
    free(m->x.data);
    free(m->wide);
    free(m->demb);
    free(m->logits.data);
    free(m->dnet.data);
    free(m);
}

int fl_ctr_model_create(const fl_ctr_model_config *c, fl_ctr_model **out) {
    FL_ASSERT(c && out);
    *out = NULL;
    FL_TRY(check_config(c));
    fl_ctr_model *m = calloc(1, sizeof *m);
    if (!m)
        return fl_fail(FL_ENOMEM, "ctr model: out of memory");
    m->cfg = *c;
    m->width = (int64_t)c->nslots * c->embed_dim + c->ndense;
    m->esize = fl_dtype_size(c->dtype);
    int64_t B = c->max_batch, S = c->nslots;
    int rc = build_net(c, m->width, &m->net);
    if (rc < 0) {
        free(m);
        return fl_fail_prefix(rc, "ctr model %s", fl_ctr_model_type_name(c->type));
    }
    fl_tensor_view(&m->x, c->dtype, 2, (int64_t[]){B, m->width}, malloc((size_t)(B * m->width) *
                                                                         m->esize));
    fl_tensor_view(&m->logits, c->dtype, 1, (int64_t[]){B}, malloc((size_t)B * m->esize));
    fl_tensor_view(&m->dnet, c->dtype, 2, (int64_t[]){B, 1}, malloc((size_t)B * m->esize));
    m->wide = malloc((size_t)(B * S) * m->esize);
    if (c->type == FL_CTR_DEEPFM)
        m->demb = malloc((size_t)(B * S * c->embed_dim) * m->esize);
    if (!m->x.data || !m->logits.data || !m->dnet.data || !m->wide ||
        (c->type == FL_CTR_DEEPFM && !m->demb)) {
        fl_ctr_model_free(m);
        return fl_fail(FL_ENOMEM, "ctr model: out of memory for batch %lld", (long long)B);
    }
    *out = m;
    return FL_OK;
}

int fl_ctr_model_prepare(fl_ctr_model *m, const fl_ctr_batch *b) {
    FL_ASSERT(m && b);
    m->prepared = m->have_forward = false;
    if (b->nslots != m->cfg.nslots || b->ndense != m->cfg.ndense)
        return fl_fail(FL_ESHAPE, "ctr model: batch of %d slots and %d dense features, the "
                       "model has %d and %d", b->nslots, b->ndense, m->cfg.nslots,
                       m->cfg.ndense);
    if (b->batch > m->cfg.max_batch)
        return fl_fail(FL_ESHAPE, "ctr model: batch of %lld exceeds max_batch %lld",
                       (long long)b->batch, (long long)m->cfg.max_batch);
    FL_TRY(fl_sparse_lookup_collect(&m->lk, b, NULL, 0));
    for (int t = 0; t < FL_CTR_NTABLES; t++)
        FL_TRY(fl_sparse_rows_prepare(&m->rows[t], fl_ctr_model_table_dim(m, t), &m->lk));
    m->batch = b;
    m->prepared = true;
    return FL_OK;
}

/* Stamped for the model's two dtypes: the dense features into x's last columns, the logits from
 * the network's output, the wide sum and the FM term, and the FM term's backward. */
#define STAMP_CTR(T, S)                                                                      \
    static void dense_in_##S(const fl_ctr_batch *b, T *x, int64_t width) {                  \
        int nd = b->ndense;                                                                  \
        for (int64_t i = 0; i < b->batch; i++)                                               \
            for (int j = 0; j < nd; j++)                                                     \
                x[i * width + width - nd + j] = (T)b->dense[i * nd + j];                     \
    }                                                                                        \
    /* logit[i] = net[i] + sum_j wide[i, j] (+ 1/2 sum_c (sum_j e)^2 - sum_j e^2) */          \
    static void logits_##S(const fl_ctr_model *m, const T *net, const T *wide, const T *x,   \
                           T *logit) {                                                       \
        int64_t B = m->batch->batch, W = m->width;                                           \
        int nslots = m->cfg.nslots, dim = m->cfg.embed_dim;                                  \
        bool fm = m->cfg.type == FL_CTR_DEEPFM;                                              \
        for (int64_t i = 0; i < B; i++) {                                                    \
            T z = net[i];                                                                    \
            for (int j = 0; j < nslots; j++)                                                 \
                z += wide[i * nslots + j];                                                   \
            if (fm) {                                                                        \
                const T *e = x + i * W;                                                      \
                T second = 0;                                                                \
                for (int c = 0; c < dim; c++) {                                              \
                    T sum = 0, sq = 0;                                                       \
                    for (int j = 0; j < nslots; j++) {                                       \
                        T v = e[j * dim + c];                                                \
                        sum += v;                                                            \
                        sq += v * v;                                                         \
                    }                                                                        \
                    second += sum * sum - sq;                                                \
                }                                                                            \
                z += (T)0.5 * second;                                                        \
            }                                                                                \
            logit[i] = z;                                                                    \
        }                                                                                    \
    }                                                                                        \
    /* demb = the network's input gradient's embedding columns + dlogit * (sum_j e - e) */   \
    static void fm_backward_##S(const fl_ctr_model *m, const T *dl, const T *x, const T *dx, \
                                T *demb) {                                                   \
        int64_t B = m->batch->batch, W = m->width;                                           \
        int nslots = m->cfg.nslots, dim = m->cfg.embed_dim;                                  \
        for (int64_t i = 0; i < B; i++) {                                                    \
            const T *e = x + i * W, *g = dx + i * W;                                         \
            T *d = demb + i * (int64_t)nslots * dim;                                         \
            for (int c = 0; c < dim; c++) {                                                  \
                T sum = 0;                                                                   \
                for (int j = 0; j < nslots; j++)                                             \
                    sum += e[j * dim + c];                                                   \
                for (int j = 0; j < nslots; j++)                                             \
                    d[j * dim + c] = g[j * dim + c] + dl[i] * (sum - e[j * dim + c]);        \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
    static void fill_rows_##S(T *dst, const T *src, int64_t B, int nslots) {                 \
        for (int64_t i = 0; i < B; i++)                                                      \
            for (int j = 0; j < nslots; j++)                                                 \
                dst[i * nslots + j] = src[i];                                                \
    }
STAMP_CTR(float, f32)
STAMP_CTR(double, f64)

int fl_ctr_model_forward(fl_ctr_model *m, bool training, const fl_tensor **logits) {
    FL_ASSERT(m && logits);
    if (!m->prepared)
        return fl_fail(FL_ESTATE, "ctr model: forward before fl_ctr_model_prepare");
    m->have_forward = false;
    const fl_ctr_batch *b = m->batch;
    int64_t B = b->batch;
    fl_dtype t = m->cfg.dtype;
    bool f32 = t == FL_DTYPE_F32;
    m->x.shape[0] = B;
    m->x.numel = B * m->width;
    FL_TRY(fl_sparse_embedding_forward(&m->lk, &m->rows[FL_CTR_TABLE_EMBEDDING], m->cfg.pool, t,
                                       m->x.data, m->width));
    if (f32)
        dense_in_f32(b, m->x.data, m->width);
    else
        dense_in_f64(b, m->x.data, m->width);
    FL_TRY(fl_sparse_embedding_forward(&m->lk, &m->rows[FL_CTR_TABLE_WIDE], m->cfg.pool, t,
                                       m->wide, 0));
    m->logits.shape[0] = m->logits.numel = B;
    if (B == 0) { /* an empty batch (a line-sharded reader's last): nothing to run */
        m->have_forward = true;
        *logits = &m->logits;
        return FL_OK;
    }
    const fl_tensor *net_out;
    FL_TRY(fl_net_forward(m->net, &m->x, training, &net_out));
    if (f32)
        logits_f32(m, net_out->data, m->wide, m->x.data, m->logits.data);
    else
        logits_f64(m, net_out->data, m->wide, m->x.data, m->logits.data);
    m->have_forward = true;
    *logits = &m->logits;
    return FL_OK;
}

/* Checks dlogits against the forward's batch (FL_ESTATE, FL_ESHAPE). */
static int check_dlogits(const fl_ctr_model *m, const fl_tensor *dlogits) {
    if (!m->have_forward)
        return fl_fail(FL_ESTATE, "ctr model: backward without a forward");
    int64_t B = m->batch->batch;
    fl_dtype t = m->cfg.dtype;
    char buf[96];
    if (dlogits->dtype != t || dlogits->numel != B || dlogits->shape[0] != B ||
        !(dlogits->ndim == 1 || (dlogits->ndim == 2 && dlogits->shape[1] == 1)))
        return fl_fail(FL_ESHAPE, "ctr model: dlogits %s %s, want %s (%lld)",
                       fl_dtype_name(dlogits->dtype),
                       fl_shape_str(dlogits->ndim, dlogits->shape, buf, sizeof buf),
                       fl_dtype_name(t), (long long)B);
    return FL_OK;
}

int fl_ctr_model_dnet(fl_ctr_model *m, const fl_tensor *dlogits, const fl_tensor **dnet) {
    FL_ASSERT(m && dlogits && dnet);
    FL_TRY(check_dlogits(m, dlogits));
    int64_t B = m->batch->batch;
    /* the network's output gradient is dlogits itself (logit = net + the rest) */
    m->dnet.shape[0] = m->dnet.numel = B;
    if (B > 0)
        memcpy(m->dnet.data, dlogits->data, (size_t)B * m->esize);
    *dnet = &m->dnet;
    return FL_OK;
}

int fl_ctr_model_backward_rows(fl_ctr_model *m, const fl_tensor *dlogits) {
    FL_ASSERT(m && dlogits);
    FL_TRY(check_dlogits(m, dlogits));
    int64_t B = m->batch->batch;
    if (B == 0) /* no samples: no rows */
        return FL_OK;
    fl_dtype t = m->cfg.dtype;
    bool f32 = t == FL_DTYPE_F32;
    const fl_tensor *dx = fl_net_input_grad(m->net);
    if (!dx || dx->numel != B * m->width)
        return fl_fail(FL_ESTATE, "ctr model: the rows' gradients need the network's backward "
                                  "of this batch first");
    fl_sparse_rows *emb = &m->rows[FL_CTR_TABLE_EMBEDDING];
    if (m->cfg.type == FL_CTR_DEEPFM) {
        if (f32)
            fm_backward_f32(m, dlogits->data, m->x.data, dx->data, m->demb);
        else
            fm_backward_f64(m, dlogits->data, m->x.data, dx->data, m->demb);
        FL_TRY(fl_sparse_embedding_backward(&m->lk, emb, m->cfg.pool, t, m->demb, 0));
    } else {
        FL_TRY(fl_sparse_embedding_backward(&m->lk, emb, m->cfg.pool, t, dx->data, m->width));
    }
    /* every slot's wide value enters the logit with weight 1 */
    if (f32)
        fill_rows_f32(m->wide, dlogits->data, B, m->cfg.nslots);
    else
        fill_rows_f64(m->wide, dlogits->data, B, m->cfg.nslots);
    FL_TRY(fl_sparse_embedding_backward(&m->lk, &m->rows[FL_CTR_TABLE_WIDE], m->cfg.pool, t,
                                        m->wide, 0));
    return FL_OK;
}

int fl_ctr_model_backward(fl_ctr_model *m, const fl_tensor *dlogits) {
    FL_ASSERT(m && dlogits);
    const fl_tensor *dnet;
    FL_TRY(fl_ctr_model_dnet(m, dlogits, &dnet));
    if (m->batch->batch == 0) { /* no samples: zero gradients, no rows */
        fl_net_zero_grad(m->net);
        return FL_OK;
    }
    FL_TRY(fl_net_backward(m->net, dnet, NULL, NULL));
    return fl_ctr_model_backward_rows(m, dlogits);
}
