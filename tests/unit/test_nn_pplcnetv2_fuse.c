/* test_nn_pplcnetv2_fuse.c - PP-LCNetV2's re-parameterised inference form
 * (fl_model_pplcnetv2_fused, fl_pplcnetv2_fuse): its parameter count at 1000 classes (6,624,232,
 * PaddleClas's published 6.6M; 16,256 buffer values) and names; with random non-trivial batch-norm statistics and
 * affine parameters in the training form, the fused network's inference logits equal the
 * training form's inference logits on random inputs, at 1 x 28 x 28 (small-input stem) and
 * 3 x 96 x 96 (ImageNet's stem: its layers and folds are those of 224 x 224, stage 4 at 3 x 3,
 * at a fifth of the cost): to 1e-4 of the largest logit in f32 (cpu, onednn on NHWC) and to 1e-10 in f64
 * (cpu), and so does the output of every layer the two share (all but the branches), each to
 * the same fraction of its own largest value: in inference at these statistics an untrained
 * PP-LCNetV2 damps a change about tenfold per block (a stage-3 branch moves the logits by
 * 5e-6 of their size), so the layers' outputs are what shows a wrong fold. Mismatched networks and unbuilt ones fail naming the
 * tensor or the state. */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "nn/nn_impl.h" /* the layers' outputs (struct fl_net) */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static fl_rng rng;

static double uni(double lo, double hi) { return lo + (hi - lo) * fl_rng_uniform_f64(&rng); }

static void set(fl_param *p, int64_t i, double v) {
    if (p->value.dtype == FL_DTYPE_F32)
        ((float *)p->value.data)[i] = (float)v;
    else
        ((double *)p->value.data)[i] = v;
}

static double at(const fl_tensor *t, int64_t i) {
    return t->dtype == FL_DTYPE_F32 ? ((const float *)t->data)[i] : ((const double *)t->data)[i];
}

