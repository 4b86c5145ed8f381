/* test_backend_staging.c - a backend whose memory is not the host's: a copy of the cpu table
 * with host_memory false and copies counted, standing in for a device. The network must
 * initialise its parameters through a host copy (one host-to-device copy at build) and then
 * train exactly as on the cpu backend: a CIFAR ResNet-8 with dropout-free option-A blocks and
 * the seed MLP, three Momentum steps each, bit-identical parameters. */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/optim.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#include <string.h>

static fl_backend fake;
static int copies[4]; /* by fl_copy_kind */

static void fake_copy(void *dst, const void *src, size_t bytes, fl_copy_kind kind,
                      fl_stream *s) {
    copies[kind]++;
    fl_backend_cpu()->copy(dst, src, bytes, kind, s);
}

static const fl_backend *fake_device(void) {
    fake = *fl_backend_cpu();
    fake.name = "fake-device";
    fake.host_memory = false;
    fake.copy = fake_copy;
    return &fake;
}

/* three Momentum steps of net on fixed data; returns the flat parameters (caller frees) */
static float *train(fl_net *net, int in_ndim, const int64_t *in_shape, int64_t classes) {
    int64_t b = 8;
    CHECK_OK(fl_net_build(net, in_ndim, in_shape, b, 7));
    fl_optim_config oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9, .weight_decay = 1e-4};
    fl_optim *opt = fl_optim_create(&oc, fl_net_param(net, 0), fl_net_num_params(net),
                                    FL_DTYPE_F32, fl_net_backend(net));
    int64_t xs[FL_MAX_DIMS] = {b};
    memcpy(xs + 1, in_shape, (size_t)in_ndim * sizeof *in_shape);
    fl_tensor *x = fl_tensor_create(FL_DTYPE_F32, in_ndim + 1, xs);
    fl_tensor *probs = fl_tensor_create(FL_DTYPE_F32, 2, (int64_t[]){b, classes});
    int32_t labels[8];
    fl_rng r;
    fl_rng_init(&r, 5, 0);
    for (int64_t i = 0; i < x->numel; i++)
        ((float *)x->data)[i] = 2 * fl_rng_uniform(&r) - 1;
    for (int i = 0; i < 8; i++)
        labels[i] = (int32_t)fl_rng_below(&r, (uint64_t)classes);
    const fl_backend *k = fl_net_backend(net);
    for (int step = 0; step < 3; step++) {
        const fl_tensor *logits;
        double loss;
        CHECK_OK(fl_net_forward(net, x, true, &logits));
        CHECK_OK(fl_softmax_xent_forward(k, logits, labels, probs, &loss));
        CHECK_OK(fl_softmax_xent_backward(k, probs, labels, probs));
        CHECK_OK(fl_net_backward(net, probs, NULL, NULL));
        CHECK_OK(fl_optim_step(opt, 0.05, NULL));
    }
    int64_t n = fl_net_numel(net);
    float *out = malloc((size_t)n * sizeof *out);
    memcpy(out, fl_net_flat_params(net), (size_t)n * sizeof *out);
    fl_tensor_free(x);
    fl_tensor_free(probs);
    fl_optim_free(opt);
    return out;
}

static void same_training(fl_net *(*make)(void), int in_ndim, const int64_t *in_shape,
                          int64_t classes, const char *what) {
    fl_net *a = make(), *b = make();
    fl_net_set_backend(b, fake_device());
    memset(copies, 0, sizeof copies);
    float *pa = train(a, in_ndim, in_shape, classes);
    int h2d = copies[FL_COPY_H2D];
    float *pb = train(b, in_ndim, in_shape, classes);
    int64_t n = fl_net_numel(a);
    CHECK(n > 0 && n == fl_net_numel(b));
    CHECK(h2d == 0);                          /* the cpu backend copies nothing to initialise */
    CHECK(copies[FL_COPY_H2D] - h2d == 1);     /* the device: its initial values, once */
    if (memcmp(pa, pb, (size_t)n * sizeof *pa) != 0) {
        fprintf(stderr, "%s: parameters differ between the cpu and the device-like backend\n",
                what);
        test_failures++;
    }
    free(pa);
    free(pb);
    fl_net_free(a);
    fl_net_free(b);
}

static fl_net *resnet8(void) { return fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, 10, 'A'); }
static fl_net *mlp(void) {
    int64_t hidden[] = {32, 32};
    return fl_model_mlp(FL_DTYPE_F32, 12, hidden, 2, FL_ACT_RELU, 3);
}

int main(void) {
    same_training(resnet8, 3, (int64_t[]){3, 16, 16}, 10, "resnet8");
    same_training(mlp, 1, (int64_t[]){12}, 3, "mlp");
    return test_failures ? 1 : 0;
}
