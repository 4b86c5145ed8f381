/* onednn_conv.c - convolution through oneDNN primitives, with results that do not depend on the
 * thread count. oneDNN fixes a primitive's work split from the thread count when it creates it,
 * and splits the weight gradient's sum over the batch (and, on NCHW, gemm forwards' sums)
 * across threads; so those passes run on work pieces fixed by the shape and the batch size
 * alone, each a primitive created single-threaded and run on one thread, pieces in parallel:
 * - the weight gradient either in batch slots (at most SLOTS contiguous ranges of images, as
 *   the cpu table's conv.c does), the slots' partial gradients added in slot order, or, where
 *   adding partials would move more memory than the convolution's dy (small images, large
 *   kernels: ResNet's later stages), in blocks of output channels, each block's dw rows its
 *   own, nothing to add (dy copied into a dense block each);
 * - the NCHW forward in batch slots (no sums between images).
 * The channels-last depthwise weight gradient is onednn_dw.c's instead (no slots: its pieces are
 * its own), and channels-last 3x3 stride-1 convolutions' passes are onednn_wino.c's Winograd
 * where it measured faster (the plan decides at creation; FLEET_ONEDNN_WINOGRAD).
 * The NHWC forward and both layouts' backward data compute each output on one thread in an
 * order that does not depend on the thread count (the test checks 1-4 threads), so they keep
 * oneDNN's own threading; except where oneDNN runs one of them as a gemm (no direct kernel for
 * the shape on this CPU's instruction set: backward data of 1x1 NCHW and 3-channel inputs on
 * AVX2, grouped forwards on SSE4.1), which splits its sums across threads: such a primitive is
 * created and run single-threaded. Weights stay in PyTorch's (G)OIHW order for the caller and are
 * reordered each call into the format each primitive chose (format_tag_any). f64, and f32 NCHW
 * shapes oneDNN has no implementation for, run on a cpu-table plan kept inside this one.
 * Over 600 lines in one file: the plan, its three passes and their work pieces are one design
 * (results independent of the thread count) whose parts only make sense together. */
#include "onednn_impl.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Images are split into at most SLOTS contiguous ranges, whatever the thread count; each
 * range's weight gradient is a partial, added in range order. */
#define SLOTS 8
/* At most BLOCKS output-channel blocks (2 on NCHW), each a multiple of 16 channels (oneDNN's
 * blocking); four measured as fast as eight on ResNet-50's later layers, reading x half as
 * often. */
#define BLOCKS 4

/* Threaded sets kept per plan: the max batch, the last (smaller) batch of an epoch, and a few
 * more for changes of the thread count; beyond that the oldest but the first is replaced. */
#define MAX_ENTRIES 6
/* Single-threaded sets, one per (images, output channels) of a piece; a batch uses two sizes
 * at most. The first two (the max batch's) are kept, the others replaced in turn. */
#define MAX_SLOT_ENTRIES 6

/* oneDNN's own threading: forward (NHWC) and backward data for n images at nthr threads. */
typedef struct conv_entry {
    int64_t n;   /* images; 0: unused */
    int     nthr;
    dnnl_primitive_t fwd;          /* NULL where the forward runs in slots (NCHW) */
    dnnl_primitive_t bwd_data;
    bool fwd_serial, bwd_serial;   /* a gemm, created and run on one thread (gemm_serial) */
    dnnl_primitive_t w_fwd, w_bwd; /* user weights -> the primitive's format; NULL: same */
    dnnl_memory_desc_t x_md, y_md, wfwd_md, wbwd_md;
    dnnl_memory_desc_t spad_md[2]; /* fwd, bwd_data scratchpads */
    size_t spad_bytes[2];
    /* scratch: [0, wbuf_off) a scratchpad, then weights in a primitive's format; `bytes` in
     * all */
    size_t wbuf_off, bytes;
} conv_entry;

/* One piece's primitives, m images and oc output channels (all of them, or a block), created
 * while OpenMP's thread count was 1 so that their work split is the sequential one. */
typedef struct slot_entry {
    int64_t m, oc;                 /* m = 0: unused */
    dnnl_primitive_t fwd;          /* NCHW batch slots only */
    dnnl_primitive_t bwd_w;
    dnnl_primitive_t w_fwd;        /* user weights -> fwd's format; NULL: same */
    dnnl_primitive_t dw_set;       /* diff weights in bwd_w's format -> user; NULL: same */
    dnnl_primitive_t dw_add;       /* the same, added to the user's (a sum post-op) */
    dnnl_memory_desc_t w_md, b_md; /* the user's weights and bias of these oc channels */
    dnnl_memory_desc_t x_md, y_md, wfwd_md, dw_md;
    dnnl_memory_desc_t spad_md[2]; /* fwd, bwd_w scratchpads */
    size_t spad_bytes[2];
    /* a piece's region of scratch: the scratchpad, dw in bwd_w's format at dw_off, dbias at
     * db_off (OC floats); `bytes` in all */
    size_t dw_off, db_off, bytes;
} slot_entry;

struct fl_conv_plan {
    fl_conv_desc d;
    fl_conv_plan *cpu; /* non-NULL: every call goes to this cpu-table plan */
    bool slot_fwd;     /* the forward runs in batch slots (NCHW; NHWC: forward_splits) */
    bool dw_own;       /* NHWC depthwise: the weight gradient is onednn_dw.c's */
    bool wino;         /* NHWC 3x3 stride 1: forward and backward data are onednn_wino.c's */
    bool wino_w;       /* and the weight gradient */
    dnnl_memory_desc_t w_md, b_md; /* user weights (OC, IC/G, KH, KW) or (G, OC/G, ...); bias */
    conv_entry e[MAX_ENTRIES];
    int ne, evict;
    slot_entry se[MAX_SLOT_ENTRIES];
    int nse, sevict;
    size_t lent;        /* conv_scratch_bytes: what the max batch needs */
    void *own;          /* scratch for calls needing more than the lent (other thread counts,
                         * other batch sizes) */
    size_t own_bytes;
};

