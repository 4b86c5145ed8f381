/* rule.c - the optimizer rules a parameter server applies to its dense blocks and sparse rows
 * (table.h), their defaults and checks, and the id -> server map. One function updates n values
 * in place with the rule's state beside them, so a dense block and a sparse row share it;
 * and the modes' names.
 *
 * Arithmetic. Every rule reads f32 values, computes in double and rounds once when it stores,
 * as the ref backend's kernels do (src/kernels/cpu/ref.c):
 *   SGD:      w = w - lr * (g + wd w)                                   (ref_sgd_update)
 *   Momentum: d = g + wd w; v = mu v + d; w = w - lr * (nesterov ? d + mu v : v), where the w
 *             update uses v before its rounding to f32               (ref_momentum_update)
 * so that a sync parameter server and collective training on the ref backend give the same bits.
 *   Adam (Kingma & Ba 2015, arXiv:1412.6980, as Paddle's adam kernel computes it,
 *   paddle/phi/kernels/funcs/adam_functors.h, AdamFunctor):
 *             b1p *= b1; b2p *= b2 (the beta powers b^t, kept per block or row as f32);
 *             m = b1 m + (1 - b1) d; v = b2 v + (1 - b2) d^2 (d = g + wd w);
 *             lr_t = lr * sqrt(1 - b2p) / (1 - b1p);
 *             w -= lr_t * m / (sqrt(v) + eps * sqrt(1 - b2p))
 *             (the eps * sqrt(1 - b2^t) is phi's, which is PyTorch's eps on the corrected v;
 *             Paddle's PS rule SparseAdamSGDRule, paddle/fluid/distributed/ps/table/
 *             sparse_sgd_rule.cc, adds eps alone: with eps 1e-8 the two differ below f32's
 *             resolution unless v is tiny. Paddle stores the powers already multiplied for the
 *             coming step; here a fresh state holds 1 and the step multiplies first.)
 *   Adagrad:  Paddle's SparseAdaGradSGDRule::UpdateValueWork (sparse_sgd_rule.cc): one g2sum
 *             per row; w -= lr * g * sqrt(g2sum0 / (g2sum0 + g2sum)) with the g2sum from before
 *             the step, then g2sum += mean over the row of g^2. (Paddle divides the pushed
 *             gradient by a show-count scale first; here the caller scales.) epsilon is unused,
 *             as in Paddle's rule.
 *   SUM:      w += g (geo mode: the workers push differences). */
#include "table.h"

#include "fleet/status.h"

#include <math.h>
#include <string.h>

const char *fl_ps_rule_name(fl_ps_rule_type t) {
    switch (t) {
    case FL_PS_RULE_SGD:      return "sgd";
    case FL_PS_RULE_MOMENTUM: return "momentum";
    case FL_PS_RULE_ADAM:     return "adam";
    case FL_PS_RULE_ADAGRAD:  return "adagrad";
    case FL_PS_RULE_SUM:      return "sum";
    }
    return "unknown";
}

void fl_ps_rule_defaults(fl_ps_rule *r, fl_ps_rule_type type) {
    FL_ASSERT(r);
    memset(r, 0, sizeof *r);
    r->type = type;
    switch (type) {
    case FL_PS_RULE_MOMENTUM: /* Paddle's Momentum has no default mu; 0.9 is the usual one */
        r->momentum = 0.9;
        break;
    case FL_PS_RULE_ADAM: /* paddle.optimizer.Adam */
        r->beta1 = 0.9;
        r->beta2 = 0.999;
        r->epsilon = 1e-8;
        break;
    case FL_PS_RULE_ADAGRAD: /* Paddle's SparseAdagradSGDParameter */
        r->epsilon = 1e-6;
        r->initial_g2sum = 3;
        break;
    default:
        break;
    }
}

static bool finite_nonneg(double x) { return isfinite(x) && x >= 0; }

