/* test_conv.c - conv2d forward against a direct seven-loop convolution (stride, padding,
 * dilation, groups, bias, the 1x1 path, more images than slots), with both kernel tables and
 * both dtypes; bit-identical results with 1 and 2 threads; im2col/col2im adjointness; shape
 * errors naming the layer. */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "kernels/cpu/backend_private.h"
#include "test.h"

static fl_rng rng;

/* y[b][o][oy][ox] = bias[o] + sum over c in o's group, i, j of
 *   w[o][c - g0][i][j] x[b][c][oy sh - ph + i dh][ox sw - pw + j dw] (0 outside) */
static void direct_conv(const fl_conv2d_opts *o, int64_t b, int64_t h, int64_t w_,
                        const double *x, const double *w, const double *bias, int64_t oh,
                        int64_t ow, double *y) {
    int64_t icg = o->in_channels / o->groups, ocg = o->out_channels / o->groups;
    for (int64_t n = 0; n < b; n++)
        for (int64_t oc = 0; oc < o->out_channels; oc++)
            for (int64_t oy = 0; oy < oh; oy++)
                for (int64_t ox = 0; ox < ow; ox++) {
                    double s = bias ? bias[oc] : 0;
                    int64_t g0 = oc / ocg * icg;
                    for (int64_t c = 0; c < icg; c++)
                        for (int64_t i = 0; i < o->kh; i++)
                            for (int64_t j = 0; j < o->kw; j++) {
                                int64_t iy = oy * o->sh - o->ph + i * o->dh;
                                int64_t ix = ox * o->sw - o->pw + j * o->dw;
                                if (iy < 0 || iy >= h || ix < 0 || ix >= w_)
                                    continue;
                                s += w[((oc * icg + c) * o->kh + i) * o->kw + j] *
                                     x[((n * o->in_channels + g0 + c) * h + iy) * w_ + ix];
                            }
                    y[((n * o->out_channels + oc) * oh + oy) * ow + ox] = s;
                }
}

static void check_conv(const char *what, const fl_backend *k, fl_dtype t, fl_conv2d_opts o,
                       int64_t b, int64_t h, int64_t w) {
    o.sh = o.sh ? o.sh : 1, o.sw = o.sw ? o.sw : 1, o.dh = o.dh ? o.dh : 1;
    o.dw = o.dw ? o.dw : 1, o.groups = o.groups ? o.groups : 1;
    char label[160];
    snprintf(label, sizeof label, "%s [%s %s]", what, k->name, fl_dtype_name(t));
    fl_net *net = fl_net_create(t, k);
    CHECK_OK(fl_net_add(net, fl_conv2d_create("conv", &o)));
    int64_t in_shape[] = {o.in_channels, h, w};
    CHECK_OK(fl_net_build(net, 3, in_shape, b, 5));
    int64_t out[3];
    fl_net_out_shape(net, out);
    int64_t oh = out[1], ow = out[2];
    int64_t nx = b * o.in_channels * h * w, ny = b * o.out_channels * oh * ow;
    double *xd = malloc((size_t)nx * sizeof *xd), *yd = malloc((size_t)ny * sizeof *yd);
    double *got = malloc((size_t)ny * sizeof *got);
    void *xt = malloc((size_t)nx * 8);
    for (int64_t i = 0; i < nx; i++) {
        xd[i] = 2 * fl_rng_uniform_f64(&rng) - 1;
        if (t == FL_DTYPE_F32)
            xd[i] = (float)xd[i], ((float *)xt)[i] = (float)xd[i];
        else
            ((double *)xt)[i] = xd[i];
    }
    fl_param *wp = fl_net_find_param(net, "conv.weight");
    int64_t nw = wp->value.numel;
    double *wd = malloc((size_t)nw * sizeof *wd), bd[64];
    for (int64_t i = 0; i < nw; i++)
        wd[i] = t == FL_DTYPE_F32 ? ((float *)wp->value.data)[i] : ((double *)wp->value.data)[i];
    if (o.bias) {
        fl_param *bp = fl_net_find_param(net, "conv.bias");
        for (int64_t i = 0; i < o.out_channels; i++) { // init leaves 0: give it values
            bd[i] = (float)(fl_rng_uniform_f64(&rng) - 0.5);
            if (t == FL_DTYPE_F32)
                ((float *)bp->value.data)[i] = (float)bd[i];
            else
                ((double *)bp->value.data)[i] = bd[i];
        }
    }
    direct_conv(&o, b, h, w, xd, wd, o.bias ? bd : NULL, oh, ow, yd);
    fl_tensor x;
    fl_tensor_view(&x, t, 4, (int64_t[]){b, o.in_channels, h, w}, xt);
    const fl_tensor *y = NULL;
    CHECK_OK(fl_net_forward(net, &x, true, &y));
    CHECK(y && y->numel == ny);
    for (int64_t i = 0; y && i < ny; i++)
        got[i] = t == FL_DTYPE_F32 ? ((float *)y->data)[i] : ((double *)y->data)[i];
    double tol = t == FL_DTYPE_F32 ? 1e-5 : 1e-12;
    CHECK_CLOSE(label, got, yd, ny, tol, tol);
    free(xd), free(yd), free(got), free(xt), free(wd);
    fl_net_free(net);
}

