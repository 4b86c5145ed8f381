/* onednn_conv.c - convolution through oneDNN primitives: a plan holds the forward, backward-data
 * and backward-weights primitives of one layer's shape per batch size (and thread count, which
 * oneDNN bakes into a primitive), built on first use and kept; weights stay in PyTorch's
 * (G)OIHW order for the caller and are reordered each call into the format each primitive
 * chose (format_tag_any). f64, and f32 NCHW shapes oneDNN has no implementation for, run on a
 * cpu-table plan kept inside this one. */
#include "onednn_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Primitive sets kept per plan: the max batch, the last (smaller) batch of an epoch, and a few
 * more for changes of the thread count; beyond that the oldest but the first is replaced. */
#define MAX_ENTRIES 6

typedef struct conv_entry {
    int64_t n;   /* images */
    int     nthr;
    dnnl_primitive_t fwd, bwd_data, bwd_w;
    dnnl_primitive_t w_fwd, w_bwd; /* user weights -> the primitive's format; NULL: same */
    dnnl_primitive_t dw_set;       /* diff weights in bwd_w's format -> user; NULL: same */
    dnnl_primitive_t dw_add;       /* the same, added to the user's (a sum post-op) */
    dnnl_memory_desc_t x_md, y_md, wfwd_md, wbwd_md, dw_md;
    dnnl_memory_desc_t spad_md[3]; /* fwd, bwd_data, bwd_w scratchpads */
    size_t spad_bytes[3];
    /* scratch: [0, wbuf_off) a scratchpad, then weights in a primitive's format (or diff
     * weights before they are added); `bytes` in all */
    size_t wbuf_off, bytes;
} conv_entry;

struct fl_conv_plan {
    fl_conv_desc d;
    fl_conv_plan *cpu; /* non-NULL: every call goes to this cpu-table plan */
    dnnl_memory_desc_t w_md, b_md; /* user weights (OC, IC/G, KH, KW) or (G, OC/G, ...); bias */
    conv_entry e[MAX_ENTRIES];
    int ne, evict;
    size_t lent;        /* conv_scratch_bytes: the max-batch entry's `bytes` */
    void *own;          /* scratch for entries needing more than the lent (other thread counts) */
    size_t own_bytes;
    float *dbias;       /* (OC) diff bias before it is added */
};

static void entry_clear(conv_entry *e) {
    dnnl_primitive_t *prims[] = {&e->fwd, &e->bwd_data, &e->bwd_w, &e->w_fwd,
                                 &e->w_bwd, &e->dw_set, &e->dw_add};
    for (size_t i = 0; i < sizeof prims / sizeof prims[0]; i++) {
        if (*prims[i])
            dnnl_primitive_destroy(*prims[i]);
        *prims[i] = NULL;
    }
    e->n = 0;
}

/* a reorder primitive from `from` to `to`, adding to the destination when add */
static int make_reorder(dnnl_primitive_t *r, const dnnl_memory_desc_t *from,
                        const dnnl_memory_desc_t *to, bool add) {
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int rc = 0;
    *r = NULL;
    if (add) {
        DNNL_MUST(dnnl_primitive_attr_create(&attr));
        DNNL_MUST(dnnl_post_ops_create(&po));
        DNNL_MUST(dnnl_post_ops_append_sum(po, 1.0f));
        DNNL_MUST(dnnl_primitive_attr_set_post_ops(attr, po));
    }
    dnnl_engine_t eng = onednn_engine();
    dnnl_status_t s = dnnl_reorder_primitive_desc_create(&pd, from, eng, to, eng, attr);
    if (s == dnnl_success)
        s = dnnl_primitive_create(r, pd);
    if (s != dnnl_success) {
        *r = NULL;
        rc = fl_fail(FL_EUNSUPPORTED, "onednn conv: weights reorder%s: %s", add ? " (add)" : "",
                     dnnl_status2str(s));
    }
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return rc;
}

static size_t md_bytes(const dnnl_memory_desc_t *md) { return dnnl_memory_desc_get_size(md); }

