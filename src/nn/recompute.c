/* recompute.c - which layer outputs a network keeps from forward to backward when it
 * recomputes the rest (activation checkpointing: Chen et al. 2016, "Training Deep Nets with
 * Sublinear Memory Cost", arXiv:1604.06174; Paddle's strategy.recompute). Checkpoints split
 * the layers (in insertion order) into segments, each ending at a checkpoint; an output is kept
 * when it is a checkpoint, the network's output, or read by a layer of a later segment. The
 * network recomputes the other outputs of a segment just before its backward. The network's
 * setting (fl_net_set_recompute) and what it tells about kept outputs are at the end. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* After layer i the network can be cut: no later layer reads an output from before i (the
 * network input is always at hand). */
static bool is_cut(fl_layer *const *layers, int nlayers, int i) {
    for (int t = i + 1; t < nlayers; t++)
        for (int k = 0; k < layers[t]->ninputs; k++)
            if (layers[t]->inputs[k] >= 0 && layers[t]->inputs[k] < i)
                return false;
    return true;
}

/* The simple rules: in residual networks every block's output (a layer of two or more inputs
 * after which the network can be cut: an add, a multiply, a concatenation); in chains every
 * ceil(sqrt(n))-th layer (Chen et al. sec. 4.1). */
static void choose_simple(fl_layer *const *layers, int n, bool *cp) {
    bool residual = false;
    for (int i = 0; i < n; i++)
        residual |= layers[i]->ninputs >= 2;
    int stride = (int)ceil(sqrt((double)n)), last = -1;
    for (int i = 0; i < n - 1; i++) {
        if (!is_cut(layers, n, i))
            continue;
        if (residual ? layers[i]->ninputs >= 2 : i - last >= stride) {
            cp[i] = true;
            last = i;
        }
    }
}

/* "conv1, bn1" -> marks them; an unknown name fails listing the layers (as many as fit) */
static int parse_names(fl_layer *const *layers, int n, const char *spec, bool *cp) {
    const char *s = spec;
    while (*s) {
        while (*s == ',' || isspace((unsigned char)*s))
            s++;
        size_t len = strcspn(s, ",");
        while (len > 0 && isspace((unsigned char)s[len - 1]))
            len--;
        if (len == 0)
            break;
        int found = -1;
        for (int i = 0; i < n && found < 0; i++)
            if (strlen(layers[i]->name) == len && strncmp(layers[i]->name, s, len) == 0)
                found = i;
        if (found < 0) {
            char list[640];
            size_t used = 0;
            int shown = 0;
            for (; shown < n; shown++) {
                int w = snprintf(list + used, sizeof list - used, "%s%s", shown ? ", " : "",
                                 layers[shown]->name);
                if (w < 0 || (size_t)w >= sizeof list - used - 1) {
                    list[used] = '\0';
                    break;
                }
                used += (size_t)w;
            }
            char more[64] = "";
            if (shown < n)
                snprintf(more, sizeof more, ", and %d more", n - shown);
            return fl_fail(FL_EINVAL, "recompute checkpoint '%.*s' is not a layer of the "
                           "network (or 'auto'); its layers: %s%s", (int)len, s, list, more);
        }
        cp[found] = true;
        s += strcspn(s, ",");
    }
    return FL_OK;
}

/* Segments and kept outputs from p->checkpoint. */
static void derive(fl_layer *const *layers, int n, nn_recompute_plan *p) {
    int seg = 0;
    for (int i = 0; i < n; i++) {
        p->segment[i] = seg;
        p->kept[i] = false;
        if (p->checkpoint[i] && i < n - 1)
            seg++;
    }
    p->nsegments = seg + 1;
    for (int i = 0; i < n; i++) {
        p->kept[i] |= p->checkpoint[i] || i == n - 1;
        for (int k = 0; k < layers[i]->ninputs; k++) {
            int from = layers[i]->inputs[k];
            if (from >= 0 && p->segment[from] != p->segment[i])
                p->kept[from] = true;
        }
    }
}

void nn_recompute_plan_sizes(const nn_recompute_plan *p, int n, const size_t *bytes,
                             size_t *kept, size_t *arena) {
    size_t seg = 0;
    *kept = *arena = 0;
    for (int i = 0; i < n; i++) {
        if (i > 0 && p->segment[i] != p->segment[i - 1])
            seg = 0;
        if (p->kept[i]) {
            *kept += bytes[i];
        } else {
            seg += bytes[i];
            *arena = seg > *arena ? seg : *arena;
        }
    }
}

/* Activation bytes of a plan: the kept outputs plus the largest segment of the others. */
static size_t plan_bytes(const nn_recompute_plan *p, int n, const size_t *bytes) {
    size_t kept, arena;
    nn_recompute_plan_sizes(p, n, bytes, &kept, &arena);
    return kept + arena;
}

