/* test_ctr_model.c - sigmoid cross-entropy against a double reference and finite differences
 * (large logits included); wide&deep and DeepFM: forward against a reference written out from
 * the parameters and a dense table, the full backward (the dense part's flat gradients and both
 * tables' row gradients) against finite differences in f64, sum and mean pooling, empty bags and
 * repeated ids; bad configs and batches refused by name; and a few hundred steps on ctr_synth
 * (local fl_ps_sparse tables with Adagrad, the dense part with fleet's optimizer) that lift the
 * validation AUC well above chance toward the teacher's best. */
#include "fleet/ctr.h"
#include "fleet/metrics.h"
#include "fleet/nn.h"
#include "fleet/optim.h"
#include "fleet/ps.h"
#include "fleet/rng.h"
#include "fleet/sparse.h"
#include "fleet/status.h"
#include "test.h"

#include "ps/table.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- sigmoid cross-entropy ------------------------------------------------------------- */

static void test_sigmoid_xent(void) {
    enum { N = 8 };
    double z[N] = {-3.0, -0.5, 0.0, 0.25, 2.0, 7.5, -40.0, 60.0};
    int32_t y[N] = {0, 1, 1, 0, 1, 0, 1, 0};
    fl_tensor lg, pr, dl;
    double probs[N], dlog[N], loss = 0;
    fl_tensor_view(&lg, FL_DTYPE_F64, 1, (int64_t[]){N}, z);
    fl_tensor_view(&pr, FL_DTYPE_F64, 1, (int64_t[]){N}, probs);
    fl_tensor_view(&dl, FL_DTYPE_F64, 1, (int64_t[]){N}, dlog);
    CHECK_OK(fl_sigmoid_xent_forward(&lg, y, &pr, &loss));
    /* the definition, -y log p - (1 - y) log(1 - p), in long double where it is still exact
     * enough; for |z| large, its limit: max(z, 0) - z y */
    long double want = 0;
    for (int i = 0; i < N; i++) {
        long double p = 1.0L / (1.0L + expl(-(long double)z[i]));
        long double li = fabs(z[i]) < 30 ? -(y[i] ? logl(p) : logl(1.0L - p))
                                         : fmaxl(z[i], 0) - z[i] * y[i] + expl(-fabsl(z[i]));
        want += li;
        CHECK_NEAR(probs[i], (double)p, 1e-15);
    }
    CHECK_NEAR(loss, (double)(want / N), 1e-14);
    CHECK(isfinite(loss));
    /* backward against central differences of the mean loss */
    CHECK_OK(fl_sigmoid_xent_backward(&lg, y, &dl));
    double fd[N];
    for (int i = 0; i < N; i++) {
        double keep = z[i], lp, lm, h = 1e-6;
        z[i] = keep + h;
        CHECK_OK(fl_sigmoid_xent_forward(&lg, y, NULL, &lp));
        z[i] = keep - h;
        CHECK_OK(fl_sigmoid_xent_forward(&lg, y, NULL, &lm));
        z[i] = keep;
        fd[i] = (lp - lm) / (2 * h);
    }
    CHECK_CLOSE("sigmoid xent backward", dlog, fd, N, 1e-9, 1e-6);
    /* f32, (B, 1), in place */
    float zf[N], pf[N];
    for (int i = 0; i < N; i++)
        zf[i] = (float)z[i];
    fl_tensor lf, pfv;
    fl_tensor_view(&lf, FL_DTYPE_F32, 2, (int64_t[]){N, 1}, zf);
    fl_tensor_view(&pfv, FL_DTYPE_F32, 2, (int64_t[]){N, 1}, pf);
    double lossf;
    CHECK_OK(fl_sigmoid_xent_forward(&lf, y, &pfv, &lossf));
    CHECK_NEAR(lossf, loss, 1e-6);
    CHECK_OK(fl_sigmoid_xent_backward(&lf, y, &lf));
    for (int i = 0; i < N; i++)
        CHECK_NEAR(zf[i], dlog[i], 1e-7);
    /* a label that is not 0 or 1 is named; shapes must fit */
    int32_t bad[N] = {0, 1, 2, 0, 0, 0, 0, 0};
    CHECK_RC(fl_sigmoid_xent_forward(&lg, bad, NULL, &loss), FL_EINVAL);
    CHECK_MSG("label 2 of row 2");
    CHECK_RC(fl_sigmoid_xent_backward(&lg, y, &lf), FL_ESHAPE);
    fl_tensor two;
    fl_tensor_view(&two, FL_DTYPE_F64, 2, (int64_t[]){N / 2, 2}, z);
    CHECK_RC(fl_sigmoid_xent_forward(&two, y, NULL, &loss), FL_ESHAPE);
}

