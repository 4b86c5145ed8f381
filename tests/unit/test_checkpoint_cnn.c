/* test_checkpoint_cnn.c - a checkpoint holds the whole state of a convolutional network with
 * batch norm: a CIFAR ResNet-8 (option-B shortcuts: convolutions and batch norms everywhere)
 * trained 3 steps with Momentum on 16x16 images, saved (weights, running statistics,
 * velocities), then trained 3 more steps, ends with the same bytes as a fresh network and optimizer loaded from the
 * checkpoint and trained the same 3 steps; the running statistics are in the file, changed
 * from their initial values; and the loaded network's inference output equals the original's. */
#include "fleet/checkpoint.h"
#include "fleet/nn.h"
#include "fleet/optim.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 4

typedef struct {
    fl_net   *net;
    fl_optim *opt;
} model;

static int make(model *m) {
    m->net = fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, 10, 'B');
    if (!m->net)
        return -1;
    int64_t in[3] = {3, 16, 16};
    if (fl_net_build(m->net, 3, in, B, 5) < 0)
        return -1;
    fl_optim_config oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9, .weight_decay = 1e-4};
    m->opt = fl_optim_create(&oc, fl_net_param(m->net, 0), fl_net_num_params(m->net),
                             FL_DTYPE_F32, fl_net_backend(m->net));
    return m->opt ? 0 : -1;
}

static void destroy(model *m) {
    fl_optim_free(m->opt);
    fl_net_free(m->net);
}

/* training steps first .. first + n - 1 on deterministic random batches */
static int train(model *m, int first, int n) {
    static float x[B * 3 * 16 * 16], probs[B * 10];
    int32_t labels[B];
    for (int s = first; s < first + n; s++) {
        fl_rng r;
        fl_rng_init(&r, 77, (uint64_t)s);
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
            x[i] = (float)fl_rng_normal(&r);
        for (int i = 0; i < B; i++)
            labels[i] = (int32_t)fl_rng_below(&r, 10);
        int64_t xs[4] = {B, 3, 16, 16}, ps[2] = {B, 10};
        fl_tensor xt, pt;
        fl_tensor_view(&xt, FL_DTYPE_F32, 4, xs, x);
        fl_tensor_view(&pt, FL_DTYPE_F32, 2, ps, probs);
        const fl_tensor *logits;
        double loss;
        const fl_backend *k = fl_net_backend(m->net);
        if (fl_net_forward(m->net, &xt, true, &logits) < 0 ||
            fl_softmax_xent_forward(k, logits, labels, &pt, &loss) < 0 ||
            fl_softmax_xent_backward(k, &pt, labels, &pt) < 0 ||
            fl_net_backward(m->net, &pt, NULL, NULL) < 0 || fl_optim_step(m->opt, 0.05, NULL) < 0)
            return -1;
    }
    return 0;
}

/* every network tensor and optimizer state tensor, in file order */
static int state(model *m, fl_param **p) {
    int n = 0;
    for (int i = 0; i < fl_net_num_params(m->net); i++)
        p[n++] = fl_net_param(m->net, i);
    for (int i = 0; i < fl_optim_num_state(m->opt); i++)
        p[n++] = fl_optim_state(m->opt, i);
    return n;
}

int main(void) {
    char dir[] = "/tmp/fleet_test_cnn_XXXXXX", path[64];
    if (!mkdtemp(dir))
        return 1;
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    model a = {0}, b = {0};
    if (make(&a) < 0 || make(&b) < 0) {
        fprintf(stderr, "cannot build ResNet-8: %s\n", fl_errmsg());
        return 1;
    }
    static fl_param *pa[1024], *pb[1024];
    int na = state(&a, pa), nb = state(&b, pb);
    CHECK(na == nb && na < 1024);
    CHECK_OK(train(&a, 0, 3));
    CHECK_OK(fl_ckpt_save(path, pa, na, NULL, 0));
    CHECK_OK(train(&a, 3, 3));

    fl_safetensors *st;
    CHECK_OK(fl_safetensors_open(path, &st));
    int nbuffers = 0, moved = 0;
    for (int i = 0; st && i < fl_net_num_params(b.net); i++) {
        fl_param *p = fl_net_param(b.net, i);
        if (p->trainable)
            continue;
        nbuffers++;
        const fl_st_tensor *t = fl_safetensors_find(st, p->name);
        CHECK(t != NULL);
        /* running_mean starts at 0, running_var at 1: after 3 steps they moved */
        if (t && memcmp(t->data, p->value.data, t->nbytes) != 0)
            moved++;
    }
    printf("ResNet-8: %d tensors saved, %d of them batch-norm buffers (%d changed by training)\n",
           na, nbuffers, moved);
    CHECK(nbuffers >= 12 && moved == nbuffers);
    if (st)
        CHECK_OK(fl_ckpt_load(st, pb, nb, FL_CKPT_STRICT, NULL, 0, NULL));
    fl_safetensors_close(st);
    CHECK_OK(train(&b, 3, 3));
    int differ = 0;
    for (int i = 0; i < na; i++)
        differ += memcmp(pa[i]->value.data, pb[i]->value.data,
                         fl_tensor_nbytes(&pa[i]->value)) != 0;
    printf("saved at step 3 and resumed: %d of %d tensors differ from the uninterrupted run's "
           "after step 6\n", differ, na);
    CHECK(differ == 0);
    /* inference with the running statistics: the same output */
    static float x[B * 3 * 16 * 16];
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        x[i] = (float)(i % 7) * 0.1f;
    int64_t xs[4] = {B, 3, 16, 16};
    fl_tensor xt;
    fl_tensor_view(&xt, FL_DTYPE_F32, 4, xs, x);
    const fl_tensor *ya, *yb;
    CHECK_OK(fl_net_forward(a.net, &xt, false, &ya));
    float out_a[B * 10];
    memcpy(out_a, ya->data, sizeof out_a);
    CHECK_OK(fl_net_forward(b.net, &xt, false, &yb));
    CHECK(memcmp(out_a, yb->data, sizeof out_a) == 0);
    destroy(&a);
    destroy(&b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return test_failures ? 1 : 0;
}
