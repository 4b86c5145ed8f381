/* test_network.c - the network's contracts: names, shapes and flat placement of the seed MLP's
 * parameters, forward shapes and refusals, build errors naming the layer, the gradient-ready hook,
 * accumulation, seeded initialisation, top-k counting and the cross-entropy's label check. */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#include <math.h>

static fl_rng rng;

static fl_net *seed_mlp(uint64_t seed) {
    int64_t hidden[] = {128, 128}, in_shape[] = {32};
    fl_net *net = fl_model_mlp(FL_DTYPE_F32, 32, hidden, 2, FL_ACT_TANH, 2);
    CHECK(net != NULL);
    if (net)
        CHECK_OK(fl_net_build(net, 1, in_shape, 128, seed));
    return net;
}

static fl_tensor *rand_input(int64_t b, int64_t features) {
    int64_t shape[] = {b, features};
    fl_tensor *x = fl_tensor_create(FL_DTYPE_F32, 2, shape);
    float *d = x->data;
    for (int64_t i = 0; i < x->numel; i++)
        d[i] = 2 * fl_rng_uniform(&rng) - 1;
    return x;
}

static void test_mlp_params(void) {
    fl_net *net = seed_mlp(1);
    if (!net)
        return;
    static const char *names[] = {"fc1.weight", "fc1.bias", "fc2.weight",
                                  "fc2.bias",   "fc3.weight", "fc3.bias"};
    static const int64_t shapes[][2] = {{128, 32}, {128, 0}, {128, 128},
                                        {128, 0},  {2, 128}, {2, 0}};
    CHECK(fl_net_num_params(net) == 6);
    CHECK(fl_net_numel(net) == 32 * 128 + 128 + 128 * 128 + 128 + 128 * 2 + 2);
    CHECK(fl_net_numel(net) == 20994);
    CHECK(fl_net_num_layers(net) == 5);
    static const char *layers[] = {"fc1", "act1", "fc2", "act2", "fc3"};
    static const char *types[] = {"fc", "tanh", "fc", "tanh", "fc"};
    for (int i = 0; i < 5 && i < fl_net_num_layers(net); i++) {
        CHECK(strcmp(fl_net_layer(net, i)->name, layers[i]) == 0);
        CHECK(strcmp(fl_net_layer(net, i)->ops->type, types[i]) == 0);
    }
    char *flat = fl_net_flat_params(net), *gflat = fl_net_flat_grads(net);
    CHECK(flat != NULL && gflat != NULL);
    CHECK((uintptr_t)flat % 64 == 0 && (uintptr_t)gflat % 64 == 0);
    size_t off = 0;
    for (int i = 0; i < 6 && i < fl_net_num_params(net); i++) {
        fl_param *p = fl_net_param(net, i);
        CHECK(strcmp(p->name, names[i]) == 0);
        int ndim = shapes[i][1] ? 2 : 1;
        CHECK(p->value.ndim == ndim && p->grad.ndim == ndim);
        CHECK(p->value.shape[0] == shapes[i][0] && p->grad.shape[0] == shapes[i][0]);
        if (ndim == 2)
            CHECK(p->value.shape[1] == shapes[i][1]);
        CHECK(p->trainable);
        CHECK(p->value.dtype == FL_DTYPE_F32 && p->grad.dtype == FL_DTYPE_F32);
        CHECK(!p->value.owns_data && !p->grad.owns_data);
        /* contiguous, in order, values and gradients at the same offsets */
        CHECK(p->value.data == flat + off);
        CHECK(p->grad.data == gflat + off);
        CHECK(fl_net_find_param(net, names[i]) == p);
        off += (size_t)p->value.numel * sizeof(float);
        /* fl_net_param(net, 0) starts one array (what the optimizer takes) */
        CHECK(fl_net_param(net, 0) + i == p);
    }
    CHECK(off == 20994 * sizeof(float));
    CHECK(fl_net_find_param(net, "fc9.weight") == NULL);
    /* each layer's params point into the network's array */
    CHECK(fl_net_layer(net, 0)->params == fl_net_param(net, 0));
    CHECK(fl_net_layer(net, 2)->params == fl_net_param(net, 2));
    CHECK(fl_net_layer(net, 1)->nparams == 0);
    int64_t oshape[FL_MAX_DIMS];
    CHECK(fl_net_out_shape(net, oshape) == 1);
    CHECK(oshape[0] == 2);
    /* initialisation: U(-1/sqrt(IN), 1/sqrt(IN)); param j from stream 0x1000 + j */
    fl_param *w1 = fl_net_find_param(net, "fc1.weight"), *b2 = fl_net_find_param(net, "fc2.bias");
    float bound = 1.0f / sqrtf(32.0f), wmax = 0;
    for (int64_t i = 0; i < w1->value.numel; i++)
        wmax = fmaxf(wmax, fabsf(((float *)w1->value.data)[i]));
    CHECK(wmax <= bound && wmax > 0.9f * bound);
    fl_rng r;
    fl_rng_init(&r, 1, 0x1000 + 3); // fc2.bias is param 3
    float want0 = (2.0f * fl_rng_uniform(&r) - 1.0f) * (1.0f / sqrtf(128.0f));
    CHECK_NEAR(((float *)b2->value.data)[0], want0, 1e-7);
    /* the summary mentions every parameter and the total */
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    fl_net_summary(net, mem);
    fclose(mem);
    CHECK(strstr(text, "fc3.bias") && strstr(text, "20994"));
    free(text);
    fl_net_free(net);
    fl_net_free(NULL); // no-op
}

