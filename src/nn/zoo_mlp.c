/* zoo_mlp.c - the multi-layer perceptron of the model zoo: fc1, act1, fc2, act2, ..., fcN.
 * Layer and parameter names ("fc1.weight" (OUT, IN), "fc1.bias") match a PyTorch
 * nn.Sequential of Linear layers renamed, so checkpoints map one to one. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdio.h>

fl_net *fl_model_mlp(fl_dtype t, int64_t in_features, const int64_t *hidden, int nhidden,
                     fl_act act, int64_t classes) {
    if (nhidden < 0 || (nhidden > 0 && !hidden)) {
        fl_fail(FL_EINVAL, "mlp: %d hidden layers given without sizes", nhidden);
        return NULL;
    }
    fl_net *net = fl_net_create(t, NULL);
    if (!net)
        return NULL;
    char name[32];
    int64_t prev = in_features;
    for (int i = 0; i <= nhidden; i++) {
        int64_t width = i < nhidden ? hidden[i] : classes;
        snprintf(name, sizeof name, "fc%d", i + 1);
        fl_layer *fc = fl_fc_create(name, prev, width, true);
        if (!fc || fl_net_add(net, fc) < 0)
            goto fail;
        if (i == nhidden)
            break;
        snprintf(name, sizeof name, "act%d", i + 1);
        fl_layer *a = fl_activation_create(name, act);
        if (!a || fl_net_add(net, a) < 0)
            goto fail;
        prev = width;
    }
    return net;
fail:
    fl_fail_prefix(FL_EINVAL, "mlp");
    fl_net_free(net);
    return NULL;
}