static void entry_clear(conv_entry *e) {
    dnnl_primitive_t *prims[] = {&e->fwd, &e->bwd_data, &e->w_fwd, &e->w_bwd};
    for (size_t i = 0; i < sizeof prims / sizeof prims[0]; i++) {
        if (*prims[i])
            dnnl_primitive_destroy(*prims[i]);
        *prims[i] = NULL;
    }
    e->n = 0;
}

static void slot_entry_clear(slot_entry *e) {
    dnnl_primitive_t *prims[] = {&e->fwd, &e->bwd_w, &e->w_fwd, &e->dw_set, &e->dw_add};
    for (size_t i = 0; i < sizeof prims / sizeof prims[0]; i++) {
        if (*prims[i])
            dnnl_primitive_destroy(*prims[i]);
        *prims[i] = NULL;
    }
    e->m = 0;
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
static size_t round64(size_t b) { return (b + 63) / 64 * 64; }

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

static dnnl_primitive_attr_t user_scratchpad_attr(void) {
    dnnl_primitive_attr_t attr;
    DNNL_MUST(dnnl_primitive_attr_create(&attr));
    DNNL_MUST(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    return attr;
}

/* A convolution's descriptors: x_md -> y_md with user weights w_md (taken as `any`), bias b_md
 * (NULL: none); stride, dilation (oneDNN's is D - 1) and padding (the right the left: PyTorch's
 * output size) from the plan. */
typedef struct conv_mds {
    const dnnl_memory_desc_t *x, *y, *b;
    dnnl_memory_desc_t w_any;
    dnnl_dims_t strides, dil, pad;
} conv_mds;

static conv_mds mds_of(const fl_conv_plan *p, const dnnl_memory_desc_t *x,
                       const dnnl_memory_desc_t *y, const dnnl_memory_desc_t *w,
                       const dnnl_memory_desc_t *b) {
    const fl_conv_geom *g = &p->d.g;
    conv_mds c = {.x = x, .y = y, .b = p->d.bias ? b : NULL};
    DNNL_MUST(dnnl_memory_desc_init_by_tag(&c.w_any, w->ndims, w->dims, dnnl_f32,
                                           dnnl_format_tag_any));
    c.strides[0] = g->sh, c.strides[1] = g->sw;
    c.dil[0] = g->dh - 1, c.dil[1] = g->dw - 1;
    c.pad[0] = g->ph, c.pad[1] = g->pw;
    return c;
}

/* Whether oneDNN's implementation of pd sums in an order set by the thread count it was created
 * for: a gemm ("gemm:jit", "gemm:ref") splits its sums across threads; a brgemm convolution
 * ("brgconv", "brgconv_1x1", on AVX-512) picks its blocking for that count (on a Xeon with
 * AVX-512 a 5 -> 4 channel 3x7 stride-2 dilated NHWC forward gave other bits with 3 threads than
 * with 1). Such a primitive is created and run single-threaded, or in batch slots. */
static bool thread_split_impl(const_dnnl_primitive_desc_t pd) {
    const char *impl = NULL;
    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
           impl && (strstr(impl, "gemm") || strstr(impl, "brgconv"));
}

/* Runs prim on one thread when serial (created single-threaded: thread_split_impl), else with
 * oneDNN's own threading. */
static void run_maybe_serial(dnnl_primitive_t prim, onednn_args *a, bool serial) {
    if (!serial) {
        onednn_run(prim, a);
        return;
    }
    int nthr = omp_get_max_threads();
    omp_set_num_threads(1);
    onednn_run(prim, a);
    omp_set_num_threads(nthr);
}

/* The forward primitive descriptor (the backward ones' required hint). */
static int fwd_pd_create(conv_mds *c, const_dnnl_primitive_attr_t attr,
                         dnnl_primitive_desc_t *pd) {
    dnnl_convolution_desc_t cd;
    *pd = NULL;
    if (dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_training,
                                                   dnnl_convolution_direct, c->x, &c->w_any,
                                                   c->b, c->y, c->strides, c->dil, c->pad,
                                                   c->pad) != dnnl_success)
        return fl_fail(FL_EUNSUPPORTED, "onednn conv: oneDNN rejects the shape");
    if (dnnl_primitive_desc_create(pd, &cd, attr, onednn_engine(), NULL) != dnnl_success) {
        *pd = NULL;
        return fl_fail(FL_EUNSUPPORTED, "onednn conv: conv forward: no implementation");
    }
    return 0;
}

/* Whether the threaded forward of n images would sum in an order set by the thread count
 * (thread_split_impl): an NHWC plan then runs its forward in batch slots, as NCHW plans do, so
 * that the threads share whole images instead of one thread running the batch. */
static bool forward_splits(const fl_conv_plan *p, int64_t n) {
    const fl_conv_desc *d = &p->d;
    const fl_conv_geom *g = &d->g;
    dnnl_memory_desc_t x = onednn_act_md(d->layout, n, g->c, g->h, g->w);
    dnnl_memory_desc_t y = onednn_act_md(d->layout, n, d->oc, g->oh, g->ow);
    conv_mds c = mds_of(p, &x, &y, &p->w_md, &p->b_md);
    dnnl_primitive_attr_t attr = user_scratchpad_attr();
    dnnl_primitive_desc_t pd;
    bool split = false;
    if (fwd_pd_create(&c, attr, &pd) == 0) {
        split = thread_split_impl(pd);
        dnnl_primitive_desc_destroy(pd);
    } else {
        fl_clear_error(); /* entry_init says why, below */
    }
    dnnl_primitive_attr_destroy(attr);
    return split;
}

/* Builds e's primitives for n images at the current thread count. */
static int entry_init(fl_conv_plan *p, conv_entry *e, int64_t n) {
    const fl_conv_desc *d = &p->d;
    const fl_conv_geom *g = &d->g;
    memset(e, 0, sizeof *e);
    e->n = n;
    e->nthr = onednn_threads();
    e->x_md = onednn_act_md(d->layout, n, g->c, g->h, g->w);
    e->y_md = onednn_act_md(d->layout, n, d->oc, g->oh, g->ow);
    conv_mds c = mds_of(p, &e->x_md, &e->y_md, &p->w_md, &p->b_md);
    dnnl_primitive_attr_t attr = user_scratchpad_attr();
    dnnl_primitive_desc_t fwd_pd = NULL, bd_pd = NULL;
    dnnl_convolution_desc_t cd;
    int rc;
    int nthr = omp_get_max_threads();
    if ((rc = fwd_pd_create(&c, attr, &fwd_pd)) < 0)
        goto done;
    if (!p->slot_fwd && thread_split_impl(fwd_pd)) { /* again, single-threaded */
        dnnl_primitive_desc_destroy(fwd_pd);
        omp_set_num_threads(1);
        rc = fwd_pd_create(&c, attr, &fwd_pd);
        e->fwd_serial = true;
        if (rc < 0)
            goto done;
    }
    if (!p->slot_fwd && dnnl_primitive_create(&e->fwd, fwd_pd) != dnnl_success) {
        e->fwd = NULL;
        rc = fl_fail(FL_EUNSUPPORTED, "onednn conv: conv forward: primitive creation failed");
        goto done;
    }
    omp_set_num_threads(nthr);
    if (dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, c.x,
                                                         &c.w_any, c.y, c.strides, c.dil, c.pad,
                                                         c.pad) != dnnl_success) {
        rc = fl_fail(FL_EUNSUPPORTED, "onednn conv: oneDNN rejects the shape (backward data)");
        goto done;
    }
    if ((rc = onednn_create(&e->bwd_data, &cd, attr, fwd_pd, &bd_pd, "conv backward data")) < 0)
        goto done;
    if (thread_split_impl(bd_pd)) { /* again, single-threaded */
        dnnl_primitive_destroy(e->bwd_data);
        dnnl_primitive_desc_destroy(bd_pd);
        omp_set_num_threads(1);
        rc = onednn_create(&e->bwd_data, &cd, attr, fwd_pd, &bd_pd, "conv backward data");
        omp_set_num_threads(nthr);
        e->bwd_serial = true;
        if (rc < 0)
            goto done;
    }
    e->wfwd_md = *dnnl_primitive_desc_query_md(fwd_pd, dnnl_query_weights_md, 0);
    e->wbwd_md = *dnnl_primitive_desc_query_md(bd_pd, dnnl_query_weights_md, 0);
    if (e->fwd) {
        e->spad_md[0] = *dnnl_primitive_desc_query_md(fwd_pd, dnnl_query_scratchpad_md, 0);
        e->spad_bytes[0] = md_bytes(&e->spad_md[0]);
    }
    e->spad_md[1] = *dnnl_primitive_desc_query_md(bd_pd, dnnl_query_scratchpad_md, 0);
    e->spad_bytes[1] = md_bytes(&e->spad_md[1]);
    if (e->fwd && !dnnl_memory_desc_equal(&p->w_md, &e->wfwd_md) &&
        (rc = make_reorder(&e->w_fwd, &p->w_md, &e->wfwd_md, false)) < 0)
        goto done;
    if (!dnnl_memory_desc_equal(&p->w_md, &e->wbwd_md) &&
        (rc = make_reorder(&e->w_bwd, &p->w_md, &e->wbwd_md, false)) < 0)
        goto done;
    /* scratch: the larger scratchpad, then weights in either primitive's format */
    size_t sp = e->spad_bytes[0] > e->spad_bytes[1] ? e->spad_bytes[0] : e->spad_bytes[1];
    size_t wb = e->w_fwd ? md_bytes(&e->wfwd_md) : 0;
    if (e->w_bwd && md_bytes(&e->wbwd_md) > wb)
        wb = md_bytes(&e->wbwd_md);
    e->wbuf_off = round64(sp);
    e->bytes = e->wbuf_off + round64(wb);
done:
    omp_set_num_threads(nthr);
    if (fwd_pd)
        dnnl_primitive_desc_destroy(fwd_pd);
    if (bd_pd)
        dnnl_primitive_desc_destroy(bd_pd);
    dnnl_primitive_attr_destroy(attr);
    if (rc < 0)
        entry_clear(e);
    return rc;
}

