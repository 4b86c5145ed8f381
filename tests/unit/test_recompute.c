/* test_recompute.c - recompute (fl_net_set_recompute) changes memory, never results: for the
 * MLP (with dropout), CIFAR ResNet-20 (shortcuts A and B) and ResNet-50 on small inputs, with
 * manual, auto and awkward checkpoints, on every backend built, a network with recompute and
 * one without (same seed) give bit-identical losses, gradients and parameters, batch-norm
 * running statistics included, step after step; the gradient-ready hook sees the same
 * parameters in the same order; activation memory shrinks; names are checked. */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

typedef fl_net *(*make_fn)(void);

static fl_net *mlp(void) { /* 10 layers: fc1, act1, fc2, act2, drop2, fc3, ..., fc5 */
    fl_net *net = fl_net_create(FL_DTYPE_F32, NULL);
    char a[32], b[32];
    int64_t in = 20;
    for (int i = 1; i <= 4; i++) {
        snprintf(a, sizeof a, "fc%d", i);
        CHECK_OK(fl_net_add(net, fl_fc_create(a, in, 24, true)));
        snprintf(a, sizeof a, "act%d", i);
        CHECK_OK(fl_net_add(net, fl_activation_create(a, i % 2 ? FL_ACT_TANH : FL_ACT_RELU)));
        snprintf(b, sizeof b, "drop%d", i);
        if (i == 2)
            CHECK_OK(fl_net_add(net, fl_dropout_create(b, 0.25, 7)));
        in = 24;
    }
    CHECK_OK(fl_net_add(net, fl_fc_create("fc5", in, 5, true)));
    return net;
}
static fl_net *resnet20a(void) { return fl_model_resnet_cifar(FL_DTYPE_F32, 20, 3, 10, 'A'); }
static fl_net *resnet8b(void) { return fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, 10, 'B'); }
static fl_net *resnet50(void) { return fl_model_resnet(FL_DTYPE_F32, 50, 10); }

typedef struct {
    char   names[256][96];
    int    n;
} hook_log;

static void record(void *ctx, fl_param *p) {
    hook_log *h = ctx;
    if (h->n < 256)
        snprintf(h->names[h->n++], sizeof h->names[0], "%s", p->name);
}

/* One step: forward, mean cross-entropy, backward, SGD on the trainable values (the same plain
 * loop for both networks, so any difference comes from the gradients). */
static double step(fl_net *net, const fl_tensor *x, const int32_t *labels, int64_t classes,
                   hook_log *h) {
    const fl_tensor *logits;
    CHECK_OK(fl_net_forward(net, x, true, &logits));
    int64_t b = x->shape[0];
    fl_tensor *probs = fl_tensor_create(FL_DTYPE_F32, 2, (int64_t[]){b, classes});
    double loss = 0;
    CHECK_OK(fl_softmax_xent_forward(fl_net_backend(net), logits, labels, probs, &loss));
    CHECK_OK(fl_softmax_xent_backward(fl_net_backend(net), probs, labels, probs));
    CHECK_OK(fl_net_backward(net, probs, record, h));
    float *p = fl_net_flat_params(net), *g = fl_net_flat_grads(net);
    int64_t n = fl_net_numel(net); /* not in the loop's test: a call per value of ResNet-50 */
    for (int64_t i = 0; i < n; i++)
        p[i] -= 0.05f * g[i];
    fl_tensor_free(probs);
    return loss;
}

static int64_t numel_all(fl_net *net) {
    int64_t n = 0;
    for (int i = 0; i < fl_net_num_params(net); i++)
        n += fl_net_param(net, i)->value.numel;
    return n;
}

/* Trains a plain and a recomputing copy side by side for `steps` steps and compares. */
/* Trains a network without recompute and, beside it in lockstep, one with each of the nspec
 * checkpoint settings specs[] for steps[] steps (all made by make, the same seed; the plain one
 * takes the most steps of any): after every step each must
 * hold the plain network's loss, gradients and parameters bit for bit, and its hook must have
 * seen the same parameters in the same order. One plain network serves every setting, so a
 * model is built and trained nspec + 1 times, not 2 nspec (ResNet-50's initialisation and
 * steps were most of this test's time). */
