/* test_backend_devsim.c - training on a device whose memory the host cannot touch, on the CPU:
 * tests/support/devsim.c's guarded stand-in (the cpu table, host_memory false, its memory
 * PROT_NONE outside its own calls). First the guard itself: a host access to its memory, host
 * memory handed to one of its kernels and a copy of the wrong kind each abort the process with
 * a message naming the culprit. Then a CIFAR ResNet-8 (with recompute and without) and an MLP
 * with dropout train three steps (network, loss with label smoothing, Momentum with clipping
 * or LARS with weight decay) and evaluate on it exactly as on the cpu backend: the same losses,
 * parameters, running statistics and evaluation logits, bit for bit; the initial values move
 * to the device with one host-to-device copy. */
#include "support/devsim.h"

#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/optim.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* --- the guard: each case runs in a child that must abort with `want` on stderr --- */

static void expect_abort(const char *what, void (*body)(void), const char *want) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        body();
        _exit(0); /* the guard missed it */
    }
    close(fds[1]);
    char out[8192];
    size_t len = 0;
    ssize_t got;
    while ((got = read(fds[0], out + len, sizeof out - 1 - len)) > 0)
        len += (size_t)got;
    out[len] = '\0';
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT || !strstr(out, want)) {
        fprintf(stderr, "%s: want an abort saying \"%s\"; got status 0x%x and:\n%s\n", what, want,
                st, out);
        test_failures++;
    }
}

static void touch_device_memory(void) {
    const fl_backend *d = fl_devsim_backend();
    float *p = d->alloc(100 * sizeof(float));
    d->fill(FL_DTYPE_F32, p, 100, 1.0); /* fine: a table function */
    ((volatile float *)p)[42] = 2.0f;   /* the host's own write: faults */
}

static void host_memory_to_kernel(void) {
    static float host[16];
    fl_devsim_backend()->scale(FL_DTYPE_F32, 16, 2.0, host);
}

static void copy_of_wrong_kind(void) {
    const fl_backend *d = fl_devsim_backend();
    static float host[16];
    void *p = d->alloc(sizeof host);
    d->copy(p, host, sizeof host, FL_COPY_D2H, NULL); /* it is H2D: dst is the device */
}

static void guard(void) {
    const fl_backend *d = fl_devsim_backend();
    CHECK(!d->host_memory && strcmp(d->name, "devsim") == 0);
    /* the legitimate way round: fill on the device, copy back */
    float *p = d->alloc(8 * sizeof(float)), back[8];
    CHECK(p && fl_devsim_owns(p) && fl_devsim_owns(p + 7) && !fl_devsim_owns(back));
    d->fill(FL_DTYPE_F32, p, 8, 3.0);
    d->copy(back, p, sizeof back, FL_COPY_D2H, NULL);
    CHECK(back[0] == 3.0f && back[7] == 3.0f);
    d->free(p);
    CHECK(!fl_devsim_owns(p));
    CHECK(d->device_bind(1) == FL_OK && fl_devsim_bound() == 1);
    CHECK_RC(d->device_bind(FL_DEVSIM_DEVICES), FL_EINVAL);
    CHECK_MSG("there are 8");
    expect_abort("host write", touch_device_memory,
                 "devsim: the host touched backend memory");
    expect_abort("host write", touch_device_memory, "byte 168 of an allocation of 400 bytes");
    expect_abort("host memory to scale", host_memory_to_kernel,
                 "devsim: scale: argument x");
    expect_abort("copy D2H from host memory", copy_of_wrong_kind,
                 "devsim: copy D2H: argument dst");
}

/* --- lazy streams: a stream's copies run when they are waited for, not before --- */

static void free_while_queued(void) {
    const fl_backend *d = fl_devsim_backend();
    static float host[16];
    fl_stream *s = d->stream_create();
    void *p = d->alloc(sizeof host);
    d->copy(host, p, sizeof host, FL_COPY_D2H, s);
    d->free(p); /* the copy has not run: a device would read freed memory */
}

