/* test_resnet.c - the ResNet zoo: torchvision's parameter counts, names and order for every
 * depth, the CIFAR ResNets' counts (options A and B), ResNet-50's forward on a 224x224 batch,
 * a whole small CIFAR ResNet's gradient against finite differences (f64, sampled parameters),
 * and a tiny CIFAR ResNet learning random labels (loss falls, inference mode works). */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/optim.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

static fl_rng rng;

static int64_t trainable(fl_net *net) {
    int64_t n = 0;
    for (int i = 0; i < fl_net_num_params(net); i++)
        if (fl_net_param(net, i)->trainable)
            n += fl_net_param(net, i)->value.numel;
    return n;
}

static void test_counts(void) {
    /* torchvision.models.resnetN(num_classes=1000): sum(p.numel() for p in m.parameters()) */
    static const struct {
        int layers;
        int64_t params;
        int nparams; /* state_dict entries without num_batches_tracked */
    } want[] = {{18, 11689512, 102}, {34, 21797672, 182}, {50, 25557032, 267},
                {101, 44549160, 522}, {152, 60192808, 777}};
    for (int i = 0; i < 5; i++) {
        fl_net *net = fl_model_resnet(FL_DTYPE_F32, want[i].layers, 1000);
        CHECK(net != NULL);
        if (!net)
            continue;
        if (trainable(net) != want[i].params || fl_net_num_params(net) != want[i].nparams)
            fprintf(stderr, "resnet%d: %lld parameters in %d tensors, want %lld in %d\n",
                    want[i].layers, (long long)trainable(net), fl_net_num_params(net),
                    (long long)want[i].params, want[i].nparams);
        CHECK(trainable(net) == want[i].params);
        CHECK(fl_net_num_params(net) == want[i].nparams);
        fl_net_free(net);
    }
    CHECK(fl_model_resnet(FL_DTYPE_F32, 42, 10) == NULL);
    CHECK_MSG("layers 42 is not one of 18, 34, 50, 101, 152");

    fl_net *a = fl_model_resnet_cifar(FL_DTYPE_F32, 20, 3, 10, 'A');
    fl_net *b = fl_model_resnet_cifar(FL_DTYPE_F32, 20, 3, 10, 'B');
    fl_net *c = fl_model_resnet_cifar(FL_DTYPE_F32, 56, 3, 10, 'A');
    CHECK(a && b && c);
    CHECK(trainable(a) == 269722); /* He et al. report 0.27M */
    CHECK(trainable(b) == 269722 + 16 * 32 + 2 * 32 + 32 * 64 + 2 * 64);
    CHECK(trainable(c) == 853018); /* 0.85M */
    fl_net_free(a), fl_net_free(b), fl_net_free(c);
    CHECK(fl_model_resnet_cifar(FL_DTYPE_F32, 21, 3, 10, 'A') == NULL);
    CHECK_MSG("depth 21 is not 6n + 2");
}