int fl_ps_rule_check(const fl_ps_rule *r, bool sparse) {
    FL_ASSERT(r);
    const char *name = fl_ps_rule_name(r->type);
    const char *kind = sparse ? "sparse" : "dense";
    if (r->type < FL_PS_RULE_SGD || r->type > FL_PS_RULE_SUM)
        return fl_fail(FL_ECONFIG, "ps rule: type %d is none of sgd, momentum, adam, adagrad, sum",
                       (int)r->type);
    if (sparse && r->type == FL_PS_RULE_MOMENTUM)
        return fl_fail(FL_ECONFIG,
                       "ps rule: type momentum cannot serve a sparse table (use sgd, adagrad, "
                       "adam or sum)");
    if (!sparse && r->type == FL_PS_RULE_ADAGRAD)
        return fl_fail(FL_ECONFIG,
                       "ps rule: type adagrad cannot serve a dense table (use sgd, momentum, "
                       "adam or sum)");
    if (r->type == FL_PS_RULE_MOMENTUM) {
        if (!(r->momentum >= 0 && r->momentum < 1))
            return fl_fail(FL_ECONFIG, "ps rule momentum (%s): momentum %g outside [0, 1)", kind,
                           r->momentum);
    } else {
        if (r->momentum != 0)
            return fl_fail(FL_ECONFIG,
                           "ps rule %s (%s): momentum %g given to a rule without momentum (use "
                           "type momentum)",
                           name, kind, r->momentum);
        if (r->nesterov)
            return fl_fail(FL_ECONFIG, "ps rule %s (%s): nesterov needs type momentum", name,
                           kind);
    }
    if (!finite_nonneg(r->weight_decay))
        return fl_fail(FL_ECONFIG,
                       "ps rule %s (%s): weight_decay %g is not a finite number >= 0", name, kind,
                       r->weight_decay);
    if ((r->type == FL_PS_RULE_ADAGRAD || r->type == FL_PS_RULE_SUM) && r->weight_decay != 0)
        return fl_fail(FL_ECONFIG,
                       "ps rule %s (%s): weight_decay %g is not supported by this rule (only "
                       "sgd, momentum and adam decay)",
                       name, kind, r->weight_decay);
    if (r->type == FL_PS_RULE_ADAM) {
        if (!(r->beta1 >= 0 && r->beta1 < 1))
            return fl_fail(FL_ECONFIG, "ps rule adam (%s): beta1 %g outside [0, 1)", kind,
                           r->beta1);
        if (!(r->beta2 >= 0 && r->beta2 < 1))
            return fl_fail(FL_ECONFIG, "ps rule adam (%s): beta2 %g outside [0, 1)", kind,
                           r->beta2);
        if (!(isfinite(r->epsilon) && r->epsilon > 0))
            return fl_fail(FL_ECONFIG, "ps rule adam (%s): epsilon %g is not a finite number > 0",
                           kind, r->epsilon);
    }
    if (r->type == FL_PS_RULE_ADAGRAD) {
        if (!(isfinite(r->initial_g2sum) && r->initial_g2sum > 0))
            return fl_fail(FL_ECONFIG,
                           "ps rule adagrad (%s): initial_g2sum %g is not a finite number > 0",
                           kind, r->initial_g2sum);
        if (!finite_nonneg(r->epsilon))
            return fl_fail(FL_ECONFIG,
                           "ps rule adagrad (%s): epsilon %g is not a finite number >= 0", kind,
                           r->epsilon);
    }
    return FL_OK;
}

int fl_ps_rule_state_per_value(const fl_ps_rule *r) {
    switch (r->type) {
    case FL_PS_RULE_MOMENTUM: return 1;
    case FL_PS_RULE_ADAM:     return 2;
    default:                  return 0;
    }
}

int fl_ps_rule_state_per_row(const fl_ps_rule *r) {
    switch (r->type) {
    case FL_PS_RULE_ADAM:    return 2;
    case FL_PS_RULE_ADAGRAD: return 1;
    default:                 return 0;
    }
}

