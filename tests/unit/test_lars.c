/* test_lars.c - LARS momentum against a hand-written float64 reference of Paddle's
 * lars_momentum kernel (trust ratio, excluded names with a plain momentum step, zero weights,
 * L2 decay folded into the gradient, epsilon), with both kernel tables and both dtypes; the
 * name-fragment matching; configuration errors. */
#include "fleet/backend.h"
#include "fleet/optim.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { NP = 4, MAXN = 64, STEPS = 3 };
static const char *names[NP] = {"layer1.0.conv1.weight", "layer1.0.bn1.weight", "fc.bias",
                                "zero.weight"};
static const int64_t sizes[NP] = {48, 8, 5, 6};

/* one step of the reference, per parameter (optim.h's formula, written out) */
static void ref_step(const fl_optim_config *c, double lr, double w[NP][MAXN],
                     double g[NP][MAXN], double v[NP][MAXN]) {
    for (int p = 0; p < NP; p++) {
        int64_t n = sizes[p];
        double gg[MAXN], wn = 0, gn = 0;
        for (int64_t i = 0; i < n; i++)
            gg[i] = g[p][i] + c->weight_decay * w[p][i];
        bool excluded = strstr(names[p], "bn") || strstr(names[p], "bias");
        double d = excluded ? 0 : c->lars_weight_decay;
        for (int64_t i = 0; i < n; i++) {
            wn += w[p][i] * w[p][i];
            gn += gg[i] * gg[i];
        }
        wn = sqrt(wn), gn = sqrt(gn);
        double local = lr;
        if (d > 0 && wn > 0 && gn > 0)
            local = lr * c->lars_coeff * wn / (gn + d * wn + c->epsilon);
        for (int64_t i = 0; i < n; i++) {
            v[p][i] = c->momentum * v[p][i] + local * (gg[i] + d * w[p][i]);
            w[p][i] -= v[p][i];
        }
    }
}

static void run(const fl_backend *k, fl_dtype t, double l2, double eps) {
    fl_rng rng;
    fl_rng_init(&rng, 11, 2);
    fl_optim_config c = {.type = FL_OPTIM_LARS, .momentum = 0.9, .weight_decay = l2,
                         .lars_coeff = 0.001, .lars_weight_decay = 0.0005, .epsilon = eps,
                         .exclude_from_weight_decay = "bn, bias"};
    static double w[NP][MAXN], g[NP][MAXN], v[NP][MAXN];
    size_t es = fl_dtype_size(t);
    fl_param params[NP];
    memset(params, 0, sizeof params);
    for (int p = 0; p < NP; p++) {
        snprintf(params[p].name, sizeof params[p].name, "%s", names[p]);
        fl_tensor_view(&params[p].value, t, 1, &sizes[p], calloc((size_t)sizes[p], es));
        fl_tensor_view(&params[p].grad, t, 1, &sizes[p], calloc((size_t)sizes[p], es));
        params[p].trainable = true;
        for (int64_t i = 0; i < sizes[p]; i++) {
            w[p][i] = p == 3 ? 0 : 2 * fl_rng_uniform_f64(&rng) - 1;
            if (t == FL_DTYPE_F32)
                w[p][i] = (float)w[p][i], ((float *)params[p].value.data)[i] = (float)w[p][i];
            else
                ((double *)params[p].value.data)[i] = w[p][i];
            v[p][i] = 0;
        }
    }
    fl_optim *opt = fl_optim_create(&c, params, NP, t, k);
    CHECK(opt != NULL);
    if (!opt)
        return;
    CHECK(fl_optim_num_state(opt) == NP);
    for (int s = 0; s < STEPS; s++) {
        double lr = 0.1 * (s + 1);
        for (int p = 0; p < NP; p++)
            for (int64_t i = 0; i < sizes[p]; i++) {
                g[p][i] = (float)(0.1 * (2 * fl_rng_uniform_f64(&rng) - 1));
                if (t == FL_DTYPE_F32)
                    ((float *)params[p].grad.data)[i] = (float)g[p][i];
                else
                    ((double *)params[p].grad.data)[i] = g[p][i];
            }
        CHECK_OK(fl_optim_step(opt, lr, NULL));
        ref_step(&c, lr, w, g, v);
    }
    double tol = t == FL_DTYPE_F32 ? 1e-6 : 1e-14;
    for (int p = 0; p < NP; p++) {
        double got[MAXN], vel[MAXN];
        const fl_param *vs = fl_optim_state(opt, p);
        for (int64_t i = 0; i < sizes[p]; i++) {
            got[i] = t == FL_DTYPE_F32 ? ((float *)params[p].value.data)[i]
                                       : ((double *)params[p].value.data)[i];
            vel[i] = t == FL_DTYPE_F32 ? ((float *)vs->value.data)[i]
                                       : ((double *)vs->value.data)[i];
        }
        char label[160];
        snprintf(label, sizeof label, "lars %s [%s %s, l2 %g, eps %g] w", names[p], k->name,
                 fl_dtype_name(t), l2, eps);
        CHECK_CLOSE(label, got, w[p], sizes[p], tol, tol);
        snprintf(label, sizeof label, "lars %s [%s %s, l2 %g, eps %g] v", names[p], k->name,
                 fl_dtype_name(t), l2, eps);
        CHECK_CLOSE(label, vel, v[p], sizes[p], tol, tol);
    }
    /* the trust ratio really acted: the LARS step of the conv weight is far from lr * g */
    CHECK(fabs(v[0][0]) < 0.01 * fabs(v[1][0]) + 1e-3);
    fl_optim_free(opt);
    for (int p = 0; p < NP; p++)
        free(params[p].value.data), free(params[p].grad.data);
}