/* grows a plan-owned buffer to at least `bytes` (contents not kept) */
static int grow(void **buf, size_t *have, size_t bytes) {
    if (bytes <= *have)
        return 0;
    void *p = onednn_alloc(bytes);
    if (!p)
        return FL_ENOMEM;
    onednn_free(*buf);
    *buf = p;
    *have = bytes;
    return 0;
}

/* Builds e's primitives for n images at the current thread count; the first entry (the max
 * batch, at plan creation) sets what the plan asks to be lent. */
static int entry_init(fl_conv_plan *p, conv_entry *e, int64_t n, bool first) {
    const fl_conv_desc *d = &p->d;
    const fl_conv_geom *g = &d->g;
    memset(e, 0, sizeof *e);
    e->n = n;
    e->nthr = onednn_threads();
    e->x_md = onednn_act_md(d->layout, n, g->c, g->h, g->w);
    e->y_md = onednn_act_md(d->layout, n, d->oc, g->oh, g->ow);
    dnnl_memory_desc_t w_any;
    DNNL_MUST(dnnl_memory_desc_init_by_tag(&w_any, p->w_md.ndims, p->w_md.dims, dnnl_f32,
                                           dnnl_format_tag_any));
    const dnnl_memory_desc_t *b_md = d->bias ? &p->b_md : NULL;
    dnnl_dims_t strides = {g->sh, g->sw}, dil = {g->dh - 1, g->dw - 1}, pad = {g->ph, g->pw};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t fwd_pd = NULL, bd_pd = NULL, bw_pd = NULL;
    dnnl_convolution_desc_t cd;
    int rc = 0;
    DNNL_MUST(dnnl_primitive_attr_create(&attr));
    DNNL_MUST(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));

    if (dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_training,
                                                   dnnl_convolution_direct, &e->x_md, &w_any,
                                                   b_md, &e->y_md, strides, dil, pad,
                                                   pad) != dnnl_success) {
        rc = fl_fail(FL_EUNSUPPORTED, "onednn conv: oneDNN rejects the shape");
        goto done;
    }
    if ((rc = onednn_create(&e->fwd, &cd, attr, NULL, &fwd_pd, "conv forward")) < 0)
        goto done;
    if (dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &e->x_md,
                                                         &w_any, &e->y_md, strides, dil, pad,
                                                         pad) != dnnl_success) {
        rc = fl_fail(FL_EUNSUPPORTED, "onednn conv: oneDNN rejects the shape (backward data)");
        goto done;
    }
    if ((rc = onednn_create(&e->bwd_data, &cd, attr, fwd_pd, &bd_pd, "conv backward data")) < 0)
        goto done;
    if (dnnl_dilated_convolution_backward_weights_desc_init(
            &cd, dnnl_convolution_direct, &e->x_md, &w_any, b_md, &e->y_md, strides, dil, pad,
            pad) != dnnl_success) {
        rc = fl_fail(FL_EUNSUPPORTED, "onednn conv: oneDNN rejects the shape (backward weights)");
        goto done;
    }
    if ((rc = onednn_create(&e->bwd_w, &cd, attr, fwd_pd, &bw_pd, "conv backward weights")) < 0)
        goto done;

    e->wfwd_md = *dnnl_primitive_desc_query_md(fwd_pd, dnnl_query_weights_md, 0);
    e->wbwd_md = *dnnl_primitive_desc_query_md(bd_pd, dnnl_query_weights_md, 0);
    e->dw_md = *dnnl_primitive_desc_query_md(bw_pd, dnnl_query_diff_weights_md, 0);
    dnnl_primitive_desc_t pds[3] = {fwd_pd, bd_pd, bw_pd};
    for (int i = 0; i < 3; i++) {
        e->spad_md[i] = *dnnl_primitive_desc_query_md(pds[i], dnnl_query_scratchpad_md, 0);
        e->spad_bytes[i] = md_bytes(&e->spad_md[i]);
    }
    if (!dnnl_memory_desc_equal(&p->w_md, &e->wfwd_md) &&
        (rc = make_reorder(&e->w_fwd, &p->w_md, &e->wfwd_md, false)) < 0)
        goto done;
    if (!dnnl_memory_desc_equal(&p->w_md, &e->wbwd_md) &&
        (rc = make_reorder(&e->w_bwd, &p->w_md, &e->wbwd_md, false)) < 0)
        goto done;
    if (!dnnl_memory_desc_equal(&p->w_md, &e->dw_md) &&
        (rc = make_reorder(&e->dw_set, &e->dw_md, &p->w_md, false)) < 0)
        goto done;
    if ((rc = make_reorder(&e->dw_add, &e->dw_md, &p->w_md, true)) < 0)
        goto done;

    /* scratch: the largest scratchpad, then weights in either primitive's format or diff
     * weights; in the lent scratch when it fits (it does for the max batch at the thread
     * count of the plan's creation), else in a buffer of the plan's */
    size_t sp = 0, wb = md_bytes(&e->dw_md);
    for (int i = 0; i < 3; i++)
        sp = e->spad_bytes[i] > sp ? e->spad_bytes[i] : sp;
    if (e->w_fwd && md_bytes(&e->wfwd_md) > wb)
        wb = md_bytes(&e->wfwd_md);
    if (e->w_bwd && md_bytes(&e->wbwd_md) > wb)
        wb = md_bytes(&e->wbwd_md);
    e->wbuf_off = (sp + 63) / 64 * 64;
    e->bytes = e->wbuf_off + (wb + 63) / 64 * 64;
    if (first)
        p->lent = e->bytes;
    else if (e->bytes > p->lent && (rc = grow(&p->own, &p->own_bytes, e->bytes)) < 0)
        goto done;