/* ---- the models against a reference and finite differences ------------------------------ */

enum { S = 3, ND = 2, DIM = 3, VOCAB = 4, B = 5 };

/* the dense tables, in f32 as the rows hold them */
static float table_emb[S][VOCAB][DIM], table_wide[S][VOCAB];

static uint64_t id_of(int s, int v) { return fl_ctr_id(s, (uint64_t)v + 100); }
static int value_of(uint64_t id) { return (int)((id & FL_CTR_HASH_MASK) - 100); }

/* sample i: slot s's bag (values, -1 ends): empty bags, a repeated id, ids shared by samples */
static const int bags[B][S][4] = {
    {{1, 1, -1}, {0, -1}, {3, 2, -1}},
    {{2, -1}, {-1}, {1, -1}},
    {{1, -1}, {3, 0, 3, -1}, {-1}},
    {{-1}, {0, -1}, {2, 0, 1, -1}},
    {{3, 1, -1}, {2, -1}, {0, -1}},
};

static void make_batch(fl_ctr_batch *b) {
    CHECK_OK(fl_ctr_batch_init(b, ND, S, B, 8));
    fl_rng r;
    fl_rng_init(&r, 21, 0);
    for (int i = 0; i < B; i++) {
        uint64_t ids[16];
        int32_t counts[S];
        int n = 0;
        for (int s = 0; s < S; s++) {
            int c = 0;
            while (bags[i][s][c] >= 0) {
                ids[n++] = id_of(s, bags[i][s][c]);
                c++;
            }
            counts[s] = c;
        }
        float dense[ND];
        for (int j = 0; j < ND; j++)
            dense[j] = 2.0f * fl_rng_uniform(&r) - 1.0f;
        CHECK_OK(fl_ctr_batch_add(b, (i * 7 + 1) % 3 == 0, dense, ids, counts));
    }
}

static void fill_tables(fl_ctr_model *m) {
    fl_sparse_rows *e = fl_ctr_model_rows(m, FL_CTR_TABLE_EMBEDDING);
    fl_sparse_rows *w = fl_ctr_model_rows(m, FL_CTR_TABLE_WIDE);
    for (int64_t k = 0; k < e->n; k++) {
        int s = fl_ctr_id_slot(e->ids[k]), v = value_of(e->ids[k]);
        for (int c = 0; c < DIM; c++)
            e->rows[k * DIM + c] = table_emb[s][v][c];
        w->rows[k] = table_wide[s][v];
    }
}

static const double *pvalue(fl_net *net, const char *name) {
    fl_param *p = fl_net_find_param(net, name);
    FL_ASSERT(p);
    return p->value.data;
}

/* The model's logits by its definition (sparse.h), from the dense tables and the network's
 * parameters (f64). */