/* Builds the single-threaded primitives of a piece of m images and oc output channels (oc <
 * OC: a block, groups = 1). oneDNN sizes a primitive's work split by omp_get_max_threads() when
 * it creates it (and keys its primitive cache by it), so OpenMP's count is 1 meanwhile; run on
 * one thread (run_pieces), the primitive then computes the sequential way. */
static int slot_entry_init(fl_conv_plan *p, slot_entry *e, int64_t m, int64_t oc) {
    const fl_conv_desc *d = &p->d;
    const fl_conv_geom *g = &d->g;
    memset(e, 0, sizeof *e);
    e->m = m;
    e->oc = oc;
    e->w_md = p->w_md;
    e->b_md = p->b_md;
    if (oc != d->oc) {
        dnnl_dims_t wd = {oc, g->c, g->kh, g->kw};
        DNNL_MUST(dnnl_memory_desc_init_by_tag(&e->w_md, 4, wd, dnnl_f32, dnnl_oihw));
        e->b_md = onednn_vec_md(oc);
    }
    e->x_md = onednn_act_md(d->layout, m, g->c, g->h, g->w);
    e->y_md = onednn_act_md(d->layout, m, oc, g->oh, g->ow);
    conv_mds c = mds_of(p, &e->x_md, &e->y_md, &e->w_md, &e->b_md);
    dnnl_primitive_attr_t attr = user_scratchpad_attr();
    dnnl_primitive_desc_t fwd_pd = NULL, bw_pd = NULL;
    dnnl_convolution_desc_t cd;
    int nthr = omp_get_max_threads(), rc;
    omp_set_num_threads(1);
    if ((rc = fwd_pd_create(&c, attr, &fwd_pd)) < 0)
        goto done;
    if (p->slot_fwd && oc == d->oc && dnnl_primitive_create(&e->fwd, fwd_pd) != dnnl_success) {
        e->fwd = NULL;
        rc = fl_fail(FL_EUNSUPPORTED, "onednn conv: conv forward: primitive creation failed");
        goto done;
    }
    if (dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, c.x,
                                                            &c.w_any, c.b, c.y, c.strides,
                                                            c.dil, c.pad, c.pad) != dnnl_success) {
        rc = fl_fail(FL_EUNSUPPORTED, "onednn conv: oneDNN rejects the shape (backward weights)");
        goto done;
    }
    if ((rc = onednn_create(&e->bwd_w, &cd, attr, fwd_pd, &bw_pd, "conv backward weights")) < 0)
        goto done;
    e->wfwd_md = *dnnl_primitive_desc_query_md(fwd_pd, dnnl_query_weights_md, 0);
    e->dw_md = *dnnl_primitive_desc_query_md(bw_pd, dnnl_query_diff_weights_md, 0);
    if (e->fwd) {
        e->spad_md[0] = *dnnl_primitive_desc_query_md(fwd_pd, dnnl_query_scratchpad_md, 0);
        e->spad_bytes[0] = md_bytes(&e->spad_md[0]);
    }
    e->spad_md[1] = *dnnl_primitive_desc_query_md(bw_pd, dnnl_query_scratchpad_md, 0);
    e->spad_bytes[1] = md_bytes(&e->spad_md[1]);
    if (e->fwd && !dnnl_memory_desc_equal(&e->w_md, &e->wfwd_md) &&
        (rc = make_reorder(&e->w_fwd, &e->w_md, &e->wfwd_md, false)) < 0)
        goto done;
    if (!dnnl_memory_desc_equal(&e->w_md, &e->dw_md) &&
        (rc = make_reorder(&e->dw_set, &e->dw_md, &e->w_md, false)) < 0)
        goto done;
    if ((rc = make_reorder(&e->dw_add, &e->dw_md, &e->w_md, true)) < 0)
        goto done;
    size_t sp = e->spad_bytes[0] > e->spad_bytes[1] ? e->spad_bytes[0] : e->spad_bytes[1];
    e->dw_off = round64(sp);
    e->db_off = e->dw_off + round64(md_bytes(&e->dw_md));
    e->bytes = e->db_off + round64((size_t)oc * sizeof(float));
