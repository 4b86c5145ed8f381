/* test_lars.c - LARS momentum against a hand-written float64 reference of Paddle's
 * lars_momentum kernel (trust ratio, excluded names with a plain momentum step, zero weights,
 * L2 decay folded into the gradient, epsilon), with both kernel tables and both dtypes; the
 * name-fragment matching; configuration errors. */
#include "fleet/backend.h"
#include "fleet/optim.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

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

int main(void) {
    const fl_backend *tables[] = {fl_backend_cpu(), fl_backend_ref()};
    for (int i = 0; i < 2; i++) {
        run(tables[i], FL_DTYPE_F64, 0, 0);
        run(tables[i], FL_DTYPE_F64, 1e-4, 1e-3);
        run(tables[i], FL_DTYPE_F32, 1e-4, 0);
    }
    test_errors();
    test_names();
    TEST_DONE();
}