static void same_training(const char *what, make_fn make, const fl_backend *be, int in_ndim,
                          const int64_t *in_shape, int64_t batch, int64_t classes,
                          const char *const *specs, const int *steps, int nspec,
                          bool expect_saving) {
    enum { MAXSPEC = 2 };
    FL_ASSERT(nspec >= 1 && nspec <= MAXSPEC);
    fl_net *plain = make(), *rc[MAXSPEC];
    fl_net_set_backend(plain, be);
    CHECK_OK(fl_net_build(plain, in_ndim, in_shape, batch, 11));
    size_t a0 = fl_net_activation_bytes(plain);
    for (int k = 0; k < nspec; k++) {
        rc[k] = make();
        fl_net_set_backend(rc[k], be);
        CHECK_OK(fl_net_set_recompute(rc[k], specs[k]));
        CHECK_OK(fl_net_build(rc[k], in_ndim, in_shape, batch, 11));
        size_t a1 = fl_net_activation_bytes(rc[k]);
        if (expect_saving && !(a1 < a0))
            fprintf(stderr, "%s ('%s'): activations %zu with recompute, %zu without\n", what,
                    specs[k], a1, a0);
        CHECK(!expect_saving || a1 < a0);
    }
    int64_t shape[FL_MAX_DIMS] = {batch};
    memcpy(shape + 1, in_shape, (size_t)in_ndim * sizeof *in_shape);
    fl_tensor *x = fl_tensor_create(FL_DTYPE_F32, in_ndim + 1, shape);
    int32_t labels[64];
    fl_rng r;
    fl_rng_init(&r, 5, 0);
    hook_log *h0 = calloc(1, sizeof *h0), *h1 = calloc(1, sizeof *h1);
    bool same[MAXSPEC];
    int most = 0;
    for (int k = 0; k < nspec; k++) {
        same[k] = true;
        most = steps[k] > most ? steps[k] : most;
    }
    bool any = true;
    for (int s = 0; s < most && any; s++) {
        float *xd = x->data;
        for (int64_t i = 0; i < x->numel; i++)
            xd[i] = (float)fl_rng_normal(&r);
        for (int64_t i = 0; i < batch; i++)
            labels[i] = (int32_t)fl_rng_below(&r, (uint64_t)classes);
        h0->n = 0;
        double l0 = step(plain, x, labels, classes, h0);
        any = false;
        for (int k = 0; k < nspec; k++) {
            if (!same[k] || s >= steps[k])
                continue;
            h1->n = 0;
            double l1 = step(rc[k], x, labels, classes, h1);
            same[k] = memcmp(&l0, &l1, sizeof l0) == 0 &&
                      memcmp(fl_net_flat_grads(plain), fl_net_flat_grads(rc[k]),
                             (size_t)fl_net_numel(plain) * sizeof(float)) == 0 &&
                      memcmp(fl_net_flat_params(plain), fl_net_flat_params(rc[k]),
                             (size_t)numel_all(plain) * sizeof(float)) == 0 &&
                      h0->n == h1->n;
            for (int i = 0; same[k] && i < h0->n; i++)
                same[k] = strcmp(h0->names[i], h1->names[i]) == 0;
            if (!same[k])
                fprintf(stderr, "%s (%s, checkpoints '%s'): step %d differs (loss %.17g vs "
                        "%.17g, %d vs %d hooks)\n", what, be->name, specs[k], s, l0, l1, h0->n,
                        h1->n);
            any = any || (same[k] && s + 1 < steps[k]);
        }
    }
    for (int k = 0; k < nspec; k++) {
        CHECK(same[k]);
        fl_net_free(rc[k]);
    }
    CHECK(h0->n > 0);
    free(h0);
    free(h1);
    fl_tensor_free(x);
    fl_net_free(plain);
}

static int count_checkpoints(fl_net *net) {
    int n = 0;
    for (int i = 0; i < fl_net_num_layers(net); i++)
        n += fl_net_is_checkpoint(net, i);
    return n;
}