/* checkpoints: auto, knowing each output's size: the simple rule, or Chen et al.'s greedy
 * (sec. 4.2) over the cut points with a segment budget of total * j / 64 (j = 1 .. 64: close
 * a segment at the first cut point where it holds at least the budget), whichever keeps the
 * fewest bytes (kept outputs + the largest segment). Without sizes: the simple rule. */
static void choose_auto(fl_layer *const *layers, int n, const size_t *bytes,
                        nn_recompute_plan *p) {
    choose_simple(layers, n, p->checkpoint);
    if (!bytes)
        return;
    derive(layers, n, p);
    size_t best = plan_bytes(p, n, bytes), total = 0;
    for (int i = 0; i < n; i++)
        total += bytes[i];
    bool *cut = calloc((size_t)n, sizeof *cut), *best_cp = malloc((size_t)n * sizeof *best_cp);
    if (!cut || !best_cp) { /* keep the simple rule */
        free(cut);
        free(best_cp);
        return;
    }
    for (int i = 0; i < n - 1; i++)
        cut[i] = is_cut(layers, n, i);
    memcpy(best_cp, p->checkpoint, (size_t)n * sizeof *best_cp);
    for (int j = 1; j <= 64; j++) {
        size_t budget = total / 64 * (size_t)j, acc = 0;
        for (int i = 0; i < n; i++) {
            acc += bytes[i];
            p->checkpoint[i] = cut[i] && acc >= budget;
            if (p->checkpoint[i])
                acc = 0;
        }
        derive(layers, n, p);
        size_t got = plan_bytes(p, n, bytes);
        if (got < best) {
            best = got;
            memcpy(best_cp, p->checkpoint, (size_t)n * sizeof *best_cp);
        }
    }
    memcpy(p->checkpoint, best_cp, (size_t)n * sizeof *best_cp);
    free(cut);
    free(best_cp);
}

int nn_recompute_plan_make(fl_layer *const *layers, int n, const char *spec,
                           const size_t *bytes, nn_recompute_plan *p) {
    memset(p, 0, sizeof *p);
    p->checkpoint = calloc((size_t)(n > 0 ? n : 1), sizeof *p->checkpoint);
    p->kept = calloc((size_t)(n > 0 ? n : 1), sizeof *p->kept);
    p->segment = calloc((size_t)(n > 0 ? n : 1), sizeof *p->segment);
    if (!p->checkpoint || !p->kept || !p->segment) {
        nn_recompute_plan_free(p);
        return fl_fail(FL_ENOMEM, "net: out of memory planning recompute");
    }
    if (!spec || !spec[0]) { /* no recompute: every output kept, one segment */
        for (int i = 0; i < n; i++)
            p->kept[i] = true;
        p->nsegments = 1;
        return FL_OK;
    }
    p->enabled = true;
    const char *t = spec;
    while (isspace((unsigned char)*t))
        t++;
    if (strncmp(t, "auto", 4) == 0 && t[4 + strspn(t + 4, " \t")] == '\0') {
        choose_auto(layers, n, bytes, p);
    } else {
        int rc = parse_names(layers, n, spec, p->checkpoint);
        if (rc < 0) {
            nn_recompute_plan_free(p);
            return rc;
        }
    }
    derive(layers, n, p);
    return FL_OK;
}

void nn_recompute_plan_free(nn_recompute_plan *p) {
    free(p->checkpoint);
    free(p->kept);
    free(p->segment);
    memset(p, 0, sizeof *p);
}

/* The network's setting (fleet/nn.h) */

int fl_net_set_recompute(fl_net *net, const char *checkpoints) {
    FL_ASSERT(net);
    if (net->built)
        return fl_fail(FL_ESTATE, "net: recompute must be set before fl_net_build");
    free(net->recompute_spec);
    net->recompute_spec = NULL;
    if (!checkpoints || !checkpoints[0])
        return FL_OK;
    if (!(net->recompute_spec = strdup(checkpoints)))
        return fl_fail(FL_ENOMEM, "net: out of memory");
    /* the names are checked now, so that a typo is said before anything is allocated */
    nn_recompute_plan plan;
    int rc = nn_recompute_plan_make(net->layers, net->nlayers, checkpoints, NULL, &plan);
    nn_recompute_plan_free(&plan);
    if (rc < 0) {
        free(net->recompute_spec);
        net->recompute_spec = NULL;
    }
    return rc;
}

bool fl_net_is_checkpoint(const fl_net *net, int i) {
    FL_ASSERT(net && i >= 0 && i < net->nlayers);
    return net->built && net->plan.enabled && net->plan.checkpoint[i];
}

bool fl_net_output_kept(const fl_net *net, int i) {
    FL_ASSERT(net && i >= 0 && i < net->nlayers);
    return !net->built || net->plan.kept[i];
}