done:
    omp_set_num_threads(nthr);
    if (fwd_pd)
        dnnl_primitive_desc_destroy(fwd_pd);
    if (bw_pd)
        dnnl_primitive_desc_destroy(bw_pd);
    dnnl_primitive_attr_destroy(attr);
    if (rc < 0)
        slot_entry_clear(e);
    return rc;
}

/* The threaded primitives for n images at the calling thread's thread count, built on first
 * use. */
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
    if (entry_init(p, &p->e[slot], n) < 0) {
        fprintf(stderr, "fleet: %s\n", fl_errmsg());
        FL_ASSERT(!"onednn conv: primitives for a smaller batch could not be built");
    }
    return &p->e[slot];
}

/* The single-threaded primitives for pieces of m images and oc channels, built on first use;
 * a call uses two sizes at most, and the second fetch must not replace the first (`keep`). */
static slot_entry *slot_entry_get(fl_conv_plan *p, int64_t m, int64_t oc, const slot_entry *keep) {
    FL_ASSERT(m >= 1 && m <= p->d.max_batch);
    for (int i = 0; i < p->nse; i++)
        if (p->se[i].m == m && p->se[i].oc == oc)
            return &p->se[i];
    int slot;
    if (p->nse < MAX_SLOT_ENTRIES) {
        slot = p->nse++;
    } else { /* keep entries 0 and 1 (the max batch's), and `keep` */
        do {
            slot = 2 + p->sevict;
            p->sevict = (p->sevict + 1) % (MAX_SLOT_ENTRIES - 2);
        } while (&p->se[slot] == keep);
        slot_entry_clear(&p->se[slot]);
    }
    if (slot_entry_init(p, &p->se[slot], m, oc) < 0) {
        fprintf(stderr, "fleet: %s\n", fl_errmsg());
        FL_ASSERT(!"onednn conv: single-threaded primitives could not be built");
    }
    return &p->se[slot];
}

/* --- pieces: batch slots and output-channel blocks --- */

/* The number of output-channel blocks for the weight gradient of b images, or 1 for batch
 * slots; fixed by the shape and b alone. Blocks (groups = 1, OC a multiple of 16: nb equal
 * blocks of a multiple of 16 channels, the largest nb <= BLOCKS that divides) where they move
 * less memory than the slots: the slots write and read back (slots - 1) partial weight
 * gradients, 2 (ns - 1) W floats; the blocks copy dy, 2 |dy|, and read x once per block,
 * (nb - 1) |x| more, KH KW times that on NCHW, whose gemm-based kernels build im2col's column
 * matrix from x in each block. Measured (ResNet-50, batch 8, 1 thread, backward weights, NHWC):
 * a 512x512 3x3 layer on 7x7 takes 7.7 ms whole, 7.9 ms in 4 blocks, 14.6 ms in 8 one-image
 * slots (the partials, and oneDNN's kernels slower on one image); a 256x128 1x1 on 56x56
 * takes 7.6 ms whole, 7.7 ms in slots, 9.7 ms in 4 blocks (x read four times). */