done:
    if (fwd_pd)
        dnnl_primitive_desc_destroy(fwd_pd);
    if (bd_pd)
        dnnl_primitive_desc_destroy(bd_pd);
    if (bw_pd)
        dnnl_primitive_desc_destroy(bw_pd);
    dnnl_primitive_attr_destroy(attr);
    if (rc < 0)
        entry_clear(e);
    return rc;
}

/* The primitives for n images at the calling thread's thread count, built on first use. */
static conv_entry *entry_get(fl_conv_plan *p, int64_t n) {
    FL_ASSERT(n >= 1 && n <= p->d.max_batch);
    int nthr = onednn_threads();
    for (int i = 0; i < p->ne; i++)
        if (p->e[i].n == n && p->e[i].nthr == nthr)
            return &p->e[i];
    int slot;
    if (p->ne < MAX_ENTRIES) {
        slot = p->ne++;
    } else { /* keep entry 0 (max batch, the thread count at creation) */
        slot = 1 + p->evict;
        p->evict = (p->evict + 1) % (MAX_ENTRIES - 1);
        entry_clear(&p->e[slot]);
    }
    if (entry_init(p, &p->e[slot], n, false) < 0) {
        fprintf(stderr, "fleet: %s\n", fl_errmsg());
        FL_ASSERT(!"onednn conv: primitives for a smaller batch could not be built");
    }
    return &p->e[slot];
}

/* e's scratch: the lent one when e fits in it, else the plan's */
static char *scratch_for(const fl_conv_plan *p, const conv_entry *e, void *scratch) {
    char *s = e->bytes <= p->lent ? scratch : p->own;
    FL_ASSERT(s || e->bytes == 0);
    return s;
}

/* adds the scratchpad of primitive i (0 forward, 1 backward data, 2 backward weights) */
static void add_scratchpad(onednn_args *a, const conv_entry *e, int i, char *s) {
    if (e->spad_bytes[i])
        onednn_arg(a, DNNL_ARG_SCRATCHPAD, &e->spad_md[i], s);
}

/* user weights w into the primitive's format through r (into wbuf); returns what to pass */
static const void *weights_for(fl_conv_plan *p, dnnl_primitive_t r, const dnnl_memory_desc_t *md,
                               const void *w, char *wbuf) {
    if (!r)
        return w;
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_FROM, &p->w_md, w);
    onednn_arg(&a, DNNL_ARG_TO, md, wbuf);
    onednn_run(r, &a);
    return wbuf;
}