static void test_forward_shapes(void) {
    fl_net *net = seed_mlp(2);
    if (!net)
        return;
    const fl_tensor *out = NULL;
    int64_t oshape[] = {8, 2};
    fl_tensor *dout = fl_tensor_create(FL_DTYPE_F32, 2, oshape);
    CHECK_RC(fl_net_backward(net, dout, NULL, NULL), FL_ESTATE); // no forward yet
    for (int64_t b = 0; b <= 128; b += 64) { // 0, 64, 128
        fl_tensor *x = rand_input(b, 32);
        CHECK_OK(fl_net_forward(net, x, true, &out));
        CHECK(out && out->ndim == 2 && out->shape[0] == b && out->shape[1] == 2);
        CHECK(out && out->numel == b * 2);
        fl_tensor_free(x);
    }
    /* batch above max_batch */
    fl_tensor *big = rand_input(129, 32);
    CHECK_RC(fl_net_forward(net, big, true, &out), FL_ESHAPE);
    CHECK_MSG("129");
    CHECK_MSG("max_batch 128");
    fl_tensor_free(big);
    /* wrong sample shape and dtype */
    fl_tensor *narrow = rand_input(8, 31);
    CHECK_RC(fl_net_forward(net, narrow, true, &out), FL_ESHAPE);
    CHECK_MSG("(8, 31)");
    fl_tensor_free(narrow);
    int64_t shape[] = {8, 32};
    fl_tensor *xd = fl_tensor_create(FL_DTYPE_F64, 2, shape);
    CHECK_RC(fl_net_forward(net, xd, true, &out), FL_ESHAPE);
    CHECK_MSG("f64");
    fl_tensor_free(xd);
    /* output gradient of the wrong shape */
    fl_tensor *x = rand_input(4, 32);
    CHECK_OK(fl_net_forward(net, x, true, &out));
    CHECK_RC(fl_net_backward(net, dout, NULL, NULL), FL_ESHAPE);
    CHECK_MSG("(8, 2)");
    fl_tensor_free(x);
    fl_tensor_free(dout);
    /* building twice, adding after build */
    int64_t in_shape[] = {32};
    CHECK_RC(fl_net_build(net, 1, in_shape, 16, 1), FL_ESTATE);
    CHECK_RC(fl_net_add(net, fl_fc_create("fc9", 2, 2, true)), FL_ESTATE);
    CHECK_MSG("fc9");
    fl_net_free(net);
}