static int oc_blocks(const fl_conv_plan *p, int64_t b) {
    const fl_conv_desc *d = &p->d;
    const fl_conv_geom *g = &d->g;
    bool nhwc = d->layout == FL_LAYOUT_NHWC;
    if (d->groups != 1 || d->oc % 16)
        return 1;
    int nb = 1;
    for (int k = 2; k <= (nhwc ? BLOCKS : 2); k++)
        if ((d->oc / 16) % k == 0)
            nb = k;
    double ns = (double)(b < SLOTS ? b : SLOTS), w = (double)(d->oc * g->c * g->kh * g->kw);
    double x = (double)(b * g->c * g->h * g->w), dy = (double)(b * d->oc * g->oh * g->ow);
    if (!nhwc)
        x *= (double)(g->kh * g->kw);
    return nb > 1 && 2 * dy + (nb - 1) * x < 2 * (ns - 1) * w ? nb : 1;
}

/* The pieces of one call over b images: batch slots (nb = 1: slot s holds images [lo[s],
 * lo[s + 1]), lo[s] = b s / ns with ns = min(b, SLOTS), so sizes floor or ceil of b / ns, the
 * entries u[0] and u[1], equal when the sizes are) or nb output-channel blocks of all b images
 * (entry u[0] = u[1]). Scratch: the weights in each entry's forward format (a slotted forward),
 * then one region per piece (a block's holds its slice of dy after the entry's). */
typedef struct piece_plan {
    int np, nb;
    int64_t b, lo[SLOTS + 1];
    slot_entry *u[2];
    size_t woff[2]; /* weights in u[k]'s forward format (where u[k]->w_fwd) */
    size_t dy_off;  /* in a block's region: its dy */
    size_t base, stride, bytes;
} piece_plan;

static void piece_plan_for(fl_conv_plan *p, int64_t b, bool fwd, piece_plan *pp) {
    const fl_conv_desc *d = &p->d;
    pp->b = b;
    pp->nb = fwd ? 1 : oc_blocks(p, b);
    size_t off = 0;
    if (pp->nb > 1) {
        pp->np = pp->nb;
        pp->u[0] = pp->u[1] = slot_entry_get(p, b, d->oc / pp->nb, NULL);
        pp->woff[0] = pp->woff[1] = 0;
        pp->dy_off = pp->u[0]->bytes;
        pp->stride = pp->dy_off +
                     round64((size_t)(b * d->g.oh * d->g.ow * pp->u[0]->oc) * sizeof(float));
    } else {
        pp->np = (int)(b < SLOTS ? b : SLOTS);
        for (int s = 0; s <= pp->np; s++)
            pp->lo[s] = b * s / pp->np;
        int64_t m0 = b / pp->np, m1 = b % pp->np ? m0 + 1 : m0;
        pp->u[0] = slot_entry_get(p, m0, d->oc, NULL);
        pp->u[1] = m1 == m0 ? pp->u[0] : slot_entry_get(p, m1, d->oc, pp->u[0]);
        for (int k = 0; k < 2; k++) {
            pp->woff[k] = off;
            if (fwd && pp->u[k]->w_fwd && (k == 0 || pp->u[1] != pp->u[0]))
                off += round64(md_bytes(&pp->u[k]->wfwd_md));
        }
        if (pp->u[1] == pp->u[0])
            pp->woff[1] = pp->woff[0];
        pp->dy_off = 0;
        pp->stride = pp->u[0]->bytes > pp->u[1]->bytes ? pp->u[0]->bytes : pp->u[1]->bytes;
    }
    pp->base = off;
    pp->bytes = pp->base + (size_t)pp->np * pp->stride;
}

/* batch slot s's entry index (0 or 1), and piece s's region of the scratch s0 */
static int slot_kind(const piece_plan *pp, int s) {
    return pp->lo[s + 1] - pp->lo[s] == pp->u[0]->m ? 0 : 1;
}
static char *piece_region(const piece_plan *pp, char *s0, int s) {
    return s0 + pp->base + (size_t)s * pp->stride;
}

/* The scratch for `bytes`: the lent one when it fits (the max batch at the plan's creation
 * thread count always does), else the plan's, grown as needed. */
static char *scratch_for(fl_conv_plan *p, size_t bytes, void *scratch) {
    if (bytes <= p->lent)
        return scratch;
    FL_ASSERT(grow(&p->own, &p->own_bytes, bytes) == 0);
    return p->own;
}

/* Runs fn(ctx, s) for the n pieces, in parallel over pieces when OpenMP allows more than one
 * thread; any assignment of pieces to threads gives the same bits. Each piece's oneDNN calls
 * run on one thread: inside an active parallel region oneDNN's parallel loops take one
 * thread, and OpenMP's count is 1 for the calls made outside one (one thread, or one piece),
 * so that no gemm inside spawns threads either. */
static void run_pieces(int n, void (*fn)(void *ctx, int s), void *ctx) {
    int nthr = omp_get_max_threads(), team = nthr < n ? nthr : n;
#pragma omp parallel for schedule(static) num_threads(team > 1 ? team : 1) if (team > 1)
    for (int s = 0; s < n; s++) {
        omp_set_num_threads(1);
        fn(ctx, s);
    }
    omp_set_num_threads(nthr);
}

/* dst[i] = (acc ? dst[i] : 0) + (((part[0][i] + part[1][i]) + part[2][i]) + ...), n floats;
 * part[0] may be dst. Elementwise, so any split over threads gives the same bits. */