/* torchvision's state_dict names, in its order */
static void test_names(void) {
    fl_net *net = fl_model_resnet(FL_DTYPE_F32, 50, 1000);
    const char *first[] = {"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                           "bn1.running_var", "layer1.0.conv1.weight", "layer1.0.bn1.weight"};
    for (int i = 0; i < 7; i++)
        CHECK(strcmp(fl_net_param(net, i)->name, first[i]) == 0);
    int n = fl_net_num_params(net);
    CHECK(strcmp(fl_net_param(net, n - 2)->name, "fc.weight") == 0);
    CHECK(strcmp(fl_net_param(net, n - 1)->name, "fc.bias") == 0);
    fl_param *p = fl_net_find_param(net, "layer1.0.downsample.0.weight");
    CHECK(p && p->value.ndim == 4 && p->value.shape[0] == 256 && p->value.shape[1] == 64 &&
          p->value.shape[2] == 1);
    p = fl_net_find_param(net, "layer4.2.bn3.running_var");
    CHECK(p && !p->trainable && p->value.numel == 2048);
    p = fl_net_find_param(net, "layer3.5.conv2.weight");
    CHECK(p && p->value.shape[0] == 256 && p->value.shape[3] == 3);
    CHECK(fl_net_find_param(net, "layer2.1.downsample.0.weight") == NULL);
    /* the downsample follows the block's last batch norm, as in torchvision */
    int i3 = -1, id = -1;
    for (int i = 0; i < n; i++) {
        if (!strcmp(fl_net_param(net, i)->name, "layer2.0.bn3.running_var"))
            i3 = i;
        if (!strcmp(fl_net_param(net, i)->name, "layer2.0.downsample.0.weight"))
            id = i;
    }
    CHECK(i3 >= 0 && id == i3 + 1);
    fl_net_free(net);
}

static void test_resnet50_forward(void) {
    enum { B = 2 };
    fl_net *net = fl_model_resnet(FL_DTYPE_F32, 50, 1000);
    CHECK_OK(fl_net_build(net, 3, (int64_t[]){3, 224, 224}, B, 3));
    int64_t out[FL_MAX_DIMS];
    CHECK(fl_net_out_shape(net, out) == 1 && out[0] == 1000);
    fl_tensor *x = fl_tensor_create(FL_DTYPE_F32, 4, (int64_t[]){B, 3, 224, 224});
    float *xd = x->data;
    for (int64_t i = 0; i < x->numel; i++)
        xd[i] = (float)(2 * fl_rng_uniform_f64(&rng) - 1);
    const fl_tensor *y = NULL;
    CHECK_OK(fl_net_forward(net, x, false, &y));
    CHECK(y && y->ndim == 2 && y->shape[0] == B && y->shape[1] == 1000);
    int finite = 0;
    for (int64_t i = 0; y && i < y->numel; i++)
        finite += isfinite(((const float *)y->data)[i]);
    CHECK(y && finite == y->numel);
    fl_tensor_free(x);
    fl_net_free(net);
}

/* mean cross-entropy of the network on (x, labels) in training mode */
static double loss_of(fl_net *net, const fl_tensor *x, const int32_t *labels, double *pm) {
    const fl_tensor *y = NULL;
    CHECK_OK(fl_net_forward(net, x, true, &y));
    if (!y)
        return NAN;
    fl_tensor probs;
    fl_tensor_view(&probs, fl_net_dtype(net), 2, y->shape, pm);
    double loss = NAN;
    CHECK_OK(fl_softmax_xent_forward(fl_net_backend(net), y, labels, &probs, &loss));
    return loss;
}

static void test_gradcheck(char shortcut) {
    enum { B = 3, C = 4, S = 6 };
    fl_net *net = fl_model_resnet_cifar(FL_DTYPE_F64, 8, 3, C, shortcut);
    CHECK_OK(fl_net_build(net, 3, (int64_t[]){3, S, S}, B, 5));
    double xd[B * 3 * S * S], pm[B * C];
    int32_t labels[B] = {1, 3, 0};
    for (int i = 0; i < B * 3 * S * S; i++)
        xd[i] = 2 * fl_rng_uniform_f64(&rng) - 1;
    fl_tensor x, probs;
    fl_tensor_view(&x, FL_DTYPE_F64, 4, (int64_t[]){B, 3, S, S}, xd);
    loss_of(net, &x, labels, pm);
    fl_tensor_view(&probs, FL_DTYPE_F64, 2, (int64_t[]){B, C}, pm);
    CHECK_OK(fl_softmax_xent_backward(NULL, &probs, labels, &probs));
    CHECK_OK(fl_net_backward(net, &probs, NULL, NULL));
    /* a few values of every trainable tensor */
    double g[2048], gn[2048];
    int nc = 0;
    double *w = fl_net_flat_params(net), *grads = fl_net_flat_grads(net);
    int64_t off = 0;
    for (int i = 0; i < fl_net_num_params(net); i++) {
        fl_param *p = fl_net_param(net, i);
        if (!p->trainable)
            continue;
        for (int s = 0; s < 4 && nc < 2048; s++) {
            int64_t j = off + (int64_t)fl_rng_below(&rng, (uint64_t)p->value.numel);
            double keep = w[j];
            w[j] = keep + 1e-6;
            double lp = loss_of(net, &x, labels, pm);
            w[j] = keep - 1e-6;
            double lm = loss_of(net, &x, labels, pm);
            w[j] = keep;
            g[nc] = grads[j];
            gn[nc++] = (lp - lm) / 2e-6;
        }
        off += p->value.numel;
    }
    char label[64];
    snprintf(label, sizeof label, "resnet_cifar8 option %c d/dparams (sampled)", shortcut);
    CHECK_CLOSE(label, g, gn, nc, 1e-7, 1e-5);
    fl_net_free(net);
}

/* A depth-8 CIFAR ResNet memorises 32 random 16x16 images with random labels of 4 classes. */
static void test_training(void) {
    enum { N = 32, C = 4, S = 16, STEPS = 40 };
    fl_net *net = fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, C, 'A');
    CHECK_OK(fl_net_build(net, 3, (int64_t[]){3, S, S}, N, 9));
    fl_optim_config oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9, .weight_decay = 1e-4};
    fl_optim *opt = fl_optim_create(&oc, fl_net_param(net, 0), fl_net_num_params(net),
                                    FL_DTYPE_F32, fl_net_backend(net));
    fl_tensor *x = fl_tensor_create(FL_DTYPE_F32, 4, (int64_t[]){N, 3, S, S});
    float pm[N * C];
    int32_t labels[N];
    for (int64_t i = 0; i < x->numel; i++)
        ((float *)x->data)[i] = (float)(2 * fl_rng_uniform_f64(&rng) - 1);
    for (int i = 0; i < N; i++)
        labels[i] = (int32_t)fl_rng_below(&rng, C);
    double first = 0, last = 0;
    for (int step = 0; step < STEPS; step++) {
        const fl_tensor *y;
        CHECK_OK(fl_net_forward(net, x, true, &y));
        fl_tensor probs;
        fl_tensor_view(&probs, FL_DTYPE_F32, 2, y->shape, pm);
        double loss;
        CHECK_OK(fl_softmax_xent_forward(NULL, y, labels, &probs, &loss));
        CHECK_OK(fl_softmax_xent_backward(NULL, &probs, labels, &probs));
        CHECK_OK(fl_net_backward(net, &probs, NULL, NULL));
        CHECK_OK(fl_optim_step(opt, 0.05, NULL));
        if (step == 0)
            first = loss;
        last = loss;
    }
    fprintf(stderr, "tiny resnet: loss %.4f -> %.4f in %d steps\n", first, last, STEPS);
    CHECK(first > 1.0 && last < 0.5 * first);
    /* inference mode uses the running statistics: finite, and not the training output */
    const fl_tensor *y;
    CHECK_OK(fl_net_forward(net, x, true, &y));
    float train0 = ((const float *)y->data)[0];
    CHECK_OK(fl_net_forward(net, x, false, &y));
    int finite = 0;
    for (int64_t i = 0; i < y->numel; i++)
        finite += isfinite(((const float *)y->data)[i]);
    CHECK(finite == y->numel);
    CHECK(((const float *)y->data)[0] != train0);
    fl_tensor_free(x);
    fl_optim_free(opt);
    fl_net_free(net);
}

int main(void) {
    fl_rng_init(&rng, 50, 1);
    test_counts();
    test_names();
    test_gradcheck('A');
    test_gradcheck('B');
    test_training();
    test_resnet50_forward();
    TEST_DONE();
}