static void test_errors(void) {
    fl_param p;
    memset(&p, 0, sizeof p);
    fl_optim_config c = {.type = FL_OPTIM_LARS, .momentum = 0.9, .lars_coeff = 0};
    CHECK(fl_optim_create(&c, &p, 0, FL_DTYPE_F32, fl_backend_cpu()) == NULL);
    CHECK_MSG("lars_coeff 0 is not a finite number > 0");
    c.lars_coeff = 0.001;
    c.lars_weight_decay = -1;
    CHECK(fl_optim_create(&c, &p, 0, FL_DTYPE_F32, fl_backend_cpu()) == NULL);
    CHECK_MSG("lars_weight_decay -1");
    c.lars_weight_decay = 0;
    c.epsilon = -1;
    CHECK(fl_optim_create(&c, &p, 0, FL_DTYPE_F32, fl_backend_cpu()) == NULL);
    CHECK_MSG("LARS epsilon -1");
    c.epsilon = 0;
    c.nesterov = true;
    CHECK(fl_optim_create(&c, &p, 0, FL_DTYPE_F32, fl_backend_cpu()) == NULL);
    CHECK_MSG("nesterov needs type momentum");
    c.nesterov = false;
    c.momentum = 1;
    CHECK(fl_optim_create(&c, &p, 0, FL_DTYPE_F32, fl_backend_cpu()) == NULL);
    CHECK_MSG("momentum 1 outside [0, 1)");
}

static void test_names(void) {
    CHECK(fl_optim_name_excluded("layer1.0.bn1.weight", "bn,bias"));
    CHECK(fl_optim_name_excluded("fc.bias", " bn , bias "));
    CHECK(!fl_optim_name_excluded("fc.weight", "bn,bias"));
    CHECK(!fl_optim_name_excluded("fc.weight", ""));
    CHECK(!fl_optim_name_excluded("fc.weight", ",, ,"));
    CHECK(!fl_optim_name_excluded("fc.weight", NULL));
    CHECK(fl_optim_name_excluded("downsample.1.weight", "downsample.1"));
}

/* A table with lars_update_run (as the cuda table has), written here after the contract with
 * the cpu table's sumsq, axpy and scale tensor by tensor: what the optimizer hands it (the
 * runs, the sizes, the decays, the pointers) is then checked against the cpu table's own
 * tensor-by-tensor path, to the bit. The cuda kernel is held to that path on a GPU
 * (test_cuda_backend). */
static fl_backend run_table;
static int run_calls, run_nt[4];
static int64_t run_numel[4][NP];
static double run_d[4][NP];
static void host_lars_run(fl_dtype t, int nt, const int64_t *numel, const double *d, void *w,
                          const void *g, void *v, double lr, double mu, double wd, double coeff,
                          double eps) {
    const fl_backend *c = fl_backend_cpu();
    if (run_calls < 4) {
        run_nt[run_calls] = nt;
        memcpy(run_numel[run_calls], numel, (size_t)nt * sizeof *numel);
        memcpy(run_d[run_calls], d, (size_t)nt * sizeof *d);
    }
    run_calls++;
    size_t es = fl_dtype_size(t), off = 0;
    static double scratch[MAXN];
    for (int k = 0; k < nt; k++) {
        int64_t n = numel[k];
        char *wk = (char *)w + off, *vk = (char *)v + off;
        const char *gk = (const char *)g + off;
        if (wd > 0) {
            memcpy(scratch, gk, (size_t)n * es);
            c->axpy(t, n, wd, wk, scratch);
            gk = (const char *)scratch;
        }
        double local = lr;
        if (d[k] > 0) {
            double wn = sqrt(c->sumsq(t, wk, n)), gn = sqrt(c->sumsq(t, gk, n));
            if (wn > 0 && gn > 0)
                local = lr * coeff * wn / (gn + d[k] * wn + eps);
        }
        c->scale(t, n, mu, vk);
        c->axpy(t, n, local, gk, vk);
        if (d[k] > 0)
            c->axpy(t, n, local * d[k], wk, vk);
        c->axpy(t, n, -1.0, vk, wk);
        off += (size_t)n * es;
    }
}