#define SUM_CHUNK 1024
static void add_partials(float *dst, float *const *part, int np, int64_t n, bool acc) {
    int64_t nchunk = (n + SUM_CHUNK - 1) / SUM_CHUNK;
#pragma omp parallel for schedule(static) if (n * np >= 65536)
    for (int64_t c = 0; c < nchunk; c++) {
        int64_t i0 = c * SUM_CHUNK, len = n - i0 < SUM_CHUNK ? n - i0 : SUM_CHUNK;
        float t[SUM_CHUNK];
        memcpy(t, part[0] + i0, (size_t)len * sizeof(float));
        for (int s = 1; s < np; s++) {
            const float *q = part[s] + i0;
#pragma omp simd
            for (int64_t i = 0; i < len; i++)
                t[i] += q[i];
        }
        float *o = dst + i0;
        if (acc) {
#pragma omp simd
            for (int64_t i = 0; i < len; i++)
                o[i] += t[i];
        } else {
            memcpy(o, t, (size_t)len * sizeof(float));
        }
    }
}

static void add_scratchpad(onednn_args *a, const dnnl_memory_desc_t *md, size_t bytes, char *s) {
    if (bytes)
        onednn_arg(a, DNNL_ARG_SCRATCHPAD, md, s);
}

/* weights w (in format `from`) into md through r (into wbuf); returns what to pass */
static const void *weights_for(dnnl_primitive_t r, const dnnl_memory_desc_t *from,
                               const dnnl_memory_desc_t *md, const void *w, char *wbuf) {
    if (!r)
        return w;
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_FROM, from, w);
    onednn_arg(&a, DNNL_ARG_TO, md, wbuf);
    onednn_run(r, &a);
    return wbuf;
}

/* the arguments of one call's pieces */
typedef struct piece_call {
    const fl_conv_plan *p;
    const piece_plan *pp;
    char *s0;
    const float *x, *dy, *bias;
    const void *w[2]; /* the forward's weights for u[0], u[1] */
    float *y;
    float *dw, *db;   /* the user's gradients */
    bool acc;
    bool direct_w, direct_b; /* batch slot 0 writes dw, db itself */
} piece_call;

static void fwd_slot(void *ctx, int s) {
    const piece_call *c = ctx;
    const fl_conv_desc *d = &c->p->d;
    int k = slot_kind(c->pp, s);
    const slot_entry *e = c->pp->u[k];
    int64_t lo = c->pp->lo[s];
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_SRC, &e->x_md, c->x + lo * d->g.c * d->g.h * d->g.w);
    onednn_arg(&a, DNNL_ARG_WEIGHTS, &e->wfwd_md, c->w[k]);
    if (c->bias)
        onednn_arg(&a, DNNL_ARG_BIAS, &e->b_md, c->bias);
    onednn_arg(&a, DNNL_ARG_DST, &e->y_md, c->y + lo * d->oc * d->g.oh * d->g.ow);
    add_scratchpad(&a, &e->spad_md[0], e->spad_bytes[0], piece_region(c->pp, c->s0, s));
    onednn_run(e->fwd, &a);
}

/* batch slot s: its images' dw and dbias into its region (slot 0: the user's, when direct) */
static void bwd_w_slot(void *ctx, int s) {
    const piece_call *c = ctx;
    const fl_conv_desc *d = &c->p->d;
    const slot_entry *e = c->pp->u[slot_kind(c->pp, s)];
    int64_t lo = c->pp->lo[s];
    char *r = piece_region(c->pp, c->s0, s);
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_SRC, &e->x_md, c->x + lo * d->g.c * d->g.h * d->g.w);
    onednn_arg(&a, DNNL_ARG_DIFF_DST, &e->y_md, c->dy + lo * d->oc * d->g.oh * d->g.ow);
    onednn_arg(&a, DNNL_ARG_DIFF_WEIGHTS, &e->dw_md,
               s == 0 && c->direct_w ? (void *)c->dw : r + e->dw_off);
    if (d->bias)
        onednn_arg(&a, DNNL_ARG_DIFF_BIAS, &e->b_md,
                   s == 0 && c->direct_b ? (void *)c->db : r + e->db_off);
    add_scratchpad(&a, &e->spad_md[1], e->spad_bytes[1], r);
    onednn_run(e->bwd_w, &a);
}

/* output-channel block s: dy's channels [o0, o0 + OCB) copied dense, then the block's dw rows
 * and dbias entries, written or added to the user's (no other block touches them) */
static void bwd_w_block(void *ctx, int s) {
    const piece_call *c = ctx;
    const fl_conv_desc *d = &c->p->d;
    const slot_entry *e = c->pp->u[0];
    int64_t ocb = e->oc, o0 = s * ocb, ohw = d->g.oh * d->g.ow, b = c->pp->b;
    int64_t kg = d->g.c * d->g.kh * d->g.kw;
    char *r = piece_region(c->pp, c->s0, s);
    float *dyb = (float *)(r + c->pp->dy_off);
    if (d->layout == FL_LAYOUT_NHWC) {
        for (int64_t q = 0; q < b * ohw; q++)
            memcpy(dyb + q * ocb, c->dy + q * d->oc + o0, (size_t)ocb * sizeof(float));
    } else {
        for (int64_t i = 0; i < b; i++)
            memcpy(dyb + i * ocb * ohw, c->dy + (i * d->oc + o0) * ohw,
                   (size_t)(ocb * ohw) * sizeof(float));
    }
    float *dw = c->dw + o0 * kg, *db = c->db ? c->db + o0 : NULL;
    bool direct_w = !c->acc && !e->dw_set, direct_b = !c->acc && db;
    float *tw = (float *)(r + e->dw_off), *tb = (float *)(r + e->db_off);
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_SRC, &e->x_md, c->x);
    onednn_arg(&a, DNNL_ARG_DIFF_DST, &e->y_md, dyb);
    onednn_arg(&a, DNNL_ARG_DIFF_WEIGHTS, &e->dw_md, direct_w ? dw : tw);
    if (d->bias)
        onednn_arg(&a, DNNL_ARG_DIFF_BIAS, &e->b_md, direct_b ? db : tb);
    add_scratchpad(&a, &e->spad_md[1], e->spad_bytes[1], r);
    onednn_run(e->bwd_w, &a);
    if (!direct_w) {
        onednn_arg(&a, DNNL_ARG_FROM, &e->dw_md, tw);
        onednn_arg(&a, DNNL_ARG_TO, &e->w_md, dw);
        onednn_run(c->acc ? e->dw_add : e->dw_set, &a);
    }
    if (db && !direct_b)
        for (int64_t i = 0; i < ocb; i++)
            db[i] += tb[i];
}