static void ref_logits(fl_ctr_model *m, const fl_ctr_batch *b, double *logit) {
    const fl_ctr_model_config *c = fl_ctr_model_config_of(m);
    fl_net *net = fl_ctr_model_net(m);
    bool mean = c->pool == FL_SPARSE_MEAN, fm = c->type == FL_CTR_DEEPFM;
    for (int i = 0; i < B; i++) {
        double x[S * DIM + ND], wide = 0;
        for (int s = 0; s < S; s++) {
            int64_t n;
            const uint64_t *ids = fl_ctr_bag(b, i, s, &n);
            double e[DIM] = {0}, w = 0;
            for (int64_t q = 0; q < n; q++) {
                int v = value_of(ids[q]);
                for (int k = 0; k < DIM; k++)
                    e[k] += table_emb[s][v][k];
                w += table_wide[s][v];
            }
            for (int k = 0; k < DIM; k++)
                x[s * DIM + k] = mean && n > 0 ? e[k] / (double)n : e[k];
            wide += mean && n > 0 ? w / (double)n : w;
        }
        for (int j = 0; j < ND; j++)
            x[S * DIM + j] = b->dense[i * ND + j];
        /* the MLP */
        double h[64], t[64];
        int width = S * DIM + ND;
        memcpy(h, x, sizeof x);
        for (int l = 0; l <= c->nhidden; l++) {
            int out = l < c->nhidden ? (int)c->hidden[l] : 1;
            char wn[32], bn[32];
            snprintf(wn, sizeof wn, "linear_%d.weight", l);
            snprintf(bn, sizeof bn, "linear_%d.bias", l);
            const double *W = pvalue(net, wn), *bias = pvalue(net, bn);
            for (int o = 0; o < out; o++) {
                double a = bias[o];
                for (int k = 0; k < width; k++)
                    a += W[o * width + k] * h[k];
                t[o] = l < c->nhidden ? fmax(a, 0.0) : a;
            }
            memcpy(h, t, sizeof(double) * (size_t)out);
            width = out;
        }
        double z = h[0] + wide;
        const double *dw = pvalue(net, fm ? "dense_w_one.weight" : "wide_part.weight");
        for (int j = 0; j < ND; j++)
            z += dw[j] * x[S * DIM + j];
        if (!fm)
            z += pvalue(net, "wide_part.bias")[0];
        if (fm)
            for (int k = 0; k < DIM; k++) {
                double sum = 0, sq = 0;
                for (int s = 0; s < S; s++) {
                    sum += x[s * DIM + k];
                    sq += x[s * DIM + k] * x[s * DIM + k];
                }
                z += 0.5 * (sum * sum - sq);
            }
        logit[i] = z;
    }
}

/* The mean sigmoid cross-entropy of the model on b with the tables' current rows. */
static double model_loss(fl_ctr_model *m, const fl_ctr_batch *b) {
    const fl_tensor *lg;
    double loss = NAN;
    CHECK_OK(fl_ctr_model_forward(m, true, &lg));
    CHECK_OK(fl_sigmoid_xent_forward(lg, b->labels, NULL, &loss));
    return loss;
}

static void test_model_gradients(fl_ctr_model_type type, fl_sparse_pool pool) {
    fl_ctr_model_config c = fl_ctr_model_config_default(type);
    c.nslots = S;
    c.ndense = ND;
    c.embed_dim = DIM;
    c.nhidden = 2;
    c.hidden[0] = 6;
    c.hidden[1] = 4;
    c.pool = pool;
    c.dtype = FL_DTYPE_F64;
    c.max_batch = 8;
    c.seed = 3 + (uint64_t)type;
    fl_ctr_model *m;
    CHECK_OK(fl_ctr_model_create(&c, &m));
    if (!m)
        return;
    fl_ctr_batch b;
    make_batch(&b);
    CHECK_OK(fl_ctr_model_prepare(m, &b));
    CHECK(fl_ctr_model_lookup(m)->n == 3 + 3 + 4); /* slots' distinct values */
    fill_tables(m);

    /* forward against the definition */
    const fl_tensor *lg;
    CHECK_OK(fl_ctr_model_forward(m, true, &lg));
    CHECK(lg->ndim == 1 && lg->shape[0] == B && lg->dtype == FL_DTYPE_F64);
    double want[B];
    ref_logits(m, &b, want);
    CHECK_CLOSE("logits vs reference", (const double *)lg->data, want, B, 1e-12, 1e-12);

    /* backward */
    double dl[B];
    fl_tensor dlt;
    fl_tensor_view(&dlt, FL_DTYPE_F64, 1, (int64_t[]){B}, dl);
    CHECK_OK(fl_sigmoid_xent_backward(lg, b.labels, &dlt));
    CHECK_OK(fl_ctr_model_backward(m, &dlt));
    fl_net *net = fl_ctr_model_net(m);
    int64_t np = fl_net_numel(net);
    double *w = fl_net_flat_params(net), *g = malloc((size_t)np * sizeof *g);
    memcpy(g, fl_net_flat_grads(net), (size_t)np * sizeof *g);
    fl_sparse_rows *rows[2] = {fl_ctr_model_rows(m, 0), fl_ctr_model_rows(m, 1)};
    int64_t nr[2] = {rows[0]->n * DIM, rows[1]->n};
    double *rg[2], *rfd[2];
    for (int t = 0; t < 2; t++) {
        rg[t] = malloc((size_t)nr[t] * sizeof **rg);
        rfd[t] = malloc((size_t)nr[t] * sizeof **rfd);
        for (int64_t q = 0; q < nr[t]; q++)
            rg[t][q] = rows[t]->grads[q];
    }

    /* finite differences: the dense parameters (f64), then every row value (f32: the step
     * actually taken is what the rounded values differ by) */
    double *fd = malloc((size_t)np * sizeof *fd), h = 1e-5;
    for (int64_t q = 0; q < np; q++) {
        double keep = w[q];
        w[q] = keep + h;
        double lp = model_loss(m, &b);
        w[q] = keep - h;
        double lm = model_loss(m, &b);
        w[q] = keep;
        fd[q] = (lp - lm) / (2 * h);
    }
    char what[96];
    snprintf(what, sizeof what, "%s/%s dense gradients", fl_ctr_model_type_name(type),
             fl_sparse_pool_name(pool));
    CHECK_CLOSE(what, g, fd, np, 1e-8, 1e-5);
    for (int t = 0; t < 2; t++) {
        for (int64_t q = 0; q < nr[t]; q++) {
            float keep = rows[t]->rows[q], hp = keep + 1e-3f, hm = keep - 1e-3f;
            rows[t]->rows[q] = hp;
            double lp = model_loss(m, &b);
            rows[t]->rows[q] = hm;
            double lm = model_loss(m, &b);
            rows[t]->rows[q] = keep;
            rfd[t][q] = (lp - lm) / ((double)hp - (double)hm);
        }
        snprintf(what, sizeof what, "%s/%s %s row gradients", fl_ctr_model_type_name(type),
                 fl_sparse_pool_name(pool), fl_ctr_model_table_name(t));
        CHECK_CLOSE(what, rg[t], rfd[t], nr[t], 1e-7, 1e-4);
        free(rg[t]);
        free(rfd[t]);
    }
    /* the gradients are not all zero (the checks above could not pass vacuously) */
    double gn = 0;
    for (int64_t q = 0; q < np; q++)
        gn += fabs(g[q]);
    CHECK(gn > 1e-3);
    free(fd);
    free(g);
    fl_ctr_batch_free(&b);
    fl_ctr_model_free(m);
}