fl_conv_plan *onednn_conv_plan_create(const fl_conv_desc *d) {
    const fl_conv_geom *g = &d->g;
    if (d->dtype != FL_DTYPE_F32 && d->dtype != FL_DTYPE_F64) {
        fl_fail(FL_EINVAL, "onednn conv: dtype %s: need f32 or f64", fl_dtype_name(d->dtype));
        return NULL;
    }
    fl_conv_geom chk = *g;
    if (d->max_batch < 1 || d->oc < 1 || d->groups < 1 || g->c % d->groups ||
        d->oc % d->groups || !fl_conv_geom_out(&chk) || chk.oh != g->oh || chk.ow != g->ow) {
        fl_fail(FL_ESHAPE,
                "onednn conv: bad shape: batch %lld, %lld -> %lld channels in %lld groups, "
                "%lldx%lld input, %lldx%lld window, output %lldx%lld",
                (long long)d->max_batch, (long long)g->c, (long long)d->oc, (long long)d->groups,
                (long long)g->h, (long long)g->w, (long long)g->kh, (long long)g->kw,
                (long long)g->oh, (long long)g->ow);
        return NULL;
    }
    if (d->layout != FL_LAYOUT_NCHW && d->layout != FL_LAYOUT_NHWC) {
        fl_fail(FL_EINVAL, "onednn conv: unknown layout %d", (int)d->layout);
        return NULL;
    }
    fl_conv_plan *p = calloc(1, sizeof *p);
    if (!p) {
        fl_fail(FL_ENOMEM, "onednn conv: out of memory for a plan");
        return NULL;
    }
    p->d = *d;
    if (d->dtype == FL_DTYPE_F64) {
        if (d->layout != FL_LAYOUT_NCHW) {
            fl_fail(FL_EUNSUPPORTED, "onednn conv: f64 runs on the cpu table, NCHW only");
            goto fail;
        }
        if (!(p->cpu = onednn_cpu()->conv_plan_create(d)))
            goto fail;
        return p;
    }
    int64_t G = d->groups;
    if (G == 1) {
        dnnl_dims_t wd = {d->oc, g->c, g->kh, g->kw};
        DNNL_MUST(dnnl_memory_desc_init_by_tag(&p->w_md, 4, wd, dnnl_f32, dnnl_oihw));
    } else {
        dnnl_dims_t wd = {G, d->oc / G, g->c / G, g->kh, g->kw};
        DNNL_MUST(dnnl_memory_desc_init_by_tag(&p->w_md, 5, wd, dnnl_f32, dnnl_goihw));
    }
    p->b_md = onednn_vec_md(d->oc);
    if (d->bias && !(p->dbias = onednn_alloc((size_t)d->oc * sizeof(float))))
        goto fail;
    /* the max-batch primitives now, so that a shape oneDNN cannot run fails here */
    p->ne = 1;
    if (entry_init(p, &p->e[0], d->max_batch, true) < 0) {
        p->ne = 0;
        if (d->layout != FL_LAYOUT_NCHW)
            goto fail;
        /* NCHW: the cpu table's im2col convolution runs what oneDNN has no kernel for */
        if (!(p->cpu = onednn_cpu()->conv_plan_create(d)))
            goto fail;
        fl_clear_error();
        return p;
    }
    return p;
fail:
    onednn_conv_plan_free(p);
    return NULL;
}

void onednn_conv_plan_free(fl_conv_plan *p) {
    if (!p)
        return;
    if (p->cpu)
        onednn_cpu()->conv_plan_free(p->cpu);
    for (int i = 0; i < p->ne; i++)
        entry_clear(&p->e[i]);
    onednn_free(p->own);
    onednn_free(p->dbias);
    free(p);
}

size_t onednn_conv_scratch_bytes(const fl_conv_plan *p) {
    return p->cpu ? onednn_cpu()->conv_scratch_bytes(p->cpu) : p->lent;
}