/* --- the table's entry points --- */

/* Whether d's forward and backward data (wgrad: its weight gradient) run Winograd
 * (onednn_wino.c): env FLEET_ONEDNN_WINOGRAD, read at each plan's creation, 0 never, 1
 * wherever onednn_wino.c can (tests, measurements), unset or anything else where it measured
 * faster than oneDNN. */
static bool wino_wanted(const fl_conv_desc *d, bool wgrad) {
    if (!onednn_wino_supported(d))
        return false;
    const char *e = getenv("FLEET_ONEDNN_WINOGRAD");
    if (e && strcmp(e, "0") == 0)
        return false;
    if (e && strcmp(e, "1") == 0)
        return true;
    return wgrad ? onednn_wino_wgrad_faster(d) : onednn_wino_faster(d);
}

fl_conv_plan *onednn_conv_plan_create(const fl_conv_desc *d) {
    const fl_conv_geom *g = &d->g;
    if (fl_conv_desc_check(d, "onednn conv") < 0)
        return NULL;
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
    p->dw_own = d->layout == FL_LAYOUT_NHWC && G == g->c && G == d->oc && onednn_dw_supported(g);
    p->wino = wino_wanted(d, false);
    p->slot_fwd = d->layout == FL_LAYOUT_NCHW || (!p->wino && forward_splits(p, d->max_batch));
    p->wino_w = p->wino && wino_wanted(d, true);
    /* the max batch's primitives now (the pieces of its weight gradient, and of its forward
     * where that runs in slots), so that a shape oneDNN cannot run fails here */
    int64_t b = d->max_batch, ns = b < SLOTS ? b : SLOTS, nb = oc_blocks(p, b);
    int64_t m[4] = {b / ns, b % ns ? b / ns + 1 : b / ns, 0, 0}, moc[4] = {d->oc, d->oc};
    int nm = p->dw_own ? 0 : m[1] != m[0] ? 2 : 1;
    if (nb > 1) { /* blocks for the weight gradient, slots for a slotted forward */
        if (!p->slot_fwd)
            nm = 0;
        m[nm] = b, moc[nm] = d->oc / nb, nm++;
    }
    int rc = entry_init(p, &p->e[0], b);
    for (int i = 0; i < nm && rc == 0; i++)
        if ((rc = slot_entry_init(p, &p->se[i], m[i], moc[i])) == 0)
            p->nse = i + 1;
    if (rc < 0) {
        entry_clear(&p->e[0]);
        for (int i = 0; i < p->nse; i++)
            slot_entry_clear(&p->se[i]);
        p->nse = 0;
        if (d->layout != FL_LAYOUT_NCHW)
            goto fail;
        /* NCHW: the cpu table's im2col convolution runs what oneDNN has no kernel for */
        if (!(p->cpu = onednn_cpu()->conv_plan_create(d)))
            goto fail;
        fl_clear_error();
        return p;
    }
    p->ne = 1;
    piece_plan pw, pf;
    p->lent = p->e[0].bytes;
    if (p->dw_own) {
        size_t dwb = onednn_dw_scratch_bytes(g, b);
        p->lent = dwb > p->lent ? dwb : p->lent;
    } else {
        piece_plan_for(p, b, false, &pw);
        p->lent = pw.bytes > p->lent ? pw.bytes : p->lent;
    }
    if (p->wino) {
        size_t wb = onednn_wino_scratch_bytes(d);
        size_t wg = p->wino_w ? onednn_wino_wgrad_scratch_bytes(d, b) : 0;
        wb = wg > wb ? wg : wb;
        p->lent = wb > p->lent ? wb : p->lent;
    }
    if (p->slot_fwd) {
        piece_plan_for(p, b, true, &pf);
        p->lent = pf.bytes > p->lent ? pf.bytes : p->lent;
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
    for (int i = 0; i < p->nse; i++)
        slot_entry_clear(&p->se[i]);
    onednn_free(p->own);
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
    if (p->wino) {
        onednn_wino_forward(&p->d, n, x, w, bias, y,
                            scratch_for(p, onednn_wino_scratch_bytes(&p->d), scratch));
        return;
    }
    if (p->slot_fwd) {
        piece_plan pp;
        piece_plan_for(p, n, true, &pp);
        char *s = scratch_for(p, pp.bytes, scratch);
        piece_call c = {.p = p, .pp = &pp, .s0 = s, .x = x, .bias = bias, .y = y};
        for (int k = 0; k < 2; k++)
            c.w[k] = k == 1 && pp.u[1] == pp.u[0]
                         ? c.w[0]
                         : weights_for(pp.u[k]->w_fwd, &p->w_md, &pp.u[k]->wfwd_md, w,
                                       s + pp.woff[k]);
        run_pieces(pp.np, fwd_slot, &c);
        return;
    }
    conv_entry *e = entry_get(p, n);
    char *s = scratch_for(p, e->bytes, scratch);
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_SRC, &e->x_md, x);
    onednn_arg(&a, DNNL_ARG_WEIGHTS, &e->wfwd_md,
               weights_for(e->w_fwd, &p->w_md, &e->wfwd_md, w, s + e->wbuf_off));
    if (bias)
        onednn_arg(&a, DNNL_ARG_BIAS, &p->b_md, bias);
    onednn_arg(&a, DNNL_ARG_DST, &e->y_md, y);
    add_scratchpad(&a, &e->spad_md[0], e->spad_bytes[0], s);
    run_maybe_serial(e->fwd, &a, e->fwd_serial);
}