static void test_forward(const fl_backend *k, fl_dtype t) {
    check_conv("3x3 pad 1", k, t, (fl_conv2d_opts){.in_channels = 3, .out_channels = 4, .kh = 3,
               .kw = 3, .ph = 1, .pw = 1}, 2, 7, 6);
    check_conv("3x3 stride 2 pad 1 bias", k, t, (fl_conv2d_opts){.in_channels = 4,
               .out_channels = 5, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1,
               .bias = true}, 3, 9, 8);
    check_conv("5x3 stride (1,3) pad (2,0) dilation (2,1)", k, t, (fl_conv2d_opts){
               .in_channels = 2, .out_channels = 3, .kh = 5, .kw = 3, .sw = 3, .ph = 2,
               .dh = 2}, 2, 9, 10);
    check_conv("groups 2 bias", k, t, (fl_conv2d_opts){.in_channels = 4, .out_channels = 6,
               .kh = 3, .kw = 3, .ph = 1, .pw = 1, .groups = 2, .bias = true}, 2, 5, 5);
    check_conv("depthwise (groups = channels) stride 2", k, t, (fl_conv2d_opts){
               .in_channels = 3, .out_channels = 3, .kh = 3, .kw = 3, .sh = 2, .sw = 2,
               .groups = 3}, 2, 7, 7);
    check_conv("1x1 (gemm per image) bias", k, t, (fl_conv2d_opts){.in_channels = 5,
               .out_channels = 7, .kh = 1, .kw = 1, .bias = true}, 3, 4, 5);
    check_conv("1x1 stride 2 (im2col path)", k, t, (fl_conv2d_opts){.in_channels = 5,
               .out_channels = 4, .kh = 1, .kw = 1, .sh = 2, .sw = 2}, 2, 5, 6);
    check_conv("7x7 stride 2 pad 3 (resnet stem)", k, t, (fl_conv2d_opts){.in_channels = 3,
               .out_channels = 4, .kh = 7, .kw = 7, .sh = 2, .sw = 2, .ph = 3, .pw = 3}, 1, 16,
               16);
    check_conv("kernel = image", k, t, (fl_conv2d_opts){.in_channels = 2, .out_channels = 2,
               .kh = 4, .kw = 3}, 2, 4, 3);
}

/* <im2col(x), c> == <x, col2im(c)> for random x, c: col2im is im2col's adjoint */
static void test_adjoint(void) {
    fl_conv_geom g = {.c = 3, .h = 6, .w = 7, .kh = 3, .kw = 2, .sh = 2, .sw = 1, .ph = 1,
                      .pw = 2, .dh = 1, .dw = 3};
    CHECK(fl_conv_geom_out(&g));
    int64_t nx = g.c * g.h * g.w, ld = g.oh * g.ow + 3, nc = g.c * g.kh * g.kw * ld;
    double *x = malloc((size_t)nx * 8), *x2 = malloc((size_t)nx * 8);
    double *c = calloc((size_t)nc, 8), *c2 = calloc((size_t)nc, 8);
    for (int64_t i = 0; i < nx; i++)
        x[i] = fl_rng_uniform_f64(&rng);
    for (int64_t i = 0; i < nc; i++)
        c[i] = i % ld < g.oh * g.ow ? fl_rng_uniform_f64(&rng) : 0;
    cpu_im2col(FL_DTYPE_F64, &g, x, c2, ld);
    cpu_col2im(FL_DTYPE_F64, &g, c, ld, x2);
    double a = 0, b = 0;
    for (int64_t i = 0; i < nc; i++)
        a += c2[i] * c[i];
    for (int64_t i = 0; i < nx; i++)
        b += x[i] * x2[i];
    CHECK_NEAR(a, b, 1e-10);
    free(x), free(x2), free(c), free(c2);
    fl_conv_geom bad = {.c = 1, .h = 2, .w = 2, .kh = 3, .kw = 1, .sh = 1, .sw = 1, .dh = 1,
                        .dw = 1};
    CHECK(!fl_conv_geom_out(&bad));
}

