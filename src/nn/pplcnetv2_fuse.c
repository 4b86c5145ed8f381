/* pplcnetv2_fuse.c - PP-LCNetV2's re-parameterisation for inference (fl_pplcnetv2_fuse): the
 * parameters of the fused network (fl_model_pplcnetv2_fused) from those of a trained one. As
 * PaddleClas's RepDepthwiseSeparable.rep() (ppcls/arch/backbone/legendary_models/
 * pp_lcnet_v2.py: _fuse_bn_tensor, _pad_tensor, _get_equivalent_kernel_bias), after RepVGG
 * (Ding et al. 2021, arXiv:2101.03697, sec. 3.3): a branch conv(x, W) then batch norm with
 * running statistics is conv(x, W t) + (beta - mean t), t = gamma / sqrt(var + eps) per
 * channel; the branches (kernels k, k - 2, .., 1, one stride, centred padding) share the
 * output grid, so a smaller kernel zero-padded to k x k gives the same conv, and the sum of
 * the branches is one conv with the summed kernels and biases. PaddleClas's blocks have no
 * identity (BN-only) branch, so there is none to fold here. The arithmetic is on the host in
 * double; the values go through the host with the backend's copies. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    fl_net *net;
    void   *tmp; /* host bytes of the largest parameter */
} side;

/* p's values (net's backend memory) into h as doubles */
static void get(const side *sd, const fl_param *p, double *h) {
    const fl_backend *k = fl_net_backend(sd->net);
    int64_t n = p->value.numel;
    bool f32 = p->value.dtype == FL_DTYPE_F32;
    k->copy(sd->tmp, p->value.data, (size_t)n * fl_dtype_size(p->value.dtype),
            k->host_memory ? FL_COPY_H2H : FL_COPY_D2H, NULL);
    k->stream_sync(NULL);
    for (int64_t i = 0; i < n; i++)
        h[i] = f32 ? (double)((const float *)sd->tmp)[i] : ((const double *)sd->tmp)[i];
}

/* p's values (net's backend memory) = h */
static void put(const side *sd, fl_param *p, const double *h) {
    const fl_backend *k = fl_net_backend(sd->net);
    int64_t n = p->value.numel;
    bool f32 = p->value.dtype == FL_DTYPE_F32;
    for (int64_t i = 0; i < n; i++) {
        if (f32)
            ((float *)sd->tmp)[i] = (float)h[i];
        else
            ((double *)sd->tmp)[i] = h[i];
    }
    k->copy(p->value.data, sd->tmp, (size_t)n * fl_dtype_size(p->value.dtype),
            k->host_memory ? FL_COPY_H2H : FL_COPY_H2D, NULL);
    k->stream_sync(NULL);
}

/* trained's parameter called name (NULL if none, without a message), marked used */
static fl_param *find(fl_net *trained, bool *used, const char *name) {
    for (int i = 0; i < fl_net_num_params(trained); i++) {
        fl_param *p = fl_net_param(trained, i);
        if (!strcmp(p->name, name)) {
            used[i] = true;
            return p;
        }
    }
    return NULL;
}

/* trained's parameter "<prefix>.<suffix>", as find */
static fl_param *take(fl_net *trained, bool *used, const char *prefix, const char *suffix) {
    char name[200];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    return find(trained, used, name);
}

static bool same_shape(const fl_param *a, const fl_param *b) {
    return a->value.ndim == b->value.ndim &&
           !memcmp(a->value.shape, b->value.shape, (size_t)a->value.ndim * sizeof(int64_t));
}

/* The rep block `block`'s fused kernel w (C, 1, K, K) and bias (C) from its branches
 * "<block>.dw_conv_list.<j>" of trained; hw, hb, h0 host scratch of the largest parameter's
 * size each, h1 of 4 times that. */