static void test_build_errors(void) {
    /* fc2 expects 64 features but fc1 gives 128 */
    fl_net *net = fl_net_create(FL_DTYPE_F32, NULL);
    CHECK_OK(fl_net_add(net, fl_fc_create("fc1", 32, 128, true)));
    CHECK_OK(fl_net_add(net, fl_activation_create("act1", FL_ACT_RELU)));
    CHECK_OK(fl_net_add(net, fl_fc_create("fc2", 64, 10, true)));
    const fl_tensor *out;
    int64_t shape[] = {4, 32};
    fl_tensor *x = fl_tensor_create(FL_DTYPE_F32, 2, shape);
    CHECK_RC(fl_net_forward(net, x, true, &out), FL_ESTATE); // not built
    int64_t in_shape[] = {32};
    CHECK_RC(fl_net_build(net, 1, in_shape, 16, 1), FL_ESHAPE);
    CHECK_MSG("fc2: input");
    CHECK_MSG("128 features, expected 64");
    CHECK(fl_net_flat_params(net) == NULL);
    /* the input itself does not fit fc1 */
    fl_net *net2 = fl_net_create(FL_DTYPE_F32, NULL);
    CHECK_OK(fl_net_add(net2, fl_fc_create("fc1", 32, 8, true)));
    int64_t bad_in[] = {3, 10};
    CHECK_RC(fl_net_build(net2, 2, bad_in, 16, 1), FL_ESHAPE);
    CHECK_MSG("fc1: input (3, 10) has 30 features, expected 32");
    CHECK_RC(fl_net_build(net2, 1, in_shape, 0, 1), FL_EINVAL); // max_batch 0
    /* duplicate layer names would give duplicate parameter names */
    CHECK_RC(fl_net_add(net2, fl_fc_create("fc1", 8, 8, true)), FL_EINVAL);
    CHECK_MSG("fc1");
    /* an empty network cannot be built */
    fl_net *empty = fl_net_create(FL_DTYPE_F32, NULL);
    CHECK_RC(fl_net_build(empty, 1, in_shape, 16, 1), FL_ESTATE);
    CHECK(fl_net_create(FL_DTYPE_I32, NULL) == NULL);
    CHECK(fl_fc_create("fc", 0, 3, true) == NULL);
    fl_tensor_free(x);
    fl_net_free(net);
    fl_net_free(net2);
    fl_net_free(empty);
}

/* one forward, loss and backward on the seed MLP; returns the loss */
static double step(fl_net *net, const fl_tensor *x, const int32_t *labels, fl_grad_ready_fn hook,
                   void *ctx) {
    const fl_tensor *logits = NULL;
    CHECK_OK(fl_net_forward(net, x, true, &logits));
    float probs_mem[128 * 2];
    fl_tensor probs;
    fl_tensor_view(&probs, FL_DTYPE_F32, 2, logits->shape, probs_mem);
    double loss = NAN;
    CHECK_OK(fl_softmax_xent_forward(fl_net_backend(net), logits, labels, &probs, &loss));
    CHECK_OK(fl_softmax_xent_backward(fl_net_backend(net), &probs, labels, &probs));
    CHECK_OK(fl_net_backward(net, &probs, hook, ctx));
    return loss;
}

typedef struct {
    int      calls;
    fl_param *order[16];
    float    *snapshot[16]; /* the gradient as it was when the hook ran */
} hook_log;

static void record(void *ctx, fl_param *p) {
    hook_log *log = ctx;
    if (log->calls < 16) {
        log->order[log->calls] = p;
        size_t bytes = (size_t)p->grad.numel * sizeof(float);
        log->snapshot[log->calls] = malloc(bytes);
        memcpy(log->snapshot[log->calls], p->grad.data, bytes);
    }
    log->calls++;
}

static int32_t labels128[128];