static void streams(void) {
    const fl_backend *d = fl_devsim_backend();
    float *p = d->alloc(4 * sizeof(float)), *q = d->alloc(4 * sizeof(float));
    float h[4] = {0}, h2[4] = {0};
    fl_stream *s = d->stream_create(), *s2 = d->stream_create();
    fl_event *e = d->event_create(), *e2 = d->event_create();
    d->fill(FL_DTYPE_F32, p, 4, 1.0);
    d->copy(h, p, sizeof h, FL_COPY_D2H, s);
    d->event_record(e, s);
    d->fill(FL_DTYPE_F32, p, 4, 2.0); /* the default stream runs at once: the copy reads 2 */
    CHECK(h[0] == 0.0f);              /* not run yet */
    d->event_sync(e);
    CHECK(h[0] == 2.0f && h[3] == 2.0f);
    /* a stream that waits for an event of another runs that one's work first */
    d->fill(FL_DTYPE_F32, p, 4, 3.0);
    d->copy(h, p, sizeof h, FL_COPY_D2H, s); /* s: h = 3 */
    d->event_record(e, s);
    d->event_wait(s2, e);
    d->copy(q, h, sizeof h, FL_COPY_H2D, s2); /* s2, after s: q = 3 */
    d->event_record(e2, s2);
    CHECK(h[0] == 2.0f);
    d->event_wait(NULL, e2); /* the default stream waits: both run */
    d->copy(h2, q, sizeof h2, FL_COPY_D2H, NULL);
    CHECK(h[0] == 3.0f && h2[0] == 3.0f && h2[3] == 3.0f);
    /* stream_sync runs everything queued; an event recorded on nothing queued is complete */
    d->fill(FL_DTYPE_F32, p, 4, 4.0);
    d->copy(h, p, sizeof h, FL_COPY_D2H, s);
    d->stream_sync(s);
    CHECK(h[0] == 4.0f);
    d->event_record(e, s);
    d->event_sync(e);
    /* freeing a stream finishes its work; its events stay valid */
    d->fill(FL_DTYPE_F32, p, 4, 5.0);
    d->copy(h, p, sizeof h, FL_COPY_D2H, s);
    d->event_record(e, s);
    d->stream_free(s);
    CHECK(h[0] == 5.0f);
    d->event_sync(e);
    d->event_free(e);
    d->event_free(e2);
    d->stream_free(s2);
    d->free(p);
    d->free(q);
    expect_abort("free under a queued copy", free_while_queued,
                 "is used by a copy still queued in a stream");
}

/* --- training, cpu against devsim --- */

static fl_backend counting; /* devsim with its copies counted */
static int copies[4];       /* by fl_copy_kind */

static void counting_copy(void *dst, const void *src, size_t bytes, fl_copy_kind kind,
                          fl_stream *s) {
    copies[kind]++;
    fl_devsim_backend()->copy(dst, src, bytes, kind, s);
}

typedef struct {
    fl_optim_config oc;
    double eps; /* label smoothing */
} recipe;

typedef struct {
    double loss[3];
    float *params; /* every parameter and buffer, host memory */
    float *logits; /* evaluation of the training batch */
    int64_t nparams, nlogits;
    int build_h2d; /* host-to-device copies fl_net_build made */
} result;

/* three steps of net on k from fixed data, then an evaluation, all results copied to the host */
static void train(fl_net *net, const fl_backend *k, const recipe *rc, int in_ndim,
                  const int64_t *in_shape, int64_t classes, result *out) {
    const int64_t b = 8;
    fl_net_set_backend(net, k);
    memset(copies, 0, sizeof copies);
    CHECK_OK(fl_net_build(net, in_ndim, in_shape, b, 7));
    out->build_h2d = copies[FL_COPY_H2D];
    fl_optim *opt = fl_optim_create(&rc->oc, fl_net_param(net, 0), fl_net_num_params(net),
                                    FL_DTYPE_F32, k);
    CHECK(opt != NULL);
    int64_t xs[FL_MAX_DIMS] = {b};
    memcpy(xs + 1, in_shape, (size_t)in_ndim * sizeof *in_shape);
    int64_t xn = fl_shape_numel(in_ndim + 1, xs);
    float *hx = malloc((size_t)xn * sizeof *hx);
    int32_t hl[8];
    fl_rng r;
    fl_rng_init(&r, 5, 0);
    for (int64_t i = 0; i < xn; i++)
        hx[i] = 2 * fl_rng_uniform(&r) - 1;
    for (int i = 0; i < 8; i++)
        hl[i] = (int32_t)fl_rng_below(&r, (uint64_t)classes);
    /* the batch on the device: input, labels, and the loss buffer */
    fl_tensor x, probs;
    fl_tensor_view(&x, FL_DTYPE_F32, in_ndim + 1, xs, k->alloc((size_t)xn * sizeof(float)));
    fl_tensor_view(&probs, FL_DTYPE_F32, 2, (int64_t[]){b, classes},
                   k->alloc((size_t)(b * classes) * sizeof(float)));
    int32_t *labels = k->alloc(sizeof hl);
    x.device = probs.device = fl_backend_device(k);
    k->copy(x.data, hx, (size_t)xn * sizeof(float), FL_COPY_H2D, NULL);
    k->copy(labels, hl, sizeof hl, FL_COPY_H2D, NULL);
    CHECK_OK(fl_labels_check(hl, b, classes));
    for (int step = 0; step < 3; step++) {
        const fl_tensor *logits;
        CHECK_OK(fl_net_forward(net, &x, true, &logits));
        CHECK_OK(fl_softmax_xent_smooth_forward(k, logits, labels, rc->eps, &probs,
                                                &out->loss[step]));
        CHECK_OK(fl_softmax_xent_smooth_backward(k, &probs, labels, rc->eps, &probs));
        CHECK_OK(fl_net_backward(net, &probs, NULL, NULL));
        CHECK_OK(fl_optim_step(opt, 0.05, NULL));
    }
    const fl_tensor *logits;
    CHECK_OK(fl_net_forward(net, &x, false, &logits));
    out->nlogits = logits->numel;
    out->logits = malloc((size_t)out->nlogits * sizeof(float));
    k->copy(out->logits, logits->data, (size_t)out->nlogits * sizeof(float), FL_COPY_D2H, NULL);
    out->nparams = 0;
    for (int i = 0; i < fl_net_num_params(net); i++)
        out->nparams += fl_net_param(net, i)->value.numel; /* trainable values, then buffers */
    out->params = malloc((size_t)out->nparams * sizeof(float));
    k->copy(out->params, fl_net_flat_params(net), (size_t)out->nparams * sizeof(float),
            FL_COPY_D2H, NULL);
    k->stream_sync(NULL);
    k->free(x.data);
    k->free(probs.data);
    k->free(labels);
    free(hx);
    fl_optim_free(opt);
}