static bool ends(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static double get(const fl_param *p, int64_t i) { return at(&p->value, i); }

/* Gives every batch norm of net (host memory) non-trivial statistics that still fit its
 * activations (so that the logits depend on the input, and on every branch): running
 * statistics from 8 training forwards on x, then the running mean moved by up to 0.3 of the
 * running deviation, the running variance scaled by [0.5, 2], gamma in [0.5, 1.5], beta in
 * [-0.3, 0.3] (init leaves 1 and 0: a fold that ignored them would pass). */
static void randomise_bn(fl_net *net, const fl_tensor *x) {
    const fl_tensor *y;
    for (int s = 0; s < 8; s++)
        CHECK_OK(fl_net_forward(net, x, true, &y));
    for (int i = 0; i < fl_net_num_params(net); i++) {
        fl_param *p = fl_net_param(net, i);
        if (!strstr(p->name, ".bn.") || ends(p->name, ".running_var"))
            continue;
        for (int64_t j = 0; j < p->value.numel; j++) {
            if (ends(p->name, ".weight")) {
                set(p, j, uni(0.5, 1.5));
            } else if (ends(p->name, ".bias")) {
                set(p, j, uni(-0.3, 0.3));
            } else { /* running_mean, then its running_var (the next parameter) */
                char vn[sizeof p->name];
                snprintf(vn, sizeof vn, "%.*s.running_var", (int)(strlen(p->name) - 13), p->name);
                fl_param *v = fl_net_find_param(net, vn);
                FL_ASSERT(v != NULL);
                double sd = sqrt(get(v, j));
                set(p, j, get(p, j) + uni(-0.3, 0.3) * sd);
                set(v, j, get(v, j) * uni(0.5, 2.0));
            }
        }
    }
}

static void test_count_and_names(void) {
    fl_net *net = fl_model_pplcnetv2_fused(FL_DTYPE_F32, 3, false, 1000);
    CHECK(net != NULL);
    if (!net)
        return;
    int64_t s224[] = {3, 224, 224};
    CHECK_OK(fl_net_build(net, 3, s224, 1, 1));
    fprintf(stderr, "pplcnetv2 fused: %lld trainable parameters\n",
            (long long)fl_net_numel(net));
    CHECK(fl_net_numel(net) == 6624232);
    int64_t buffers = 0;
    for (int i = 0; i < fl_net_num_params(net); i++)
        if (!fl_net_param(net, i)->trainable)
            buffers += fl_net_param(net, i)->value.numel;
    fprintf(stderr, "pplcnetv2 fused: %lld batch-norm buffer values\n", (long long)buffers);
    CHECK(buffers == 40832 - 24576); /* less the branches' running statistics */
    CHECK(fabs(round((double)fl_net_numel(net) / 1e5) / 10 - 6.6) < 1e-9);
    fl_param *w = fl_net_find_param(net, "stage3.1.dw_conv.weight");
    fl_param *b = fl_net_find_param(net, "stage3.1.dw_conv.bias");
    CHECK(w && w->value.ndim == 4 && w->value.shape[0] == 512 && w->value.shape[1] == 1 &&
          w->value.shape[2] == 5 && w->value.shape[3] == 5);
    CHECK(b && b->value.numel == 512);
    CHECK(fl_net_find_param(net, "stage4.1.dw_conv.bias") != NULL);
    CHECK(fl_net_find_param(net, "stage1.0.dw_conv.conv.weight") != NULL); /* not a rep block */
    for (int i = 0; i < fl_net_num_params(net); i++)
        CHECK(!strstr(fl_net_param(net, i)->name, "dw_conv_list"));
    fl_net_free(net);
}

/* trained and fused on backend k, dtype t, input (c, hw, hw), batch nb, the small-input stem
 * or ImageNet's: inference logits within tol of the largest */
static void test_same_outputs(const fl_backend *k, fl_dtype t, int64_t c, int64_t hw, int nb,
                              bool small, double tol) {
    int64_t shape[] = {c, hw, hw}, xs[] = {nb, c, hw, hw};
    fl_net *tr = fl_model_pplcnetv2(t, c, small, 10);
    fl_net *fu = fl_model_pplcnetv2_fused(t, c, small, 10);
    CHECK(tr && fu);
    if (!tr || !fu)
        goto out;
    fl_net_set_backend(tr, k);
    fl_net_set_backend(fu, k);
    CHECK_OK(fl_net_build(tr, 3, shape, nb, 11));
    CHECK_OK(fl_net_build(fu, 3, shape, nb, 12)); /* other initial values, all overwritten */
    int64_t n = nb * c * hw * hw;
    void *xd = malloc((size_t)n * fl_dtype_size(t));
    for (int64_t i = 0; i < n; i++) {
        double v = uni(-1, 1);
        if (t == FL_DTYPE_F32)
            ((float *)xd)[i] = (float)v;
        else
            ((double *)xd)[i] = v;
    }
    fl_tensor x;
    fl_tensor_view(&x, t, 4, xs, xd);
    randomise_bn(tr, &x);
    CHECK_OK(fl_pplcnetv2_fuse(fu, tr));
    const fl_tensor *ya = NULL, *yb = NULL;
    double a[64], b[64], big = 0, worst = 0;
    CHECK_OK(fl_net_forward(tr, &x, false, &ya));
    for (int i = 0; ya && i < nb * 10; i++)
        a[i] = at(ya, i), big = fmax(big, fabs(a[i]));
    CHECK_OK(fl_net_forward(fu, &x, false, &yb));
    for (int i = 0; yb && i < nb * 10; i++)
        b[i] = at(yb, i), worst = fmax(worst, fabs(a[i] - b[i]));
    fprintf(stderr, "%s %s %lldx%lldx%lld: largest logit %.4g, largest difference %.3g (%.3g "
            "relative)\n", k->name, t == FL_DTYPE_F32 ? "f32" : "f64", (long long)c,
            (long long)hw, (long long)hw, big, worst, worst / big);
    CHECK(big > 1e-3); /* logits that say something */
    CHECK_CLOSE("fused vs training-form logits", b, a, nb * 10, tol * big, 0);
    /* every layer both have; then a branch of stage3.2 changes in the training form, and the
     * block's output (its SE's pooling, the first layer after the branches that both have)
     * must differ (the fused kernels are what the fused network computes with) */
    double rel = 0;
    int shared = 0;
    const char *at_worst = "";
    for (int i = 0; i < fu->nlayers; i++) {
        int j = 0;
        while (j < tr->nlayers && strcmp(tr->layers[j]->name, fu->layers[i]->name))
            j++;
        if (j == tr->nlayers)
            continue;
        const fl_tensor *p = &fu->out[i], *q = &tr->out[j];
        CHECK(p->numel == q->numel);
        double m = 0, d = 0;
        for (int64_t e = 0; e < q->numel && p->numel == q->numel; e++) {
            m = fmax(m, fabs(at(q, e)));
            d = fmax(d, fabs(at(p, e) - at(q, e)));
        }
        shared++;
        if (m > 0 && d / m > rel)
            rel = d / m, at_worst = fu->layers[i]->name;
        if (!(d <= tol * m))
            fprintf(stderr, "  layer %s: largest difference %.3g of largest value %.3g\n",
                    fu->layers[i]->name, d, m);
        CHECK(d <= tol * m);
    }
    fprintf(stderr, "  %d layers in both, largest relative difference %.3g (%s)\n", shared,
            rel, at_worst);
    CHECK(shared + 2 * 8 == fu->nlayers); /* all but the 8 rep blocks' dw_conv and act */
    fl_param *bw = fl_net_find_param(tr, "stage3.2.dw_conv_list.1.bn.weight");
    int last = 0;
    while (last < tr->nlayers && strcmp(tr->layers[last]->name, "stage3.2.se.avg_pool"))
        last++;
    CHECK(bw != NULL && last < tr->nlayers);
    if (bw && last < tr->nlayers) {
        for (int64_t j = 0; j < bw->value.numel; j++)
            set(bw, j, 3.0);
        const fl_tensor *y2 = NULL;
        CHECK_OK(fl_net_forward(tr, &x, false, &y2));
        const fl_tensor *q = &tr->out[last];
        double m = 0, d = 0;
        for (int i = 0; i < fu->nlayers; i++)
            if (!strcmp(fu->layers[i]->name, "stage3.2.se.avg_pool"))
                for (int64_t e = 0; e < q->numel; e++) {
                    m = fmax(m, fabs(at(q, e)));
                    d = fmax(d, fabs(at(&fu->out[i], e) - at(q, e)));
                }
        fprintf(stderr, "  a stage3.2 branch's gamma set to 3: the block's output moves by %.3g "
                "of its largest value\n", d / m);
        CHECK(d > 100 * tol * m);
    }
    free(xd);
out:
    fl_net_free(tr);
    fl_net_free(fu);
}

static void test_errors(void) {
    int64_t shape[] = {1, 28, 28};
    fl_net *tr = fl_model_pplcnetv2(FL_DTYPE_F32, 1, true, 10);
    fl_net *fu = fl_model_pplcnetv2_fused(FL_DTYPE_F32, 1, true, 10);
    fl_net *other = fl_model_pplcnet(FL_DTYPE_F32, 0.25, 1, true, 10);
    fl_net *wide = fl_model_pplcnetv2_fused(FL_DTYPE_F32, 1, true, 7);
    CHECK(tr && fu && other && wide);
    if (!tr || !fu || !other || !wide)
        goto out;
    CHECK_RC(fl_pplcnetv2_fuse(fu, tr), FL_ESTATE);
    CHECK_MSG("not built");
    CHECK_OK(fl_net_build(tr, 3, shape, 1, 1));
    CHECK_OK(fl_net_build(fu, 3, shape, 1, 1));
    CHECK_OK(fl_net_build(other, 3, shape, 1, 1));
    CHECK_OK(fl_net_build(wide, 3, shape, 1, 1));
    CHECK_RC(fl_pplcnetv2_fuse(fu, other), FL_EINVAL);
    CHECK_MSG("stem.0.conv.weight"); /* pplcnet's stem is conv1: no counterpart */
    CHECK_RC(fl_pplcnetv2_fuse(wide, tr), FL_EINVAL);
    CHECK_MSG("fc.weight");
    /* a training form given as the fused network: its branches have no place */
    CHECK_RC(fl_pplcnetv2_fuse(tr, fu), FL_EINVAL);
    CHECK_MSG("dw_conv");
out:
    fl_net_free(tr);
    fl_net_free(fu);
    fl_net_free(other);
    fl_net_free(wide);
}

int main(void) {
    fl_rng_init(&rng, 36, 2);
    test_count_and_names();
    test_same_outputs(fl_backend_cpu(), FL_DTYPE_F32, 1, 28, 4, true, 1e-4);
    test_same_outputs(fl_backend_cpu(), FL_DTYPE_F64, 1, 28, 4, true, 1e-10);
    /* ImageNet's stem on one image at 96 x 96: the batch's own handling is the 28 x 28 runs'
     * (batch 4); in inference the images do not meet; the layers and folds are those of 224
     * (the fold does not depend on the input size), and the 224 runs were most of this test's
     * time */
    test_same_outputs(fl_backend_cpu(), FL_DTYPE_F32, 3, 96, 1, false, 1e-4);
    if (fl_backend_onednn()) {
        test_same_outputs(fl_backend_onednn(), FL_DTYPE_F32, 1, 28, 4, true, 1e-4);
        test_same_outputs(fl_backend_onednn(), FL_DTYPE_F32, 3, 96, 1, false, 1e-4);
    }
    test_errors();
    TEST_DONE();
}