void fl_ps_rule_state_init(const fl_ps_rule *r, float *state, int64_t n) {
    int64_t len = n * fl_ps_rule_state_per_value(r) + fl_ps_rule_state_per_row(r);
    for (int64_t i = 0; i < len; i++)
        state[i] = 0.0f;
    if (r->type == FL_PS_RULE_ADAM) {
        state[2 * n] = 1.0f;     /* beta1^0 */
        state[2 * n + 1] = 1.0f; /* beta2^0 */
    }
}

static void apply_sgd(double lr, double wd, float *w, const float *g, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double wi = w[i];
        w[i] = (float)(wi - lr * ((double)g[i] + wd * wi));
    }
}

static void apply_momentum(double lr, double mu, double wd, bool nesterov, float *w,
                           const float *g, float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double wi = w[i];
        double d = (double)g[i] + wd * wi;
        double vi = mu * (double)v[i] + d;
        v[i] = (float)vi;
        w[i] = (float)(wi - lr * (nesterov ? d + mu * vi : vi));
    }
}

static void apply_adam(const fl_ps_rule *r, double lr, float *w, const float *g, float *state,
                       int64_t n) {
    float *m = state, *v = state + n, *pow1 = state + 2 * n, *pow2 = state + 2 * n + 1;
    double b1 = r->beta1, b2 = r->beta2, wd = r->weight_decay;
    *pow1 = (float)((double)*pow1 * b1);
    *pow2 = (float)((double)*pow2 * b2);
    double c2 = sqrt(1.0 - (double)*pow2);
    double lr_t = lr * c2 / (1.0 - (double)*pow1);
    double eps = r->epsilon * c2;
    for (int64_t i = 0; i < n; i++) {
        double wi = w[i];
        double d = (double)g[i] + wd * wi;
        double mi = b1 * (double)m[i] + (1.0 - b1) * d;
        double vi = b2 * (double)v[i] + (1.0 - b2) * d * d;
        m[i] = (float)mi;
        v[i] = (float)vi;
        w[i] = (float)(wi - lr_t * (mi / (sqrt(vi) + eps)));
    }
}

static void apply_adagrad(const fl_ps_rule *r, double lr, float *w, const float *g, float *g2sum,
                          int64_t n) {
    double g0 = r->initial_g2sum;
    double ratio = sqrt(g0 / (g0 + (double)*g2sum));
    double add = 0;
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i];
        w[i] = (float)((double)w[i] - lr * gi * ratio);
        add += gi * gi;
    }
    *g2sum = (float)((double)*g2sum + add / (double)n);
}

void fl_ps_rule_apply(const fl_ps_rule *r, double lr, float *w, const float *g, float *state,
                      int64_t n) {
    FL_ASSERT(r && w && g && n >= 0);
    switch (r->type) {
    case FL_PS_RULE_SGD:
        apply_sgd(lr, r->weight_decay, w, g, n);
        break;
    case FL_PS_RULE_MOMENTUM:
        apply_momentum(lr, r->momentum, r->weight_decay, r->nesterov, w, g, state, n);
        break;
    case FL_PS_RULE_ADAM:
        apply_adam(r, lr, w, g, state, n);
        break;
    case FL_PS_RULE_ADAGRAD:
        if (n > 0)
            apply_adagrad(r, lr, w, g, state, n);
        break;
    case FL_PS_RULE_SUM:
        for (int64_t i = 0; i < n; i++)
            w[i] += g[i];
        break;
    }
}

/* splitmix64's finalizer (Steele, Lea & Flood, "Fast splittable pseudorandom number
 * generators", OOPSLA 2014): consecutive ids land on unrelated servers. The sparse tables'
 * index hashes ids with another mixer, so the ids of one server still spread over its index. */
int fl_ps_shard_of(uint64_t id, int nservers) {
    FL_ASSERT(nservers > 0);
    uint64_t z = id + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (int)(z % (uint64_t)nservers);
}

const char *fl_ps_mode_name(fl_ps_mode m) {
    switch (m) {
    case FL_PS_SYNC: return "sync";
    case FL_PS_ASYNC: return "async";
    case FL_PS_GEO: return "geo";
    default: return "?";
    }
}