int main(void) {
    /* CIFAR's ResNets on 16x16 images (three stages of 16, 8 and 4): what recompute keeps and
     * redoes is the same at 32x32, at a quarter of the cost on the ref backend's plain loops;
     * ResNet-50 on 32x32, the least its five halvings take, and the auto rules below too */
    int64_t vec[] = {20}, cifar[] = {3, 16, 16}, small[] = {3, 32, 32};
    const fl_backend *backends[] = {fl_backend_cpu(), fl_backend_by_name("ref"),
                                    fl_backend_onednn()};
    for (int b = 0; b < 3; b++) {
        const fl_backend *be = backends[b];
        if (!be)
            continue;
        same_training("mlp", mlp, be, 1, vec, 16, 5,
                      (const char *[]){"auto", "act1, drop2,fc4"}, (int[]){5, 5}, 2, true);
        /* auto for 10 steps, 3 on the ref backend, whose plain-loop convolutions were most
         * of this test's time under ASan: the property holds step by step, and 3 steps have
         * the batch norms' running statistics and the parameters moved twice */
        same_training("resnet20", resnet20a, be, 3, cifar, 4, 10,
                      (const char *[]){"auto", "layer1.2.add,layer2.2.add,layer3.0.bn1"},
                      (int[]){be == backends[1] ? 3 : 10, 3}, 2, true);
        /* checkpoints inside blocks: the block inputs read across them are kept too */
        same_training("resnet8b", resnet8b, be, 3, cifar, 4, 10,
                      (const char *[]){"layer2.0.conv1,layer3.0.bn2"}, (int[]){3}, 1, false);
        if (be != backends[1]) /* the ref backend's convolution is too slow for ResNet-50 */
            same_training("resnet50", resnet50, be, 3, small, 2, 10,
                          (const char *[]){"auto",
                                           "maxpool,layer1.2.add,layer3.0.add,layer4.1.bn2"},
                          (int[]){2, 2}, 2, true);
    }

    /* auto keeps no more bytes than the simple rules (every block's add in a ResNet, every
     * ceil(sqrt(n))-th layer in a chain), and only at cut points: nothing else is kept */
    char adds[512] = "";
    fl_net *r20 = resnet20a();
    for (int i = 0; i < fl_net_num_layers(r20); i++) {
        const char *name = fl_net_layer(r20, i)->name;
        if (strlen(name) > 4 && strcmp(name + strlen(name) - 4, ".add") == 0)
            snprintf(adds + strlen(adds), sizeof adds - strlen(adds), "%s%s", adds[0] ? "," : "",
                     name);
    }
    fl_net_free(r20);
    struct {
        make_fn make;
        int in_ndim;
        const int64_t *in_shape;
        const char *simple;
    } autos[] = {{resnet20a, 3, small, adds}, {mlp, 1, vec, "act2,fc4"}};
    for (int a = 0; a < 2; a++) {
        fl_net *simple = autos[a].make(), *au = autos[a].make(), *none = autos[a].make();
        CHECK_OK(fl_net_set_recompute(simple, autos[a].simple));
        CHECK_OK(fl_net_set_recompute(au, "auto"));
        CHECK_OK(fl_net_build(simple, autos[a].in_ndim, autos[a].in_shape, 4, 1));
        CHECK_OK(fl_net_build(au, autos[a].in_ndim, autos[a].in_shape, 4, 1));
        CHECK_OK(fl_net_build(none, autos[a].in_ndim, autos[a].in_shape, 4, 1));
        CHECK(fl_net_activation_bytes(au) <= fl_net_activation_bytes(simple));
        CHECK(fl_net_activation_bytes(simple) < fl_net_activation_bytes(none));
        int n = fl_net_num_layers(au);
        CHECK(count_checkpoints(au) > 0 && count_checkpoints(none) == 0);
        for (int i = 0; i < n; i++)
            CHECK(fl_net_output_kept(au, i) == (fl_net_is_checkpoint(au, i) || i == n - 1));
        fl_net_free(simple);
        fl_net_free(au);
        fl_net_free(none);
    }
    fl_net *m = mlp();
    CHECK_OK(fl_net_build(m, 1, vec, 2, 1));
    CHECK_RC(fl_net_set_recompute(m, "auto"), FL_ESTATE);
    fl_net_free(m);

    /* an unknown name is refused, naming it and listing the layers */
    fl_net *u = mlp();
    CHECK_RC(fl_net_set_recompute(u, "fc1,fc9"), FL_EINVAL);
    CHECK_MSG("'fc9' is not a layer");
    CHECK_MSG("its layers: fc1, act1, fc2, act2, drop2,");
    CHECK_OK(fl_net_build(u, 1, vec, 2, 1)); /* the refused setting left recompute off */
    CHECK(count_checkpoints(u) == 0);
    fl_net_free(u);
    fl_net *big = resnet50(); /* 125 layers: the list is cut, and says how many are left */
    CHECK_RC(fl_net_set_recompute(big, "layer9.0.add"), FL_EINVAL);
    CHECK_MSG("more");
    fl_net_free(big);

    if (test_failures)
        fprintf(stderr, "test_recompute: %d failure(s)\n", test_failures);
    return test_failures ? 1 : 0;
}