static void test_model_errors(void) {
    fl_ctr_model_config c = fl_ctr_model_config_default(FL_CTR_WIDE_DEEP);
    fl_ctr_model *m = NULL;
    c.embed_dim = 0;
    CHECK_RC(fl_ctr_model_create(&c, &m), FL_ECONFIG);
    CHECK_MSG("embed_dim 0");
    CHECK(m == NULL);
    c = fl_ctr_model_config_default(FL_CTR_DEEPFM);
    c.hidden[1] = 0;
    CHECK_RC(fl_ctr_model_create(&c, &m), FL_ECONFIG);
    CHECK_MSG("hidden[1]");
    c = fl_ctr_model_config_default(FL_CTR_DEEPFM);
    c.nhidden = 1;
    c.hidden[0] = 8;
    c.max_batch = 4;
    CHECK_OK(fl_ctr_model_create(&c, &m));
    if (!m)
        return;
    /* the dense part's layers carry PaddleRec's names */
    fl_net *net = fl_ctr_model_net(m);
    CHECK(fl_net_find_param(net, "linear_0.weight") && fl_net_find_param(net, "linear_1.bias"));
    CHECK(fl_net_find_param(net, "dense_w_one.weight") && !fl_net_find_param(net, "dense_w_one.bias"));
    CHECK(fl_net_numel(net) == (26 * 10 + 13) * 8 + 8 + 8 + 1 + 13);
    CHECK(fl_ctr_model_table_dim(m, 0) == 10 && fl_ctr_model_table_dim(m, 1) == 1);
    CHECK(!strcmp(fl_ctr_model_table_name(0), "embedding") && !fl_ctr_model_table_name(2));
    const fl_tensor *lg;
    CHECK_RC(fl_ctr_model_forward(m, true, &lg), FL_ESTATE);
    fl_ctr_batch b;
    make_batch(&b); /* 3 slots, 2 dense: not this model's */
    CHECK_RC(fl_ctr_model_prepare(m, &b), FL_ESHAPE);
    CHECK_MSG("3 slots and 2 dense");
    fl_ctr_batch_free(&b);
    /* an empty batch of the model's shape: empty logits, zero gradients, no rows */
    CHECK_OK(fl_ctr_batch_init(&b, 13, 26, 1, 1));
    CHECK_OK(fl_ctr_model_prepare(m, &b));
    CHECK(fl_ctr_model_rows(m, 0)->n == 0);
    CHECK_OK(fl_ctr_model_forward(m, true, &lg));
    CHECK(lg->numel == 0);
    float none[1];
    fl_tensor dl;
    fl_tensor_view(&dl, FL_DTYPE_F32, 1, (int64_t[]){0}, none);
    memset(fl_net_flat_grads(net), 0x3f, (size_t)fl_net_numel(net) * sizeof(float));
    CHECK_OK(fl_ctr_model_backward(m, &dl));
    CHECK(((float *)fl_net_flat_grads(net))[0] == 0.0f);
    fl_ctr_batch_free(&b);
    fl_ctr_model_type t;
    CHECK_OK(fl_ctr_model_type_parse("deepfm", &t));
    CHECK(t == FL_CTR_DEEPFM);
    CHECK_RC(fl_ctr_model_type_parse("dnn", &t), FL_EINVAL);
    CHECK_MSG("'dnn'");
    fl_ctr_model_free(m);
}