void onednn_conv_forward(fl_conv_plan *p, int64_t n, const void *x, const void *w,
                         const void *bias, void *y, void *scratch) {
    if (p->cpu) {
        onednn_cpu()->conv_forward(p->cpu, n, x, w, bias, y, scratch);
        return;
    }
    FL_ASSERT((bias != NULL) == p->d.bias);
    if (n == 0)
        return;
    conv_entry *e = entry_get(p, n);
    char *s = scratch_for(p, e, scratch);
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_SRC, &e->x_md, x);
    onednn_arg(&a, DNNL_ARG_WEIGHTS, &e->wfwd_md,
               weights_for(p, e->w_fwd, &e->wfwd_md, w, s + e->wbuf_off));
    if (bias)
        onednn_arg(&a, DNNL_ARG_BIAS, &p->b_md, bias);
    onednn_arg(&a, DNNL_ARG_DST, &e->y_md, y);
    add_scratchpad(&a, e, 0, s);
    onednn_run(e->fwd, &a);
}

void onednn_conv_backward_data(fl_conv_plan *p, int64_t n, const void *dy, const void *w,
                               void *dx, void *scratch) {
    if (p->cpu) {
        onednn_cpu()->conv_backward_data(p->cpu, n, dy, w, dx, scratch);
        return;
    }
    if (n == 0)
        return;
    conv_entry *e = entry_get(p, n);
    char *s = scratch_for(p, e, scratch);
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_DIFF_DST, &e->y_md, dy);
    onednn_arg(&a, DNNL_ARG_WEIGHTS, &e->wbwd_md,
               weights_for(p, e->w_bwd, &e->wbwd_md, w, s + e->wbuf_off));
    onednn_arg(&a, DNNL_ARG_DIFF_SRC, &e->x_md, dx);
    add_scratchpad(&a, e, 1, s);
    onednn_run(e->bwd_data, &a);
}

void onednn_conv_backward_filter(fl_conv_plan *p, int64_t n, const void *x, const void *dy,
                                 void *dw, void *dbias, bool accumulate, void *scratch) {
    if (p->cpu) {
        onednn_cpu()->conv_backward_filter(p->cpu, n, x, dy, dw, dbias, accumulate, scratch);
        return;
    }
    FL_ASSERT(!dbias || p->d.bias);
    int64_t nw = p->d.oc * (p->d.g.c / p->d.groups) * p->d.g.kh * p->d.g.kw;
    if (n == 0) { /* no images: zero gradients, or nothing to add */
        if (!accumulate) {
            memset(dw, 0, (size_t)nw * sizeof(float));
            if (dbias)
                memset(dbias, 0, (size_t)p->d.oc * sizeof(float));
        }
        return;
    }
    conv_entry *e = entry_get(p, n);
    char *s = scratch_for(p, e, scratch), *dwbuf = s + e->wbuf_off;
    /* oneDNN overwrites its outputs: into the user's arrays directly when they have the
     * primitive's format and nothing is to be added, else into plan buffers first */
    bool direct_w = !accumulate && !e->dw_set;
    bool direct_b = !accumulate && dbias;
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_SRC, &e->x_md, x);
    onednn_arg(&a, DNNL_ARG_DIFF_DST, &e->y_md, dy);
    onednn_arg(&a, DNNL_ARG_DIFF_WEIGHTS, &e->dw_md, direct_w ? dw : (void *)dwbuf);
    if (p->d.bias)
        onednn_arg(&a, DNNL_ARG_DIFF_BIAS, &p->b_md, direct_b ? dbias : (void *)p->dbias);
    add_scratchpad(&a, e, 2, s);
    onednn_run(e->bwd_w, &a);
    if (!direct_w) {
        onednn_arg(&a, DNNL_ARG_FROM, &e->dw_md, dwbuf);
        onednn_arg(&a, DNNL_ARG_TO, &p->w_md, dw);
        onednn_run(accumulate ? e->dw_add : e->dw_set, &a);
    }
    if (dbias && !direct_b) {
        float *db = dbias;
        for (int64_t i = 0; i < p->d.oc; i++)
            db[i] += p->dbias[i];
    }
}
