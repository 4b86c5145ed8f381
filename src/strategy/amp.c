/* amp.c - mixed precision's loss scaling rule (Paddle's update_loss_scaling, to the f32
 * rounding of its products), the white list of layer types, and the checks of amp_configs. The
 * step around them (unscale, the found-inf flag over the workers, skipping) is in
 * dist_optim.c; the f16/bf16 emulation in src/nn/amp.c. */
#include "amp.h"

#include "fleet/nn.h"
#include "fleet/status.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fl_amp_rule_from(const fl_strategy *s, fl_amp_rule *r) {
    FL_ASSERT(s && r);
    r->init_loss_scaling = (float)s->amp_configs.init_loss_scaling;
    r->dynamic = s->amp_configs.use_dynamic_loss_scaling;
    r->incr_every_n_steps = s->amp_configs.incr_every_n_steps;
    r->decr_every_n_nan_or_inf = s->amp_configs.decr_every_n_nan_or_inf;
    r->incr_ratio = (float)s->amp_configs.incr_ratio;
    r->decr_ratio = (float)s->amp_configs.decr_ratio;
}

void fl_amp_state_init(const fl_amp_rule *r, double st[FL_AMP_NSTATE]) {
    st[FL_AMP_SCALE] = r->init_loss_scaling;
    st[FL_AMP_GOOD] = st[FL_AMP_BAD] = st[FL_AMP_SKIPPED] = 0;
}

void fl_amp_update(const fl_amp_rule *r, bool found_inf, double st[FL_AMP_NSTATE]) {
    if (found_inf)
        st[FL_AMP_SKIPPED] += 1;
    if (!r->dynamic)
        return;
    float scale = (float)st[FL_AMP_SCALE];
    if (found_inf) {
        st[FL_AMP_GOOD] = 0;
        st[FL_AMP_BAD] += 1;
        if (st[FL_AMP_BAD] == (double)r->decr_every_n_nan_or_inf) {
            float next = scale * r->decr_ratio;
            st[FL_AMP_SCALE] = next < 1.0f ? 1.0f : next;
            st[FL_AMP_BAD] = 0;
        }
    } else {
        st[FL_AMP_BAD] = 0;
        st[FL_AMP_GOOD] += 1;
        if (st[FL_AMP_GOOD] == (double)r->incr_every_n_steps) {
            float next = scale * r->incr_ratio;
            st[FL_AMP_SCALE] = isfinite(next) ? next : scale;
            st[FL_AMP_GOOD] = 0;
        }
    }
}

/* Paddle's AutoMixedPrecisionLists in fleet's layer types: matmul-like layers are white; the
 * loss (softmax_with_cross_entropy, outside the network: always f32) and batch norm black;
 * everything else gray, which fleet computes in f32 (docs/amp.md). */
static const char *const default_white[] = {"conv2d", "fc"};
#define LOSS_TYPE "softmax_with_cross_entropy"

/* Whether type is in the comma-separated list. */
static bool listed(const char *list, const char *type) {
    size_t n = strlen(type);
    for (const char *p = list; *p;) {
        p += strspn(p, ", \t");
        size_t len = strcspn(p, ", \t");
        if (len == n && strncmp(p, type, n) == 0)
            return true;
        p += len;
    }
    return false;
}

static int check_list(const char *key, const char *list, bool black) {
    char tok[64];
    for (const char *p = list; *p;) {
        p += strspn(p, ", \t");
        size_t len = strcspn(p, ", \t");
        if (len == 0)
            break;
        snprintf(tok, sizeof tok, "%.*s", (int)(len < sizeof tok ? len : sizeof tok - 1), p);
        p += len;
        if (strcmp(tok, LOSS_TYPE) == 0 || strcmp(tok, "softmax") == 0) {
            if (black)
                continue;
            return fl_fail(FL_ECONFIG, "strategy.amp_configs.%s: '%s': the loss always "
                           "computes in f32 (it is black, and outside the network)", key, tok);
        }
        if (!fl_layer_type_known(tok))
            return fl_fail(FL_ECONFIG, "strategy.amp_configs.%s: '%s' is not a layer type "
                           "(the types are %s%s)", key, tok, fl_layer_type_names(),
                           black ? ", and the loss " LOSS_TYPE : "");
    }
    return FL_OK;
}