/* ---- training on ctr_synth ------------------------------------------------------------- */

typedef struct {
    double auc0, auc, best, loss0, loss;
} train_result;

/* Validation AUC and log loss of m over `batches` batches of 512 of split 1. */
static void evaluate(fl_ctr_model *m, fl_ps_sparse *tables[2], const fl_ctr_synth *val,
                     int batches, double *auc, double *logloss) {
    fl_ctr_metrics met;
    CHECK_OK(fl_ctr_metrics_init(&met, FL_AUC_THRESHOLDS));
    fl_ctr_batch b;
    CHECK_OK(fl_ctr_batch_init(&b, FL_CRITEO_DENSE, FL_CRITEO_SLOTS, 512, 512 * 26));
    float p[512];
    for (int s = 0; s < batches; s++) {
        CHECK_OK(fl_ctr_synth_batch(val, s, 0, 1, 512, &b));
        CHECK_OK(fl_ctr_model_prepare(m, &b));
        for (int t = 0; t < 2; t++) {
            fl_sparse_rows *r = fl_ctr_model_rows(m, t);
            CHECK_OK(fl_ps_sparse_pull_rows(tables[t], r->ids, r->n, r->rows));
        }
        const fl_tensor *lg;
        CHECK_OK(fl_ctr_model_forward(m, false, &lg));
        fl_tensor pt;
        fl_tensor_view(&pt, FL_DTYPE_F32, 1, (int64_t[]){b.batch}, p);
        double loss;
        CHECK_OK(fl_sigmoid_xent_forward(lg, b.labels, &pt, &loss));
        CHECK_OK(fl_ctr_metrics_add(&met, p, b.labels, b.batch));
    }
    *auc = fl_ctr_metrics_auc(&met);
    *logloss = fl_ctr_metrics_logloss(&met);
    fl_ctr_batch_free(&b);
    fl_ctr_metrics_free(&met);
}