static int fold(side *fs, side *ts, bool *used, const char *block, fl_param *w, fl_param *bias,
                double *hw, double *hb, double *h0, double *h1) {
    int64_t c = w->value.shape[0], kk = w->value.shape[2];
    if (w->value.ndim != 4 || w->value.shape[1] != 1 || w->value.shape[3] != kk ||
        bias->value.numel != c)
        return fl_fail(FL_EINVAL, "pplcnetv2 fuse: %s is not a depthwise kernel with its bias",
                       w->name);
    memset(hw, 0, (size_t)(c * kk * kk) * sizeof *hw);
    memset(hb, 0, (size_t)c * sizeof *hb);
    int j = 0;
    for (;; j++) {
        char br[160];
        snprintf(br, sizeof br, "%s.dw_conv_list.%d", block, j);
        fl_param *cw = take(ts->net, used, br, "conv.weight");
        if (!cw)
            break;
        fl_param *bn[4] = {take(ts->net, used, br, "bn.weight"), take(ts->net, used, br, "bn.bias"),
                           take(ts->net, used, br, "bn.running_mean"),
                           take(ts->net, used, br, "bn.running_var")};
        int64_t kb = cw->value.ndim == 4 ? cw->value.shape[2] : 0;
        if (kb < 1 || cw->value.shape[0] != c || cw->value.shape[1] != 1 ||
            cw->value.shape[3] != kb || kb > kk || (kk - kb) % 2)
            return fl_fail(FL_EINVAL, "pplcnetv2 fuse: %s does not fit %s (%lld x 1 x %lld x "
                           "%lld)", cw->name, w->name, (long long)c, (long long)kk,
                           (long long)kk);
        for (int i = 0; i < 4; i++)
            if (!bn[i] || bn[i]->value.numel != c)
                return fl_fail(FL_EINVAL, "pplcnetv2 fuse: branch %s has no batch norm of %lld "
                               "channels", br, (long long)c);
        double *g = h1, *beta = h1 + c, *mean = h1 + 2 * c, *var = h1 + 3 * c;
        for (int i = 0; i < 4; i++)
            get(ts, bn[i], h1 + i * c);
        get(ts, cw, h0);
        int64_t pad = (kk - kb) / 2;
        for (int64_t ch = 0; ch < c; ch++) {
            double t = g[ch] / sqrt(var[ch] + NN_BN_EPS);
            for (int64_t u = 0; u < kb; u++)
                for (int64_t v = 0; v < kb; v++)
                    hw[(ch * kk + u + pad) * kk + v + pad] += h0[(ch * kb + u) * kb + v] * t;
            hb[ch] += beta[ch] - mean[ch] * t;
        }
    }
    if (j == 0)
        return fl_fail(FL_EINVAL, "pplcnetv2 fuse: %s has no branches %s.dw_conv_list.* in the "
                       "training form", w->name, block);
    put(fs, w, hw);
    put(fs, bias, hb);
    return FL_OK;
}

int fl_pplcnetv2_fuse(fl_net *fused, fl_net *trained) {
    FL_ASSERT(fused && trained);
    if (!fl_net_flat_params(fused) || !fl_net_flat_params(trained))
        return fl_fail(FL_ESTATE, "pplcnetv2 fuse: the %s network is not built",
                       fl_net_flat_params(fused) ? "trained" : "fused");
    int nf = fl_net_num_params(fused), nt = fl_net_num_params(trained);
    int64_t big = 4;
    for (int i = 0; i < nf; i++)
        if (fl_net_param(fused, i)->value.numel > big)
            big = fl_net_param(fused, i)->value.numel;
    for (int i = 0; i < nt; i++)
        if (fl_net_param(trained, i)->value.numel > big)
            big = fl_net_param(trained, i)->value.numel;
    bool *used = calloc((size_t)nt + 1, sizeof *used);
    double *h = malloc((size_t)(7 * big) * sizeof *h);
    side fs = {fused, malloc((size_t)big * sizeof(double))};
    side ts = {trained, malloc((size_t)big * sizeof(double))};
    int rc = FL_OK;
    if (!used || !h || !fs.tmp || !ts.tmp) {
        rc = fl_fail(FL_ENOMEM, "pplcnetv2 fuse: out of memory for %lld values",
                     (long long)big);
        goto out;
    }
    for (int i = 0; i < nf && rc >= 0; i++) {
        fl_param *p = fl_net_param(fused, i);
        size_t len = strlen(p->name);
        const char *suffix = ".dw_conv.weight";
        size_t sl = strlen(suffix);
        fl_param *q = find(trained, used, p->name);
        if (q) {
            if (!same_shape(p, q)) {
                char a[64], b[64];
                rc = fl_fail(FL_EINVAL, "pplcnetv2 fuse: %s is %s in the fused network, %s in "
                             "the trained one", p->name,
                             fl_shape_str(p->value.ndim, p->value.shape, a, sizeof a),
                             fl_shape_str(q->value.ndim, q->value.shape, b, sizeof b));
                break;
            }
            get(&ts, q, h);
            put(&fs, p, h);
            continue;
        }
        /* a rep block's fused kernel: "<block>.dw_conv.weight", then its bias */
        char block[128];
        fl_param *bias = i + 1 < nf ? fl_net_param(fused, i + 1) : NULL;
        if (len <= sl || strcmp(p->name + len - sl, suffix) || len - sl >= sizeof block) {
            rc = fl_fail(FL_EINVAL, "pplcnetv2 fuse: the fused network's %s has no counterpart "
                         "in the trained network (not a PP-LCNetV2 pair?)", p->name);
            break;
        }
        memcpy(block, p->name, len - sl);
        block[len - sl] = '\0';
        char want[160];
        snprintf(want, sizeof want, "%s.dw_conv.bias", block);
        if (!bias || strcmp(bias->name, want)) {
            rc = fl_fail(FL_EINVAL, "pplcnetv2 fuse: %s has no bias %s after it", p->name, want);
            break;
        }
        rc = fold(&fs, &ts, used, block, p, bias, h, h + big, h + 2 * big, h + 3 * big);
        i++; /* the bias is set */
    }
    for (int j = 0; j < nt && rc >= 0; j++)
        if (!used[j])
            rc = fl_fail(FL_EINVAL, "pplcnetv2 fuse: the trained network's %s has no place in "
                         "the fused network (not a PP-LCNetV2 pair?)",
                         fl_net_param(trained, j)->name);
out:
    free(fs.tmp);
    free(ts.tmp);
    free(h);
    free(used);
    return rc;
}