int fl_amp_check_config(const fl_strategy *s) {
    const char *white = s->amp_configs.custom_white_list;
    const char *black = s->amp_configs.custom_black_list;
    FL_TRY(check_list("custom_white_list", white, false));
    FL_TRY(check_list("custom_black_list", black, true));
    for (const char *p = white; *p;) {
        p += strspn(p, ", \t");
        size_t len = strcspn(p, ", \t");
        char tok[64];
        snprintf(tok, sizeof tok, "%.*s", (int)(len < sizeof tok ? len : sizeof tok - 1), p);
        p += len;
        if (len && listed(black, tok)) /* Paddle: "Custom white list overlap custom black list" */
            return fl_fail(FL_ECONFIG, "strategy.amp_configs.custom_white_list: '%s' is also in "
                           "strategy.amp_configs.custom_black_list: a type is one or the other",
                           tok);
    }
    if (s->amp && (!(s->amp_configs.init_loss_scaling >= 1) ||
                   !isfinite(s->amp_configs.init_loss_scaling)))
        return fl_fail(FL_ECONFIG, "strategy.amp_configs.init_loss_scaling: %g must be a finite "
                       "number >= 1", s->amp_configs.init_loss_scaling);
    if (s->amp && (s->amp_configs.incr_every_n_steps < 1 ||
                   s->amp_configs.decr_every_n_nan_or_inf < 1))
        return fl_fail(FL_ECONFIG, "strategy.amp_configs.%s: must be >= 1",
                       s->amp_configs.incr_every_n_steps < 1 ? "incr_every_n_steps"
                                                             : "decr_every_n_nan_or_inf");
    return FL_OK;
}

int fl_strategy_plan_amp(const fl_strategy *s, fl_net *net) {
    FL_ASSERT(s && net);
    if (!s->amp)
        return FL_OK;
    char white[512];
    FL_TRY(fl_amp_white_types(s, white, sizeof white));
    fl_dtype low = s->amp_configs.dtype == FL_AMP_BFLOAT16 ? FL_DTYPE_BF16 : FL_DTYPE_F16;
    /* activations really in low where the backend runs them (ref; cuda with
     * FLEET_CUDA_LOW_DTYPES=1), else emulated */
    int rc = fl_net_set_amp_native(net, true);
    if (rc == FL_OK)
        rc = fl_net_set_amp(net, low, white);
    return rc < 0 ? fl_fail_prefix(rc, "strategy.amp") : FL_OK;
}

int fl_amp_white_types(const fl_strategy *s, char *buf, size_t cap) {
    FL_ASSERT(s && buf && cap > 0);
    buf[0] = '\0';
    size_t len = 0;
    char all[512];
    snprintf(all, sizeof all, "%s,%s,%s", default_white[0], default_white[1],
             s->amp_configs.custom_white_list);
    for (char *save = NULL, *tok = strtok_r(all, ", \t", &save); tok;
         tok = strtok_r(NULL, ", \t", &save)) {
        if (listed(s->amp_configs.custom_black_list, tok) || listed(buf, tok))
            continue;
        int n = snprintf(buf + len, cap - len, "%s%s", len ? "," : "", tok);
        if (n < 0 || (size_t)n >= cap - len)
            return fl_fail(FL_EINVAL, "strategy.amp: the white list does not fit %zu bytes", cap);
        len += (size_t)n;
    }
    return FL_OK;
}

int fl_amp_inject_parse(const char *env, int64_t *step, int *rank) {
    *step = 0;
    *rank = -1;
    if (!env || !*env)
        return FL_OK;
    char *end;
    errno = 0;
    long long st = strtoll(env, &end, 10);
    long long r = -1;
    if (*end == ',') {
        char *rest = end + 1;
        r = strtoll(rest, &end, 10);
        if (end == rest || r < 0)
            end = rest - 1; /* refused below */
    }
    if (errno || end == env || *end || st < 1)
        return fl_fail(FL_EINVAL, "FLEET_AMP_INJECT_INF: '%s' is not STEP[,RANK] (a step >= 1 "
                       "as the progress lines count them, and a rank)", env);
    *step = st;
    *rank = (int)r;
    return FL_OK;
}