static void train_synth(fl_ctr_model_type type, int steps, train_result *res) {
    fl_ctr_synth_config sc = fl_ctr_synth_config_default();
    sc.vocab = 10000;
    fl_ctr_synth *train = fl_ctr_synth_create(&sc);
    sc.split = 1;
    fl_ctr_synth *val = fl_ctr_synth_create(&sc);
    CHECK(train && val);
    fl_ctr_model_config c = fl_ctr_model_config_default(type);
    c.embed_dim = 8;
    c.nhidden = 2;
    c.hidden[0] = 64;
    c.hidden[1] = 32;
    c.max_batch = 512;
    fl_ctr_model *m = NULL;
    CHECK_OK(fl_ctr_model_create(&c, &m));
    fl_ps_rule rule;
    fl_ps_rule_defaults(&rule, FL_PS_RULE_ADAGRAD);
    fl_ps_init_rule init_emb = {.type = FL_PS_INIT_UNIFORM, .a = -0.05, .b = 0.05, .seed = 7};
    fl_ps_init_rule init_wide = {.type = FL_PS_INIT_ZERO, .seed = 7};
    fl_ps_sparse *tables[2] = {NULL, NULL};
    CHECK_OK(fl_ps_sparse_create(0, c.embed_dim, &rule, &init_emb, &tables[0]));
    CHECK_OK(fl_ps_sparse_create(1, 1, &rule, &init_wide, &tables[1]));
    if (!train || !val || !m || !tables[0] || !tables[1])
        goto done;
    fl_net *net = fl_ctr_model_net(m);
    fl_optim_config oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9};
    fl_optim *opt = fl_optim_create(&oc, fl_net_param(net, 0), fl_net_num_params(net),
                                    FL_DTYPE_F32, fl_net_backend(net));
    CHECK(opt != NULL);
    CHECK_OK(fl_ctr_synth_best_auc(val, 8192, &res->best));
    evaluate(m, tables, val, 16, &res->auc0, &res->loss0);
    fl_ctr_batch b;
    CHECK_OK(fl_ctr_batch_init(&b, FL_CRITEO_DENSE, FL_CRITEO_SLOTS, 256, 256 * 26));
    float dl[256];
    for (int step = 0; step < steps && opt; step++) {
        CHECK_OK(fl_ctr_synth_batch(train, step, 0, 1, 256, &b));
        CHECK_OK(fl_ctr_model_prepare(m, &b));
        for (int t = 0; t < 2; t++) {
            fl_sparse_rows *r = fl_ctr_model_rows(m, t);
            CHECK_OK(fl_ps_sparse_pull_rows(tables[t], r->ids, r->n, r->rows));
        }
        const fl_tensor *lg;
        CHECK_OK(fl_ctr_model_forward(m, true, &lg));
        fl_tensor dlt;
        fl_tensor_view(&dlt, FL_DTYPE_F32, 1, (int64_t[]){b.batch}, dl);
        CHECK_OK(fl_sigmoid_xent_backward(lg, b.labels, &dlt));
        CHECK_OK(fl_ctr_model_backward(m, &dlt));
        for (int t = 0; t < 2; t++) {
            fl_sparse_rows *r = fl_ctr_model_rows(m, t);
            /* Paddle's sparse Adagrad scales lr by sqrt(3 / (3 + g2sum)) ~ 1 while the mean
             * loss's row gradients are small (1 / B an occurrence): hence a large lr */
            CHECK_OK(fl_ps_sparse_push_rows(tables[t], r->ids, r->n, r->grads, 2.0));
        }
        CHECK_OK(fl_optim_step(opt, 0.1, NULL));
    }
    evaluate(m, tables, val, 16, &res->auc, &res->loss);
    fl_optim_free(opt);
    fl_ctr_batch_free(&b);
done:
    fl_ps_sparse_free(tables[0]);
    fl_ps_sparse_free(tables[1]);
    fl_ctr_model_free(m);
    fl_ctr_synth_free(train);
    fl_ctr_synth_free(val);
}

static void test_training(void) {
    for (int type = 0; type < 2; type++) {
        train_result r = {0};
        train_synth((fl_ctr_model_type)type, 300, &r);
        fprintf(stderr, "%s: validation AUC %.4f -> %.4f after 300 steps of 256 (teacher's best "
                "%.4f), log loss %.4f -> %.4f\n", fl_ctr_model_type_name(type), r.auc0, r.auc,
                r.best, r.loss0, r.loss);
        /* measured: 0.727 for both (best 0.823, chance 0.5); the line is far below that, so
         * another CPU's kernels cannot cross it, and far above what an untrained or broken
         * model reaches (0.52) */
        CHECK(r.best > 0.75);
        CHECK(r.auc > 0.65);
        CHECK(r.auc < r.best + 0.01);
        CHECK(r.loss < r.loss0);
    }
}

int main(void) {
    fl_rng rng;
    fl_rng_init(&rng, 17, 0);
    for (int s = 0; s < S; s++)
        for (int v = 0; v < VOCAB; v++) {
            for (int k = 0; k < DIM; k++)
                table_emb[s][v][k] = fl_rng_uniform(&rng) - 0.5f;
            table_wide[s][v] = fl_rng_uniform(&rng) - 0.5f;
        }
    test_sigmoid_xent();
    for (int type = 0; type < 2; type++)
        for (int pool = 0; pool < 2; pool++)
            test_model_gradients((fl_ctr_model_type)type, (fl_sparse_pool)pool);
    test_model_errors();
    test_training();
    TEST_DONE();
}
