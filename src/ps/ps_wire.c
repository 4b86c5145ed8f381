/* ps_wire.c - encoding and validating the parameter server's requests and replies (layouts in
 * ps_wire.h). Pure functions over byte buffers, no I/O and no library state, so that
 * tests/fuzz/fuzz_ps_wire.c can drive them with arbitrary bytes; a request is parsed by its
 * type's own parser (req_layouts). About 670 lines in one file on purpose: the fuzz target is
 * built from this file alone (tests/fuzz/CMakeLists.txt), and every layout's encoder stands
 * beside its parser and the byte helpers both use, so that a change to one is seen with the
 * other. */
#include "ps_wire.h"

#include "fleet/status.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ps_wire.c points into messages as little-endian arrays: port it to big-endian hosts"
#endif

#define RULE_BYTES 56

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void putf64(uint8_t *p, double d) {
    uint64_t v;
    memcpy(&v, &d, 8);
    put64(p, v);
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static double getf64(const uint8_t *p) {
    uint64_t v = get64(p);
    double d;
    memcpy(&d, &v, 8);
    return d;
}

static int refuse(char *reason, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(char *reason, size_t cap, const char *fmt, ...) {
    if (reason && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(reason, cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

const char *fl_ps_msg_name(int type) {
    switch (type) {
    case FL_PS_MSG_HELLO: return "HELLO";
    case FL_PS_MSG_DENSE_INIT: return "DENSE_INIT";
    case FL_PS_MSG_DENSE_PULL: return "DENSE_PULL";
    case FL_PS_MSG_DENSE_PUSH: return "DENSE_PUSH";
    case FL_PS_MSG_SPARSE_INIT: return "SPARSE_INIT";
    case FL_PS_MSG_SPARSE_PULL: return "SPARSE_PULL";
    case FL_PS_MSG_SPARSE_PUSH: return "SPARSE_PUSH";
    case FL_PS_MSG_SAVE: return "SAVE";
    case FL_PS_MSG_STOP: return "STOP";
    case FL_PS_MSG_SHRINK: return "SHRINK";
    case FL_PS_MSG_STATS: return "STATS";
    default: return "?";
    }
}

size_t fl_ps_span_bytes(const fl_ps_span *parts, int nparts) {
    size_t n = 0;
    for (int i = 0; i < nparts; i++)
        n += parts[i].n;
    return n;
}

static bool is_table_msg(int type) {
    return (type >= FL_PS_MSG_DENSE_INIT && type <= FL_PS_MSG_SPARSE_PUSH) ||
           type == FL_PS_MSG_SHRINK || type == FL_PS_MSG_STATS;
}

/* ---- rules ---- */

static void rule_encode(uint8_t *p, const fl_ps_rule *r) {
    put32(p, (uint32_t)r->type);
    put32(p + 4, r->nesterov ? 1u : 0u);
    putf64(p + 8, r->momentum);
    putf64(p + 16, r->weight_decay);
    putf64(p + 24, r->beta1);
    putf64(p + 32, r->beta2);
    putf64(p + 40, r->epsilon);
    putf64(p + 48, r->initial_g2sum);
}

static int rule_parse(const uint8_t *p, fl_ps_rule *r, char *reason, size_t cap) {
    uint32_t type = get32(p), nest = get32(p + 4);
    if (type > FL_PS_RULE_SUM)
        return refuse(reason, cap, "unknown optimizer rule %" PRIu32, type);
    if (nest > 1)
        return refuse(reason, cap, "rule's nesterov flag is %" PRIu32 ", not 0 or 1", nest);
    memset(r, 0, sizeof *r);
    r->type = (fl_ps_rule_type)type;
    r->nesterov = nest == 1;
    r->momentum = getf64(p + 8);
    r->weight_decay = getf64(p + 16);
    r->beta1 = getf64(p + 24);
    r->beta2 = getf64(p + 32);
    r->epsilon = getf64(p + 40);
    r->initial_g2sum = getf64(p + 48);
    const double f[6] = {r->momentum, r->weight_decay, r->beta1, r->beta2, r->epsilon,
                         r->initial_g2sum};
    for (int i = 0; i < 6; i++)
        if (!isfinite(f[i]))
            return refuse(reason, cap, "rule field %d is not a finite number", i);
    return 0;
}

/* ---- a sparse table's life cycle (56 bytes) ---- */

static void opts_encode(uint8_t *p, const fl_ps_sparse_opts *o) {
    put32(p, (uint32_t)o->entry);
    put32(p + 4, (uint32_t)o->delete_after_unseen);
    putf64(p + 8, o->entry_count);
    putf64(p + 16, o->entry_probability);
    putf64(p + 24, o->show_click_decay);
    putf64(p + 32, o->delete_threshold);
    putf64(p + 40, o->nonclk_coeff);
    putf64(p + 48, o->click_coeff);
}

/* The ranges of fl_ps_sparse_opts_check, said in a reason rather than set as the error. */
static int opts_parse(const uint8_t *p, fl_ps_sparse_opts *o, char *reason, size_t cap) {
    uint32_t entry = get32(p), unseen = get32(p + 4);
    if (entry > FL_PS_ENTRY_PROBABILITY)
        return refuse(reason, cap, "SPARSE_INIT with unknown entry rule %" PRIu32, entry);
    if (unseen > 65535)
        return refuse(reason, cap, "SPARSE_INIT with delete after %" PRIu32 " unseen passes "
                      "(0..65535)", unseen);
    o->entry = (fl_ps_entry_type)entry;
    o->delete_after_unseen = (int)unseen;
    o->entry_count = getf64(p + 8);
    o->entry_probability = getf64(p + 16);
    o->show_click_decay = getf64(p + 24);
    o->delete_threshold = getf64(p + 32);
    o->nonclk_coeff = getf64(p + 40);
    o->click_coeff = getf64(p + 48);
    if (!(o->entry_count >= 1 && o->entry_count <= 1e9) ||
        !(o->entry_probability >= 0 && o->entry_probability <= 1) ||
        !(o->show_click_decay > 0 && o->show_click_decay <= 1) ||
        !(o->delete_threshold >= 0 && isfinite(o->delete_threshold)) ||
        !(o->nonclk_coeff >= 0 && isfinite(o->nonclk_coeff)) ||
        !(o->click_coeff >= 0 && isfinite(o->click_coeff)))
        return refuse(reason, cap, "SPARSE_INIT with a life cycle out of range (entry count %g, "
                      "probability %g, decay %g, threshold %g, coefficients %g %g)",
                      o->entry_count, o->entry_probability, o->show_click_decay,
                      o->delete_threshold, o->nonclk_coeff, o->click_coeff);
    return 0;
}

/* ---- requests ---- */

int fl_ps_req_encode(const fl_ps_req *r, uint8_t head[FL_PS_HEAD_MAX],
                     fl_ps_span parts[FL_PS_REQ_PARTS]) {
    FL_ASSERT(r && r->type > 0 && r->type < FL_PS_MSG_COUNT);
    memset(head, 0, FL_PS_HEAD_MAX);
    put32(head, FL_PS_REQ_MAGIC);
    put16(head + 4, (uint16_t)r->type);
    put16(head + 6, is_table_msg(r->type) ? (uint16_t)r->table : 0);
    size_t h = FL_PS_REQ_HEAD;
    int np = 1;
    switch (r->type) {
    case FL_PS_MSG_HELLO:
        put32(head + 8, (uint32_t)r->worker);
        put32(head + 12, (uint32_t)r->mode);
        put32(head + 16, (uint32_t)r->servers);
        put32(head + 20, (uint32_t)r->workers);
        put32(head + 24, (uint32_t)r->version);
        h = 32;
        break;
    case FL_PS_MSG_DENSE_INIT:
        put64(head + 8, (uint64_t)r->numel);
        put64(head + 16, (uint64_t)r->step);
        rule_encode(head + 24, &r->rule);
        put64(head + 80, r->n);
        h = 88;
        parts[np++] = (fl_ps_span){r->values, (size_t)r->n * 4};
        break;
    case FL_PS_MSG_DENSE_PULL:
        put64(head + 8, (uint64_t)r->version64);
        h = 16;
        break;
    case FL_PS_MSG_DENSE_PUSH:
        put64(head + 8, (uint64_t)r->step);
        putf64(head + 16, r->lr);
        put64(head + 24, r->n);
        h = 32;
        parts[np++] = (fl_ps_span){r->values, (size_t)r->n * 4};
        break;
    case FL_PS_MSG_SPARSE_INIT:
        put32(head + 8, (uint32_t)r->dim);
        put32(head + 12, (uint32_t)r->init.type);
        rule_encode(head + 16, &r->rule);
        putf64(head + 72, r->init.a);
        putf64(head + 80, r->init.b);
        put64(head + 88, r->init.seed);
        opts_encode(head + 96, &r->opts);
        h = 152;
        break;
    case FL_PS_MSG_SPARSE_PULL:
        put64(head + 8, r->n);
        h = 16;
        parts[np++] = (fl_ps_span){r->ids, (size_t)r->n * 8};
        break;
    case FL_PS_MSG_SPARSE_PUSH:
        put64(head + 8, (uint64_t)r->step);
        putf64(head + 16, r->lr);
        put64(head + 24, r->n);
        put32(head + 32, (uint32_t)r->dim);
        put32(head + 36, r->counts ? 1u : 0u);
        h = 40;
        parts[np++] = (fl_ps_span){r->ids, (size_t)r->n * 8};
        parts[np++] = (fl_ps_span){r->values, (size_t)r->n * (size_t)r->dim * 4};
        if (r->counts)
            parts[np++] = (fl_ps_span){r->counts, (size_t)r->n * 8};
        break;
    case FL_PS_MSG_SAVE:
        put64(head + 8, (uint64_t)r->step);
        put32(head + 16, (uint32_t)r->save_mode);
        h = 24;
        break;
    case FL_PS_MSG_STOP:
    case FL_PS_MSG_SHRINK:
    case FL_PS_MSG_STATS:
        break;
    }
    parts[0] = (fl_ps_span){head, h};
    return np;
}

/* The bytes after the fixed part must be exactly `want` (computed without overflow by the
 * caller). */
static int exact(const char *what, size_t have, uint64_t want, char *reason, size_t cap) {
    if (have != want)
        return refuse(reason, cap, "%s needs %" PRIu64 " bytes after its head, got %zu", what,
                      want, have);
    return 0;
}

static int zero32(const uint8_t *p, const char *what, char *reason, size_t cap) {
    if (get32(p) != 0)
        return refuse(reason, cap, "%s: reserved field is %" PRIu32 ", not 0", what, get32(p));
    return 0;
}

/* A request being parsed: the message, what follows its fixed part, and where a refusal's
 * reason goes. */
typedef struct {
    const uint8_t *b;
    const uint8_t *body;  /* after the fixed part */
    size_t         rest;  /* bytes after the fixed part */
    const char    *name;  /* "SPARSE_PUSH" */
    char          *reason;
    size_t         cap;
} req_in;

static int parse_hello(const req_in *in, fl_ps_req *r) {
    const uint8_t *b = in->b;
    uint32_t w = get32(b + 8), mode = get32(b + 12), s = get32(b + 16), nw = get32(b + 20);
    uint32_t v = get32(b + 24);
    if (v != FL_PS_WIRE_VERSION)
        return refuse(in->reason, in->cap, "HELLO of parameter-server protocol version %" PRIu32
                      ", expected %d", v, FL_PS_WIRE_VERSION);
    if (mode > FL_PS_GEO)
        return refuse(in->reason, in->cap, "HELLO with unknown mode %" PRIu32, mode);
    if (s < 1 || s > FL_PS_MAX_SERVERS)
        return refuse(in->reason, in->cap, "HELLO with %" PRIu32 " servers (1..%d)", s,
                      FL_PS_MAX_SERVERS);
    if (nw < 1 || nw > FL_PS_MAX_WORKERS || w >= nw)
        return refuse(in->reason, in->cap, "HELLO from worker %" PRIu32 " of %" PRIu32
                      " workers", w, nw);
    if (zero32(b + 28, in->name, in->reason, in->cap) < 0)
        return -1;
    r->worker = (int)w;
    r->mode = (int)mode;
    r->servers = (int)s;
    r->workers = (int)nw;
    r->version = (int)v;
    return exact(in->name, in->rest, 0, in->reason, in->cap);
}

static int parse_dense_init(const req_in *in, fl_ps_req *r) {
    const uint8_t *b = in->b;
    r->numel = (int64_t)get64(b + 8);
    r->step = (int64_t)get64(b + 16);
    r->n = get64(b + 80);
    if (r->numel < 1 || r->numel > FL_PS_MAX_NUMEL)
        return refuse(in->reason, in->cap, "DENSE_INIT of table %d with %" PRId64 " values (1..%"
                      PRId64 ")", r->table, r->numel, FL_PS_MAX_NUMEL);
    if (r->step < -1)
        return refuse(in->reason, in->cap, "DENSE_INIT with resume step %" PRId64, r->step);
    if (rule_parse(b + 24, &r->rule, in->reason, in->cap) < 0)
        return -1;
    if (r->n > (uint64_t)r->numel)
        return refuse(in->reason, in->cap, "DENSE_INIT with %" PRIu64 " initial values for a "
                      "table of %" PRId64, r->n, r->numel);
    if (exact(in->name, in->rest, r->n * 4, in->reason, in->cap) < 0)
        return -1;
    r->values = (const float *)in->body;
    return 0;
}

static int parse_dense_pull(const req_in *in, fl_ps_req *r) {
    r->version64 = (int64_t)get64(in->b + 8);
    if (r->version64 < -1)
        return refuse(in->reason, in->cap, "DENSE_PULL of version %" PRId64, r->version64);
    return exact(in->name, in->rest, 0, in->reason, in->cap);
}

static int parse_dense_push(const req_in *in, fl_ps_req *r) {
    const uint8_t *b = in->b;
    r->step = (int64_t)get64(b + 8);
    r->lr = getf64(b + 16);
    r->n = get64(b + 24);
    if (r->step < 0)
        return refuse(in->reason, in->cap, "DENSE_PUSH for step %" PRId64, r->step);
    if (!isfinite(r->lr))
        return refuse(in->reason, in->cap, "DENSE_PUSH with learning rate %g", r->lr);
    if (r->n > (uint64_t)FL_PS_MAX_NUMEL)
        return refuse(in->reason, in->cap, "DENSE_PUSH of %" PRIu64 " gradients", r->n);
    if (exact(in->name, in->rest, r->n * 4, in->reason, in->cap) < 0)
        return -1;
    r->values = (const float *)in->body;
    return 0;
}

static int parse_sparse_init(const req_in *in, fl_ps_req *r) {
    const uint8_t *b = in->b;
    char *reason = in->reason;
    size_t cap = in->cap;
    uint32_t dim = get32(b + 8), it = get32(b + 12);
    if (dim < 1 || dim > FL_PS_MAX_DIM)
        return refuse(reason, cap, "SPARSE_INIT of table %d with rows of %" PRIu32
                      " values (1..%d)", r->table, dim, FL_PS_MAX_DIM);
    if (it > FL_PS_INIT_NORMAL)
        return refuse(reason, cap, "SPARSE_INIT with unknown initializer %" PRIu32, it);
    if (rule_parse(b + 16, &r->rule, reason, cap) < 0)
        return -1;
    r->dim = (int)dim;
    r->init.type = (fl_ps_init_type)it;
    r->init.a = getf64(b + 72);
    r->init.b = getf64(b + 80);
    r->init.seed = get64(b + 88);
    if (!isfinite(r->init.a) || !isfinite(r->init.b))
        return refuse(reason, cap, "SPARSE_INIT with initializer bounds %g, %g", r->init.a,
                      r->init.b);
    if ((it == FL_PS_INIT_UNIFORM && r->init.a > r->init.b) ||
        (it == FL_PS_INIT_NORMAL && r->init.b < 0))
        return refuse(reason, cap, "SPARSE_INIT with initializer parameters %g, %g out of "
                      "order", r->init.a, r->init.b);
    if (opts_parse(b + 96, &r->opts, reason, cap) < 0)
        return -1;
    return exact(in->name, in->rest, 0, reason, cap);
}

static int parse_sparse_pull(const req_in *in, fl_ps_req *r) {
    r->n = get64(in->b + 8);
    if (r->n > in->rest / 8)
        return refuse(in->reason, in->cap, "SPARSE_PULL of %" PRIu64 " ids needs %" PRIu64
                      " bytes after its head, got %zu", r->n,
                      r->n > UINT64_MAX / 8 ? UINT64_MAX : r->n * 8, in->rest);
    if (exact(in->name, in->rest, r->n * 8, in->reason, in->cap) < 0)
        return -1;
    r->ids = (const uint64_t *)in->body;
    return 0;
}

static int parse_sparse_push(const req_in *in, fl_ps_req *r) {
    const uint8_t *b = in->b;
    char *reason = in->reason;
    size_t cap = in->cap, rest = in->rest;
    r->step = (int64_t)get64(b + 8);
    r->lr = getf64(b + 16);
    r->n = get64(b + 24);
    uint32_t dim = get32(b + 32);
    if (r->step < 0)
        return refuse(reason, cap, "SPARSE_PUSH for step %" PRId64, r->step);
    if (!isfinite(r->lr))
        return refuse(reason, cap, "SPARSE_PUSH with learning rate %g", r->lr);
    if (dim < 1 || dim > FL_PS_MAX_DIM)
        return refuse(reason, cap, "SPARSE_PUSH with rows of %" PRIu32 " values (1..%d)", dim,
                      FL_PS_MAX_DIM);
    uint32_t flags = get32(b + 36);
    if (flags > 1)
        return refuse(reason, cap, "SPARSE_PUSH with unknown flags %" PRIx32, flags);
    uint64_t per = 8 + 4 * (uint64_t)dim + (flags ? 8 : 0);
    if (r->n > rest / per)
        return refuse(reason, cap, "SPARSE_PUSH of %" PRIu64 " ids of dim %" PRIu32 "%s does "
                      "not fit its %zu bytes", r->n, dim, flags ? " with counts" : "", rest);
    if (exact(in->name, rest, r->n * per, reason, cap) < 0)
        return -1;
    r->dim = (int)dim;
    r->ids = (const uint64_t *)in->body;
    r->values = (const float *)(in->body + r->n * 8);
    if (!flags)
        return 0;
    r->counts = (const float *)(in->body + r->n * (8 + 4 * (uint64_t)dim));
    for (uint64_t i = 0; i < 2 * r->n; i++)
        if (!(r->counts[i] >= 0 && isfinite(r->counts[i])))
            return refuse(reason, cap, "SPARSE_PUSH with %s count %g of id %" PRIu64 " (finite, "
                          ">= 0)", i < r->n ? "show" : "click", (double)r->counts[i],
                          r->ids[i < r->n ? i : i - r->n]);
    return 0;
}

static int parse_save(const req_in *in, fl_ps_req *r) {
    const uint8_t *b = in->b;
    r->step = (int64_t)get64(b + 8);
    r->save_mode = (int)get32(b + 16);
    if (r->step < 0)
        return refuse(in->reason, in->cap, "SAVE of step %" PRId64, r->step);
    if (get32(b + 16) > FL_PS_SAVE_DELTA)
        return refuse(in->reason, in->cap, "SAVE with unknown mode %" PRIu32, get32(b + 16));
    if (zero32(b + 20, in->name, in->reason, in->cap) < 0)
        return -1;
    return exact(in->name, in->rest, 0, in->reason, in->cap);
}

/* STOP, SHRINK, STATS: the head (and the table) alone. */
static int parse_head_only(const req_in *in, fl_ps_req *r) {
    (void)r;
    return exact(in->name, in->rest, 0, in->reason, in->cap);
}

/* Each request type's fixed part (head included) and its parser. */
static const struct {
    size_t fixed;
    int  (*parse)(const req_in *in, fl_ps_req *r);
} req_layouts[FL_PS_MSG_COUNT] = {
    [FL_PS_MSG_HELLO] = {32, parse_hello},
    [FL_PS_MSG_DENSE_INIT] = {88, parse_dense_init},
    [FL_PS_MSG_DENSE_PULL] = {16, parse_dense_pull},
    [FL_PS_MSG_DENSE_PUSH] = {32, parse_dense_push},
    [FL_PS_MSG_SPARSE_INIT] = {152, parse_sparse_init},
    [FL_PS_MSG_SPARSE_PULL] = {16, parse_sparse_pull},
    [FL_PS_MSG_SPARSE_PUSH] = {40, parse_sparse_push},
    [FL_PS_MSG_SAVE] = {24, parse_save},
    [FL_PS_MSG_STOP] = {8, parse_head_only},
    [FL_PS_MSG_SHRINK] = {8, parse_head_only},
    [FL_PS_MSG_STATS] = {8, parse_head_only},
};

int fl_ps_req_parse(const void *buf, size_t n, fl_ps_req *out, char *reason, size_t cap) {
    const uint8_t *b = buf;
    fl_ps_req r;
    memset(&r, 0, sizeof r);
    if ((uintptr_t)buf % 8)
        return refuse(reason, cap, "message buffer not 8-byte aligned");
    if (n < FL_PS_REQ_HEAD)
        return refuse(reason, cap, "request of %zu bytes, shorter than its %d-byte head", n,
                      FL_PS_REQ_HEAD);
    if (get32(b) != FL_PS_REQ_MAGIC)
        return refuse(reason, cap, "not a parameter-server request (magic %08" PRIx32 ")",
                      get32(b));
    r.type = get16(b + 4);
    r.table = get16(b + 6);
    const char *name = fl_ps_msg_name(r.type);
    if (r.type < 1 || r.type >= FL_PS_MSG_COUNT)
        return refuse(reason, cap, "unknown request type %d", r.type);
    if (is_table_msg(r.type) ? r.table >= FL_PS_MAX_TABLES : r.table != 0)
        return refuse(reason, cap, "%s names table %d (tables are 0..%d)", name, r.table,
                      is_table_msg(r.type) ? FL_PS_MAX_TABLES - 1 : 0);
    size_t h = req_layouts[r.type].fixed;
    if (n < h)
        return refuse(reason, cap, "%s of %zu bytes, shorter than its %zu-byte head", name, n, h);
    req_in in = {.b = b, .body = b + h, .rest = n - h, .name = name, .reason = reason,
                 .cap = cap};
    if (req_layouts[r.type].parse(&in, &r) < 0)
        return -1;
    if (out)
        *out = r;
    return 0;
}

/* ---- replies ---- */

int fl_ps_rep_encode(const fl_ps_rep *r, uint8_t head[FL_PS_HEAD_MAX], fl_ps_span parts[2]) {
    FL_ASSERT(r && r->type >= 0 && r->type <= 0xffff &&
              (r->status || (r->type > 0 && r->type < FL_PS_MSG_COUNT)));
    memset(head, 0, FL_PS_HEAD_MAX);
    put32(head, FL_PS_REP_MAGIC);
    put32(head + 4, r->status ? 1u : 0u);
    put16(head + 8, (uint16_t)r->type);
    size_t h = FL_PS_REP_HEAD;
    int np = 1;
    if (r->status) {
        size_t len = r->err_len > FL_PS_ERR_MAX ? FL_PS_ERR_MAX : r->err_len;
        if (len == 0) /* an error always says something */
            parts[np++] = (fl_ps_span){"?", 1};
        else
            parts[np++] = (fl_ps_span){r->err, len};
        parts[0] = (fl_ps_span){head, h};
        return np;
    }
    switch (r->type) {
    case FL_PS_MSG_DENSE_INIT:
        put64(head + 16, (uint64_t)r->version);
        put64(head + 24, (uint64_t)r->step);
        h = 32;
        break;
    case FL_PS_MSG_DENSE_PULL:
        put64(head + 16, (uint64_t)r->version);
        put64(head + 24, r->n);
        h = 32;
        parts[np++] = (fl_ps_span){r->values, (size_t)r->n * 4};
        break;
    case FL_PS_MSG_DENSE_PUSH:
    case FL_PS_MSG_SPARSE_PUSH:
        put64(head + 16, (uint64_t)r->version);
        put64(head + 24, (uint64_t)r->staleness);
        h = 32;
        break;
    case FL_PS_MSG_SPARSE_PULL:
        put64(head + 16, r->n);
        put32(head + 24, (uint32_t)r->dim);
        h = 32;
        parts[np++] = (fl_ps_span){r->values, (size_t)r->n * (size_t)r->dim * 4};
        break;
    case FL_PS_MSG_SAVE:
        put64(head + 16, (uint64_t)r->step);
        h = 24;
        break;
    case FL_PS_MSG_SHRINK:
    case FL_PS_MSG_STATS:
        put64(head + 16, r->removed);
        put64(head + 24, r->rows);
        put64(head + 32, r->bytes);
        h = 40;
        break;
    default:
        break;
    }
    parts[0] = (fl_ps_span){head, h};
    return np;
}

int fl_ps_rep_parse(const void *buf, size_t n, int want_type, fl_ps_rep *out, char *reason,
                    size_t cap) {
    const uint8_t *b = buf;
    fl_ps_rep r;
    memset(&r, 0, sizeof r);
    if ((uintptr_t)buf % 8)
        return refuse(reason, cap, "message buffer not 8-byte aligned");
    if (n < FL_PS_REP_HEAD)
        return refuse(reason, cap, "reply of %zu bytes, shorter than its %d-byte head", n,
                      FL_PS_REP_HEAD);
    if (get32(b) != FL_PS_REP_MAGIC)
        return refuse(reason, cap, "not a parameter-server reply (magic %08" PRIx32 ")",
                      get32(b));
    uint32_t status = get32(b + 4);
    r.type = get16(b + 8);
    if (status > 1)
        return refuse(reason, cap, "reply with unknown status %" PRIu32, status);
    if (get16(b + 10) != 0 || get32(b + 12) != 0)
        return refuse(reason, cap, "reply with nonzero reserved fields");
    r.status = (int)status;
    if (!r.status && r.type != want_type)
        return refuse(reason, cap, "reply to %s where a reply to %s was expected",
                      fl_ps_msg_name(r.type), fl_ps_msg_name(want_type));
    size_t rest = n - FL_PS_REP_HEAD;
    if (r.status) {
        if (rest < 1 || rest > FL_PS_ERR_MAX)
            return refuse(reason, cap, "error reply with %zu bytes of text (1..%d)", rest,
                          FL_PS_ERR_MAX);
        r.err = (const char *)b + FL_PS_REP_HEAD;
        r.err_len = rest;
        if (out)
            *out = r;
        return 0;
    }
    const char *name = fl_ps_msg_name(r.type);
    switch (r.type) {
    case FL_PS_MSG_HELLO:
    case FL_PS_MSG_SPARSE_INIT:
    case FL_PS_MSG_STOP:
        if (exact(name, rest, 0, reason, cap) < 0)
            return -1;
        break;
    case FL_PS_MSG_DENSE_INIT:
        if (exact(name, rest, 16, reason, cap) < 0)
            return -1;
        r.version = (int64_t)get64(b + 16);
        r.step = (int64_t)get64(b + 24);
        if (r.version < 0 || r.step < -1)
            return refuse(reason, cap, "DENSE_INIT reply with version %" PRId64 ", step %" PRId64,
                          r.version, r.step);
        break;
    case FL_PS_MSG_DENSE_PULL:
        if (rest < 16)
            return refuse(reason, cap, "DENSE_PULL reply of %zu bytes", n);
        r.version = (int64_t)get64(b + 16);
        r.n = get64(b + 24);
        if (r.version < 0)
            return refuse(reason, cap, "DENSE_PULL reply with version %" PRId64, r.version);
        if (r.n > (rest - 16) / 4 || exact(name, rest - 16, r.n * 4, reason, cap) < 0)
            return refuse(reason, cap, "DENSE_PULL reply of %" PRIu64 " values in %zu bytes",
                          r.n, rest - 16);
        r.values = (const float *)(b + 32);
        break;
    case FL_PS_MSG_DENSE_PUSH:
    case FL_PS_MSG_SPARSE_PUSH:
        if (exact(name, rest, 16, reason, cap) < 0)
            return -1;
        r.version = (int64_t)get64(b + 16);
        r.staleness = (int64_t)get64(b + 24);
        if (r.version < 0 || r.staleness < 0)
            return refuse(reason, cap, "%s reply with version %" PRId64 ", staleness %" PRId64,
                          name, r.version, r.staleness);
        break;
    case FL_PS_MSG_SPARSE_PULL: {
        if (rest < 16)
            return refuse(reason, cap, "SPARSE_PULL reply of %zu bytes", n);
        r.n = get64(b + 16);
        uint32_t dim = get32(b + 24);
        if (dim < 1 || dim > FL_PS_MAX_DIM)
            return refuse(reason, cap, "SPARSE_PULL reply with rows of %" PRIu32 " values", dim);
        if (get32(b + 28) != 0)
            return refuse(reason, cap, "SPARSE_PULL reply with nonzero reserved field");
        uint64_t per = 4 * (uint64_t)dim;
        if (r.n > (rest - 16) / per || r.n * per != rest - 16)
            return refuse(reason, cap, "SPARSE_PULL reply of %" PRIu64 " rows of dim %" PRIu32
                          " in %zu bytes", r.n, dim, rest - 16);
        r.dim = (int)dim;
        r.values = (const float *)(b + 32);
        break;
    }
    case FL_PS_MSG_SAVE:
        if (exact(name, rest, 8, reason, cap) < 0)
            return -1;
        r.step = (int64_t)get64(b + 16);
        if (r.step < 0)
            return refuse(reason, cap, "SAVE reply with step %" PRId64, r.step);
        break;
    case FL_PS_MSG_SHRINK:
    case FL_PS_MSG_STATS:
        if (exact(name, rest, 24, reason, cap) < 0)
            return -1;
        r.removed = get64(b + 16);
        r.rows = get64(b + 24);
        r.bytes = get64(b + 32);
        if (r.removed > ((uint64_t)1 << 48) || r.rows > ((uint64_t)1 << 48) ||
            r.bytes > ((uint64_t)1 << 56) || (r.type == FL_PS_MSG_STATS && r.removed))
            return refuse(reason, cap, "%s reply with %" PRIu64 " removed, %" PRIu64 " rows, %"
                          PRIu64 " bytes", name, r.removed, r.rows, r.bytes);
        break;
    default:
        return refuse(reason, cap, "reply to unknown request type %d", r.type);
    }
    if (out)
        *out = r;
    return 0;
}