void onednn_conv_backward_data(fl_conv_plan *p, int64_t n, const void *dy, const void *w,
                               void *dx, void *scratch) {
    if (p->cpu) {
        onednn_cpu()->conv_backward_data(p->cpu, n, dy, w, dx, scratch);
        return;
    }
    if (n == 0)
        return;
    if (p->wino) {
        onednn_wino_backward_data(&p->d, n, dy, w, dx,
                                  scratch_for(p, onednn_wino_scratch_bytes(&p->d), scratch));
        return;
    }
    conv_entry *e = entry_get(p, n);
    char *s = scratch_for(p, e->bytes, scratch);
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_DIFF_DST, &e->y_md, dy);
    onednn_arg(&a, DNNL_ARG_WEIGHTS, &e->wbwd_md,
               weights_for(e->w_bwd, &p->w_md, &e->wbwd_md, w, s + e->wbuf_off));
    onednn_arg(&a, DNNL_ARG_DIFF_SRC, &e->x_md, dx);
    add_scratchpad(&a, &e->spad_md[1], e->spad_bytes[1], s);
    run_maybe_serial(e->bwd_data, &a, e->bwd_serial);
}

/* Batch slots' partials, each in its slot's region (slot 0's possibly in the user's arrays
 * already), added in slot order into dw and dbias. */
static void add_slot_partials(fl_conv_plan *p, const piece_plan *pp, const piece_call *c) {
    int64_t nw = p->d.oc * (p->d.g.c / p->d.groups) * p->d.g.kh * p->d.g.kw;
    float *part[SLOTS];
    const slot_entry *e0 = pp->u[0];
    if (pp->u[1] == e0 || dnnl_memory_desc_equal(&e0->dw_md, &pp->u[1]->dw_md)) {
        /* one format: summed in it, into the user's dw when that is the format, else into
         * slot 0's partial, then reordered (or added) to dw */
        for (int i = 0; i < pp->np; i++)
            part[i] = (float *)(piece_region(pp, c->s0, i) + pp->u[slot_kind(pp, i)]->dw_off);
        if (c->direct_w)
            part[0] = c->dw;
        if (!e0->dw_set) {
            add_partials(c->dw, part, pp->np, nw, c->acc);
        } else {
            add_partials(part[0], part, pp->np, (int64_t)(md_bytes(&e0->dw_md) / sizeof(float)),
                         false);
            onednn_args a = {0};
            onednn_arg(&a, DNNL_ARG_FROM, &e0->dw_md, part[0]);
            onednn_arg(&a, DNNL_ARG_TO, &p->w_md, c->dw);
            onednn_run(c->acc ? e0->dw_add : e0->dw_set, &a);
        }
    } else {
        /* the two slot sizes chose different formats: each partial into the user's format,
         * added one after the other in slot order (direct_w is false here) */
        for (int i = 0; i < pp->np; i++) {
            const slot_entry *e = pp->u[slot_kind(pp, i)];
            char *q = piece_region(pp, c->s0, i) + e->dw_off;
            if (i == 0 && !c->acc && !e->dw_set) {
                memcpy(c->dw, q, (size_t)nw * sizeof(float));
                continue;
            }
            onednn_args a = {0};
            onednn_arg(&a, DNNL_ARG_FROM, &e->dw_md, q);
            onednn_arg(&a, DNNL_ARG_TO, &p->w_md, c->dw);
            onednn_run(i > 0 || c->acc ? e->dw_add : e->dw_set, &a);
        }
    }
    if (c->db) {
        for (int i = 0; i < pp->np; i++)
            part[i] = (float *)(piece_region(pp, c->s0, i) + pp->u[slot_kind(pp, i)]->db_off);
        if (c->direct_b)
            part[0] = c->db;
        add_partials(c->db, part, pp->np, p->d.oc, c->acc);
    }
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
    if (p->wino_w) {
        onednn_wino_backward_filter(
            &p->d, n, x, dy, dw, dbias, accumulate,
            scratch_for(p, onednn_wino_wgrad_scratch_bytes(&p->d, n), scratch));
        return;
    }
    if (p->dw_own) {
        double *s = (double *)scratch_for(p, onednn_dw_scratch_bytes(&p->d.g, n), scratch);
        onednn_dw_backward_filter(&p->d.g, n, x, dy, dw, dbias, accumulate, s);
        return;
    }
    piece_plan pp;
    piece_plan_for(p, n, false, &pp);
    char *s = scratch_for(p, pp.bytes, scratch);
    piece_call c = {.p = p, .pp = &pp, .s0 = s, .x = x, .dy = dy, .dw = dw, .db = dbias,
                    .acc = accumulate};
    if (pp.nb > 1) {
        run_pieces(pp.np, bwd_w_block, &c);
        return;
    }
    /* slot 0 writes the user's arrays itself when they are its format and nothing is to be
     * added (and every slot has that format) */
    c.direct_w = !accumulate && !pp.u[0]->dw_set &&
                 (pp.u[1] == pp.u[0] || !pp.u[1]->dw_set);
    c.direct_b = !accumulate && dbias;
    run_pieces(pp.np, bwd_w_slot, &c);
    add_slot_partials(p, &pp, &c);
}