/* forward output and gradients are bit-identical with 1 and 2 threads (fixed image slots) */
static void test_threads(void) {
    enum { B = 13, IC = 8, OC = 16, OC2 = 32, S = 32 }; /* above conv2d.c's PAR_MACS */
    float *res[2][2];
    fl_conv2d_opts o = {.in_channels = IC, .out_channels = OC, .kh = 3, .kw = 3, .ph = 1,
                        .pw = 1, .bias = true};
    fl_rng r;
    for (int t = 0; t < 2; t++) {
        fl_kernels_set_threads(t + 1);
        fl_rng_init(&r, 1, 1);
        fl_net *net = fl_net_create(FL_DTYPE_F32, NULL);
        CHECK_OK(fl_net_add(net, fl_conv2d_create("conv", &o)));
        CHECK_OK(fl_net_add(net, fl_conv2d_create("conv1x1", &(fl_conv2d_opts){
                 .in_channels = OC, .out_channels = OC2, .kh = 1, .kw = 1})));
        CHECK_OK(fl_net_build(net, 3, (int64_t[]){IC, S, S}, B, 3));
        fl_tensor *x = fl_tensor_create(FL_DTYPE_F32, 4, (int64_t[]){B, IC, S, S});
        fl_tensor *dy = fl_tensor_create(FL_DTYPE_F32, 4, (int64_t[]){B, OC2, S, S});
        for (int64_t i = 0; i < x->numel; i++)
            ((float *)x->data)[i] = fl_rng_uniform(&r) - 0.5f;
        for (int64_t i = 0; i < dy->numel; i++)
            ((float *)dy->data)[i] = fl_rng_uniform(&r) - 0.5f;
        const fl_tensor *y;
        CHECK_OK(fl_net_forward(net, x, true, &y));
        CHECK_OK(fl_net_backward(net, dy, NULL, NULL));
        res[t][0] = malloc((size_t)y->numel * 4);
        memcpy(res[t][0], y->data, (size_t)y->numel * 4);
        res[t][1] = malloc((size_t)fl_net_numel(net) * 4);
        memcpy(res[t][1], fl_net_flat_grads(net), (size_t)fl_net_numel(net) * 4);
        fl_tensor_free(x), fl_tensor_free(dy);
        if (t == 1) {
            CHECK(memcmp(res[0][0], res[1][0], (size_t)y->numel * 4) == 0);
            CHECK(memcmp(res[0][1], res[1][1], (size_t)fl_net_numel(net) * 4) == 0);
        }
        fl_net_free(net);
    }
    fl_kernels_set_threads(0);
    for (int t = 0; t < 2; t++)
        free(res[t][0]), free(res[t][1]);
}

/* Backward through two bias-free convolutions a then b, y = b(a(x)): y is linear in each
 * weight, so sum(dy y) = sum(dW_a W_a) = sum(dW_b W_b); this checks dW of both and dx of b
 * (which dW_a is made from) on column matrices built in several tiles of rows, geometries
 * too big for the finite-difference check. */
static void check_backward_identity(const char *what, fl_conv2d_opts a, fl_conv2d_opts b,
                                    int64_t batch, int64_t h, int64_t w) {
    fl_net *net = fl_net_create(FL_DTYPE_F64, fl_backend_cpu());
    CHECK_OK(fl_net_add(net, fl_conv2d_create("a", &a)));
    CHECK_OK(fl_net_add(net, fl_conv2d_create("b", &b)));
    CHECK_OK(fl_net_build(net, 3, (int64_t[]){a.in_channels, h, w}, batch, 9));
    int64_t out[3];
    fl_net_out_shape(net, out);
    fl_tensor *x = fl_tensor_create(FL_DTYPE_F64, 4, (int64_t[]){batch, a.in_channels, h, w});
    fl_tensor *dy = fl_tensor_create(FL_DTYPE_F64, 4, (int64_t[]){batch, out[0], out[1], out[2]});
    for (int64_t i = 0; i < x->numel; i++)
        ((double *)x->data)[i] = fl_rng_uniform(&rng) - 0.5;
    for (int64_t i = 0; i < dy->numel; i++)
        ((double *)dy->data)[i] = fl_rng_uniform(&rng) - 0.5;
    const fl_tensor *y;
    CHECK_OK(fl_net_forward(net, x, true, &y));
    CHECK_OK(fl_net_backward(net, dy, NULL, NULL));
    double ref = 0;
    for (int64_t i = 0; i < y->numel; i++)
        ref += ((const double *)y->data)[i] * ((const double *)dy->data)[i];
    for (int p = 0; p < 2; p++) {
        const fl_param *pp = fl_net_param(net, p);
        double s = 0;
        for (int64_t i = 0; i < pp->value.numel; i++)
            s += ((const double *)pp->value.data)[i] * ((const double *)pp->grad.data)[i];
        if (!(fabs(s - ref) <= 1e-9 * (1 + fabs(ref))))
            fprintf(stderr, "%s: sum(dW W) of %s %.12g, sum(dy y) %.12g\n", what,
                    p ? "b" : "a", s, ref);
        CHECK(fabs(s - ref) <= 1e-9 * (1 + fabs(ref)));
    }
    fl_tensor_free(x), fl_tensor_free(dy);
    fl_net_free(net);
}