static void test_hook_and_accumulate(void) {
    fl_net *net = seed_mlp(3);
    if (!net)
        return;
    fl_tensor *x = rand_input(100, 32);
    for (int i = 0; i < 128; i++)
        labels128[i] = (int32_t)fl_rng_below(&rng, 2);
    hook_log log = {0};
    double loss = step(net, x, labels128, record, &log);
    CHECK(isfinite(loss) && loss > 0.3 && loss < 1.5); // near ln 2 at initialisation
    CHECK(log.calls == 6);
    static const char *order[] = {"fc3.bias", "fc3.weight", "fc2.bias",
                                  "fc2.weight", "fc1.bias", "fc1.weight"};
    for (int i = 0; i < 6 && i < log.calls; i++) {
        CHECK(strcmp(log.order[i]->name, order[i]) == 0);
        /* the gradient was final when the hook ran */
        CHECK(memcmp(log.snapshot[i], log.order[i]->grad.data,
                     (size_t)log.order[i]->grad.numel * sizeof(float)) == 0);
        free(log.snapshot[i]);
    }
    int64_t n = fl_net_numel(net);
    float *g1 = malloc((size_t)n * sizeof *g1);
    memcpy(g1, fl_net_flat_grads(net), (size_t)n * sizeof *g1);
    double gsum = 0;
    for (int64_t i = 0; i < n; i++)
        gsum += fabs(g1[i]);
    CHECK(gsum > 0);

    /* overwrite mode: a second backward gives the same gradients */
    step(net, x, labels128, NULL, NULL);
    CHECK(memcmp(g1, fl_net_flat_grads(net), (size_t)n * sizeof *g1) == 0);

    /* accumulate mode: a second backward adds, doubling them */
    fl_net_set_accumulate(net, true);
    step(net, x, labels128, NULL, NULL);
    float *g2 = fl_net_flat_grads(net);
    double *want = calloc((size_t)n, sizeof *want), *got = calloc((size_t)n, sizeof *got);
    for (int64_t i = 0; i < n; i++) {
        want[i] = 2.0 * g1[i];
        got[i] = g2[i];
    }
    CHECK_CLOSE("accumulated grads", got, want, n, 1e-7, 1e-5);
    /* zero_grad then accumulate gives the single gradient again */
    fl_net_zero_grad(net);
    step(net, x, labels128, NULL, NULL);
    for (int64_t i = 0; i < n; i++) {
        want[i] = g1[i];
        got[i] = g2[i];
    }
    CHECK_CLOSE("zero_grad + accumulate", got, want, n, 1e-7, 1e-5);
    fl_net_set_accumulate(net, false);

    /* a smaller batch after a larger one: gradients are those of the smaller batch only */
    fl_tensor *x7 = rand_input(7, 32);
    step(net, x7, labels128, NULL, NULL);
    float *g7 = malloc((size_t)n * sizeof *g7);
    memcpy(g7, fl_net_flat_grads(net), (size_t)n * sizeof *g7);
    fl_net *fresh = seed_mlp(3); // same parameters, never saw a larger batch
    step(fresh, x7, labels128, NULL, NULL);
    CHECK(memcmp(g7, fl_net_flat_grads(fresh), (size_t)n * sizeof *g7) == 0);
    /* batch 0: the mean-loss gradient of nothing is zero */
    fl_tensor *x0 = rand_input(0, 32);
    const fl_tensor *out;
    CHECK_OK(fl_net_forward(net, x0, true, &out));
    int64_t zshape[] = {0, 2};
    fl_tensor dz;
    fl_tensor_view(&dz, FL_DTYPE_F32, 2, zshape, NULL);
    CHECK_OK(fl_net_backward(net, &dz, NULL, NULL));
    double zsum = 0;
    for (int64_t i = 0; i < n; i++)
        zsum += fabs(((float *)fl_net_flat_grads(net))[i]);
    CHECK(zsum == 0);

    free(g1);
    free(g7);
    free(want);
    free(got);
    fl_tensor_free(x);
    fl_tensor_free(x7);
    fl_tensor_free(x0);
    fl_net_free(net);
    fl_net_free(fresh);
}