static void same_training(const char *what, fl_net *(*make)(void), const recipe *rc,
                          int in_ndim, const int64_t *in_shape, int64_t classes) {
    result a = {0}, b = {0};
    fl_net *na = make(), *nb = make();
    int live = fl_devsim_live_count();
    train(na, fl_backend_cpu(), rc, in_ndim, in_shape, classes, &a);
    train(nb, &counting, rc, in_ndim, in_shape, classes, &b);
    CHECK(a.build_h2d == 0); /* the cpu table is not counted: nothing to copy there anyway */
    CHECK(b.build_h2d == 1); /* the device: its initial values, once */
    CHECK(a.nparams > 0 && a.nparams == b.nparams && a.nlogits == b.nlogits);
    if (memcmp(a.loss, b.loss, sizeof a.loss) != 0) {
        fprintf(stderr, "%s: losses differ: cpu %.17g %.17g %.17g, devsim %.17g %.17g %.17g\n",
                what, a.loss[0], a.loss[1], a.loss[2], b.loss[0], b.loss[1], b.loss[2]);
        test_failures++;
    }
    if (memcmp(a.params, b.params, (size_t)a.nparams * sizeof(float)) != 0) {
        fprintf(stderr, "%s: parameters differ between cpu and devsim\n", what);
        test_failures++;
    }
    if (memcmp(a.logits, b.logits, (size_t)a.nlogits * sizeof(float)) != 0) {
        fprintf(stderr, "%s: evaluation logits differ between cpu and devsim\n", what);
        test_failures++;
    }
    fl_net_free(na);
    fl_net_free(nb);
    CHECK(fl_devsim_live_count() == live); /* the network and optimizer freed all they took */
    free(a.params);
    free(b.params);
    free(a.logits);
    free(b.logits);
}

static fl_net *resnet8(void) { return fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, 10, 'A'); }
static fl_net *resnet8_recompute(void) {
    fl_net *net = resnet8();
    CHECK_OK(fl_net_set_recompute(net, "auto"));
    return net;
}
static fl_net *mlp_dropout(void) {
    fl_net *net = fl_net_create(FL_DTYPE_F32, NULL);
    CHECK_OK(fl_net_add(net, fl_fc_create("fc1", 12, 32, true)));
    CHECK_OK(fl_net_add(net, fl_activation_create("act1", FL_ACT_TANH)));
    CHECK_OK(fl_net_add(net, fl_dropout_create("drop1", 0.25, 11)));
    CHECK_OK(fl_net_add(net, fl_fc_create("fc2", 32, 3, true)));
    return net;
}

int main(void) {
    guard();
    streams();
    counting = *fl_devsim_backend();
    counting.copy = counting_copy;
    recipe momentum = {.oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9, .weight_decay = 1e-4,
                              .clip_norm = 1.0},
                       .eps = 0.1};
    recipe lars = {.oc = {.type = FL_OPTIM_LARS, .momentum = 0.9, .weight_decay = 1e-4,
                          .lars_coeff = 0.001, .lars_weight_decay = 5e-4, .epsilon = 0},
                   .eps = 0};
    same_training("resnet8", resnet8, &momentum, 3, (int64_t[]){3, 16, 16}, 10);
    same_training("resnet8 recompute", resnet8_recompute, &momentum, 3, (int64_t[]){3, 16, 16},
                  10);
    same_training("mlp dropout lars", mlp_dropout, &lars, 1, (int64_t[]){12}, 3);
    TEST_DONE();
}