static void test_errors(void) {
    fl_conv2d_opts o = {.in_channels = 4, .out_channels = 6, .kh = 3, .kw = 3, .groups = 4};
    CHECK(fl_conv2d_create("c", &o) == NULL);
    CHECK_MSG("groups 4 must divide");
    o.groups = 1;
    o.kh = 0;
    CHECK(fl_conv2d_create("c", &o) == NULL);
    CHECK_MSG("c: conv2d needs");
    o.kh = 5;
    fl_net *net = fl_net_create(FL_DTYPE_F32, NULL);
    CHECK_OK(fl_net_add(net, fl_conv2d_create("conv7", &o)));
    CHECK_RC(fl_net_build(net, 3, (int64_t[]){4, 4, 8}, 2, 1), FL_ESHAPE);
    CHECK_MSG("conv7: a 5x3 kernel");
    fl_net_free(net);
    net = fl_net_create(FL_DTYPE_F32, NULL);
    CHECK_OK(fl_net_add(net, fl_conv2d_create("conv8", &o)));
    CHECK_RC(fl_net_build(net, 3, (int64_t[]){3, 9, 9}, 2, 1), FL_ESHAPE);
    CHECK_MSG("conv8: input (3, 9, 9) is not (4, H, W)");
    fl_net_free(net);
}

int main(void) {
    fl_rng_init(&rng, 7, 3);
    const fl_backend *tables[] = {fl_backend_cpu(), fl_backend_ref()};
    for (int i = 0; i < 2; i++) {
        test_forward(tables[i], FL_DTYPE_F32);
        test_forward(tables[i], FL_DTYPE_F64);
    }
    /* more images than slots (8): uneven slots of 1 and 2 images */
    check_conv("3x3 batch 11", fl_backend_cpu(), FL_DTYPE_F32,
               (fl_conv2d_opts){.in_channels = 3, .out_channels = 8, .kh = 3, .kw = 3, .ph = 1,
                                .pw = 1, .bias = true}, 11, 12, 10);
    /* column matrices built a few rows at a time (64 channels: a 576-row column matrix; on
     * 32-wide images also the contiguous-copy im2col), both dtypes */
    for (int t = 0; t < 2; t++) {
        fl_dtype dt = t ? FL_DTYPE_F64 : FL_DTYPE_F32;
        check_conv("3x3 pad 1, 32 wide bias", fl_backend_cpu(), dt,
                   (fl_conv2d_opts){.in_channels = 3, .out_channels = 5, .kh = 3, .kw = 3,
                                    .ph = 1, .pw = 1, .bias = true}, 2, 5, 32);
        check_conv("3x3 pad 1, 64 channels (column matrix in tiles)", fl_backend_cpu(), dt,
                   (fl_conv2d_opts){.in_channels = 64, .out_channels = 8, .kh = 3, .kw = 3,
                                    .ph = 1, .pw = 1}, 2, 12, 16);
        check_conv("3x3 stride 2 pad 1, 64 channels (tiles)", fl_backend_cpu(), dt,
                   (fl_conv2d_opts){.in_channels = 64, .out_channels = 4, .kh = 3, .kw = 3,
                                    .sh = 2, .sw = 2, .ph = 1, .pw = 1}, 2, 20, 20);
    }
    fl_conv2d_opts c3 = {.in_channels = 64, .out_channels = 64, .kh = 3, .kw = 3, .ph = 1,
                         .pw = 1};
    fl_conv2d_opts s2 = c3;
    s2.sh = s2.sw = 2;
    check_backward_identity("64 channels, 32 wide", c3, c3, 2, 6, 32);
    check_backward_identity("64 channels, 16 wide", c3, c3, 3, 7, 16);
    check_backward_identity("stride 2 after stride 1", c3, s2, 2, 9, 16);
    test_threads();
    test_adjoint();
    test_errors();
    TEST_DONE();
}