static void test_seeds(void) {
    fl_net *a = seed_mlp(7), *b = seed_mlp(7), *c = seed_mlp(8);
    if (!a || !b || !c)
        return;
    size_t bytes = (size_t)fl_net_numel(a) * sizeof(float);
    CHECK(memcmp(fl_net_flat_params(a), fl_net_flat_params(b), bytes) == 0);
    CHECK(memcmp(fl_net_flat_params(a), fl_net_flat_params(c), bytes) != 0);
    /* every parameter differs, not just some */
    for (int i = 0; i < fl_net_num_params(a); i++) {
        fl_param *pa = fl_net_param(a, i), *pc = fl_net_param(c, i);
        CHECK(memcmp(pa->value.data, pc->value.data, (size_t)pa->value.numel * sizeof(float)));
    }
    /* weight and bias of one layer come from different streams */
    fl_param *w = fl_net_find_param(a, "fc3.weight"), *bias = fl_net_find_param(a, "fc3.bias");
    CHECK(memcmp(w->value.data, bias->value.data, 2 * sizeof(float)) != 0);
    fl_net_free(a);
    fl_net_free(b);
    fl_net_free(c);
}

static void test_topk(void) {
    /* 5 rows, 4 classes */
    float lg[] = {
        0.1f, 0.9f, 0.3f, 0.2f, // label 1: top-1
        0.5f, 0.4f, 0.6f, 0.0f, // label 0: second
        0.2f, 0.2f, 0.1f, 0.0f, // label 1: tied with class 0, counted against: second
        0.0f, 0.1f, 0.2f, 0.3f, // label 0: last
        1.0f, 1.0f, 1.0f, 1.0f, // label 3: all tied: last
    };
    int32_t labels[] = {1, 0, 1, 0, 3};
    int64_t shape[] = {5, 4};
    fl_tensor logits;
    fl_tensor_view(&logits, FL_DTYPE_F32, 2, shape, lg);
    CHECK(fl_topk_correct(&logits, labels, 1) == 1);
    CHECK(fl_topk_correct(&logits, labels, 2) == 3);
    CHECK(fl_topk_correct(&logits, labels, 3) == 3);
    CHECK(fl_topk_correct(&logits, labels, 4) == 5);
    CHECK(fl_topk_correct(&logits, labels, 0) == 0);
    double lgd[] = {3, 1, 2, 2, 5, 1};
    int32_t labd[] = {0, 1};
    int64_t shd[] = {2, 3};
    fl_tensor ld;
    fl_tensor_view(&ld, FL_DTYPE_F64, 2, shd, lgd);
    CHECK(fl_topk_correct(&ld, labd, 1) == 2);
}

static void test_xent_errors(void) {
    float lg[] = {0, 1, 2, 3, 4, 5}, pr[6];
    int64_t shape[] = {3, 2};
    fl_tensor logits, probs;
    fl_tensor_view(&logits, FL_DTYPE_F32, 2, shape, lg);
    fl_tensor_view(&probs, FL_DTYPE_F32, 2, shape, pr);
    int32_t bad[] = {0, 1, 2};
    double loss = 0;
    CHECK_RC(fl_softmax_xent_forward(NULL, &logits, bad, &probs, &loss), FL_EINVAL);
    CHECK_MSG("row 2");
    int32_t neg[] = {-1, 0, 0};
    CHECK_RC(fl_softmax_xent_backward(NULL, &probs, neg, &probs), FL_EINVAL);
    CHECK_MSG("row 0");
    int32_t good[] = {1, 1, 0};
    CHECK_OK(fl_softmax_xent_forward(NULL, &logits, good, &probs, &loss));
    double want = (log(1 + exp(-1.0)) * 2 + log(1 + exp(1.0))) / 3;
    CHECK_NEAR(loss, want, 1e-6);
    /* probs of the wrong shape */
    int64_t other[] = {2, 3};
    fl_tensor wrong;
    fl_tensor_view(&wrong, FL_DTYPE_F32, 2, other, pr);
    CHECK_RC(fl_softmax_xent_forward(NULL, &logits, good, &wrong, &loss), FL_ESHAPE);
    CHECK_MSG("probs");
}

int main(void) {
    fl_rng_init(&rng, 99, 0);
    test_mlp_params();
    test_forward_shapes();
    test_build_errors();
    test_hook_and_accumulate();
    test_seeds();
    test_topk();
    test_xent_errors();
    TEST_DONE();
}
