/* test_net_layout.c - which activation layout fl_net_build picks: the backend's preferred one
 * only where every layer reading a spatial activation supports it, NCHW otherwise (a fully
 * connected layer flattening a (C, H, W) activation would read it in the layout's order); and a
 * convolution the backend cannot plan fails the build naming the layer. A backend preferring
 * NHWC is simulated with the cpu table (whose convolution is NCHW only); with oneDNN built, the
 * onednn backend's choices are checked too. */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/status.h"
#include "test.h"

#include <string.h>

static fl_layout prefer_nhwc(fl_dtype t) {
    (void)t;
    return FL_LAYOUT_NHWC;
}

static fl_backend nhwc_cpu;

/* conv (1 -> 2, 3x3, padding 1) on (1, 8, 8), then fc flattening its (2, 8, 8) output */
static fl_net *conv_fc(fl_dtype t, const fl_backend *be) {
    fl_net *net = fl_net_create(t, be);
    fl_conv2d_opts o = {.in_channels = 1, .out_channels = 2, .kh = 3, .kw = 3, .ph = 1, .pw = 1};
    CHECK_OK(fl_net_add(net, fl_conv2d_create("conv", &o)));
    CHECK_OK(fl_net_add(net, fl_fc_create("fc", 2 * 8 * 8, 3, true)));
    return net;
}

int main(void) {
    nhwc_cpu = *fl_backend_cpu();
    nhwc_cpu.name = "nhwc-cpu";
    nhwc_cpu.preferred_layout = prefer_nhwc;
    int64_t img[] = {1, 8, 8}, cifar[] = {3, 16, 16};

    /* an fc reads the spatial activation: NCHW, whatever the backend prefers */
    fl_net *a = conv_fc(FL_DTYPE_F32, &nhwc_cpu);
    CHECK_OK(fl_net_build(a, 3, img, 4, 1));
    CHECK(fl_net_layout(a) == FL_LAYOUT_NCHW);
    fl_net_free(a);

    /* every spatial reader supports NHWC: the preferred layout is taken, and the cpu
     * convolution's refusal of it fails the build, naming the layer */
    fl_net *b = fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, 10, 'A');
    fl_net_set_backend(b, &nhwc_cpu);
    CHECK_RC(fl_net_build(b, 3, cifar, 4, 1), FL_EINVAL);
    CHECK_MSG("conv1: ");
    CHECK_MSG("NCHW only, not NHWC");
    fl_net_free(b);

    /* the cpu backend: NCHW */
    fl_net *c = fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, 10, 'A');
    CHECK_OK(fl_net_build(c, 3, cifar, 4, 1));
    CHECK(fl_net_layout(c) == FL_LAYOUT_NCHW);
    fl_net_free(c);

    const fl_backend *dnn = fl_backend_onednn();
    if (dnn) { /* f32 ResNet: NHWC; f64 (no oneDNN kernels): NCHW; conv + fc: NCHW */
        fl_dtype dts[] = {FL_DTYPE_F32, FL_DTYPE_F64};
        for (int i = 0; i < 2; i++) {
            fl_net *r = fl_model_resnet_cifar(dts[i], 8, 3, 10, 'A');
            fl_net_set_backend(r, dnn);
            CHECK_OK(fl_net_build(r, 3, cifar, 4, 1));
            CHECK(fl_net_layout(r) == (i == 0 ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW));
            fl_net_free(r);
        }
        fl_net *d = conv_fc(FL_DTYPE_F32, dnn);
        CHECK_OK(fl_net_build(d, 3, img, 4, 1));
        CHECK(fl_net_layout(d) == FL_LAYOUT_NCHW);
        fl_net_free(d);
    } else {
        printf("onednn not built: its layout checks left out\n");
    }
    return test_failures ? 1 : 0;
}