/* The optimizer over a table with lars_update_run: the network's tensors in one flat block go
 * in one call per step (split: the last tensor's gradient elsewhere, so two runs), each
 * tensor's size and LARS decay (0 for the excluded names), and the bits of the cpu table's
 * tensor-by-tensor path. */
static void test_runs(fl_dtype t, bool split) {
    run_table = *fl_backend_cpu();
    run_table.lars_update_run = host_lars_run;
    fl_optim_config c = {.type = FL_OPTIM_LARS, .momentum = 0.9, .weight_decay = 1e-4,
                         .lars_coeff = 0.001, .lars_weight_decay = 0.0005, .epsilon = 1e-6,
                         .exclude_from_weight_decay = "bn, bias"};
    size_t es = fl_dtype_size(t);
    int64_t total = 0;
    for (int p = 0; p < NP; p++)
        total += sizes[p];
    fl_rng rng;
    fl_rng_init(&rng, 12, split);
    char *w[2], *g[2], *glast = calloc((size_t)sizes[NP - 1], es);
    fl_param params[2][NP];
    for (int k = 0; k < 2; k++) {
        w[k] = calloc((size_t)total, es), g[k] = calloc((size_t)total, es);
        memset(params[k], 0, sizeof params[k]);
    }
    for (int64_t i = 0; i < total; i++)
        for (int k = 0; k < 2; k++) {
            double x = 2 * fl_rng_uniform_f64(&rng) - 1;
            if (t == FL_DTYPE_F32)
                ((float *)w[k])[i] = (float)x;
            else
                ((double *)w[k])[i] = x;
        }
    memcpy(w[1], w[0], (size_t)total * es);
    for (int k = 0; k < 2; k++) {
        size_t off = 0;
        for (int p = 0; p < NP; p++) {
            snprintf(params[k][p].name, sizeof params[k][p].name, "%s", names[p]);
            fl_tensor_view(&params[k][p].value, t, 1, &sizes[p], w[k] + off);
            bool away = split && p == NP - 1;
            fl_tensor_view(&params[k][p].grad, t, 1, &sizes[p], away ? glast : g[k] + off);
            params[k][p].trainable = true;
            off += (size_t)sizes[p] * es;
        }
    }
    fl_optim *plain = fl_optim_create(&c, params[0], NP, t, fl_backend_cpu());
    fl_optim *runs = fl_optim_create(&c, params[1], NP, t, &run_table);
    CHECK(plain && runs);
    for (int s = 0; s < STEPS && plain && runs; s++) {
        for (int64_t i = 0; i < total; i++) {
            double x = 0.1 * (2 * fl_rng_uniform_f64(&rng) - 1);
            if (t == FL_DTYPE_F32)
                ((float *)g[0])[i] = ((float *)g[1])[i] = (float)x;
            else
                ((double *)g[0])[i] = ((double *)g[1])[i] = x;
        }
        if (split) /* both optimizers read the same gradient of the last tensor */
            memcpy(glast, g[0] + (size_t)(total - sizes[NP - 1]) * es,
                   (size_t)sizes[NP - 1] * es);
        run_calls = 0;
        CHECK_OK(fl_optim_step(plain, 0.1 * (s + 1), NULL));
        CHECK_OK(fl_optim_step(runs, 0.1 * (s + 1), NULL));
        CHECK(run_calls == (split ? 2 : 1));
        CHECK(run_nt[0] == (split ? NP - 1 : NP));
        for (int p = 0; p < run_nt[0]; p++) {
            CHECK(run_numel[0][p] == sizes[p]);
            bool excluded = strstr(names[p], "bn") || strstr(names[p], "bias");
            CHECK(run_d[0][p] == (excluded ? 0 : c.lars_weight_decay));
        }
        if (split)
            CHECK(run_nt[1] == 1 && run_numel[1][0] == sizes[NP - 1]);
        CHECK(memcmp(w[0], w[1], (size_t)total * es) == 0);
        CHECK(memcmp(fl_optim_state(plain, 0)->value.data, fl_optim_state(runs, 0)->value.data,
                     (size_t)total * es) == 0);
    }
    fl_optim_free(plain);
    fl_optim_free(runs);
    for (int k = 0; k < 2; k++)
        free(w[k]), free(g[k]);
    free(glast);
}

int main(void) {
    const fl_backend *tables[] = {fl_backend_cpu(), fl_backend_ref()};
    for (int i = 0; i < 2; i++) {
        run(tables[i], FL_DTYPE_F64, 0, 0);
        run(tables[i], FL_DTYPE_F64, 1e-4, 1e-3);
        run(tables[i], FL_DTYPE_F32, 1e-4, 0);
    }
    for (int split = 0; split < 2; split++) {
        test_runs(FL_DTYPE_F32, split);
        test_runs(FL_DTYPE_F64, split);
    }
    test_errors();
    test_names();
    TEST_DONE();
}
