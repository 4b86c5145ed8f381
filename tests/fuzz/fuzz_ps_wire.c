/* fuzz_ps_wire.c - libFuzzer target for the parameter server's message parsers
 * (src/ps/ps_wire.c): arbitrary bytes go through the request parser and the reply parser for
 * every request type, and whatever a parser accepts must satisfy its contract (counts that fit
 * the message, fields in range, re-encoding gives back the same bytes). Built by
 * tests/fuzz/CMakeLists.txt with clang -fsanitize=fuzzer,address,undefined. */
#include "ps/ps_wire.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(x)              \
    do {                        \
        if (!(x))               \
            __builtin_trap();   \
    } while (0)

/* The parts of an encoding, gathered, must equal the parsed bytes. */
static void same_bytes(const fl_ps_span *sp, int np, const uint8_t *d, size_t n) {
    size_t off = 0;
    for (int i = 0; i < np; i++) {
        REQUIRE(off + sp[i].n <= n);
        REQUIRE(sp[i].n == 0 || memcmp(sp[i].p, d + off, sp[i].n) == 0);
        off += sp[i].n;
    }
    REQUIRE(off == n);
}

/* The ranges fl_ps_sparse_opts_check holds (it lives outside the parsers' files). */
static bool fl_ps_sparse_opts_check_quiet(const fl_ps_sparse_opts *o) {
    return o->entry >= FL_PS_ENTRY_NONE && o->entry <= FL_PS_ENTRY_PROBABILITY &&
           o->entry_count >= 1 && o->entry_probability >= 0 && o->entry_probability <= 1 &&
           o->show_click_decay > 0 && o->show_click_decay <= 1 && o->delete_threshold >= 0 &&
           isfinite(o->delete_threshold) && o->nonclk_coeff >= 0 && isfinite(o->nonclk_coeff) &&
           o->click_coeff >= 0 && isfinite(o->click_coeff) && o->delete_after_unseen >= 0 &&
           o->delete_after_unseen <= 65535;
}

static void request(const uint8_t *d, size_t n) {
    fl_ps_req q;
    char why[256];
    if (fl_ps_req_parse(d, n, &q, why, sizeof why) < 0)
        return;
    REQUIRE(q.type > 0 && q.type < FL_PS_MSG_COUNT && q.table >= 0 &&
            q.table < FL_PS_MAX_TABLES);
    if (q.type == FL_PS_MSG_SPARSE_PUSH)
        REQUIRE(q.dim >= 1 && q.dim <= FL_PS_MAX_DIM && q.n * (8 + 4 * (uint64_t)q.dim) < n);
    if (q.type == FL_PS_MSG_SPARSE_PUSH && q.counts) {
        REQUIRE(q.n * (16 + 4 * (uint64_t)q.dim) + 40 == n);
        for (uint64_t i = 0; i < 2 * q.n; i++)
            REQUIRE(q.counts[i] >= 0 && isfinite(q.counts[i]));
    }
    if (q.type == FL_PS_MSG_SPARSE_INIT)
        REQUIRE(fl_ps_sparse_opts_check_quiet(&q.opts));
    if (q.type == FL_PS_MSG_SPARSE_PULL)
        REQUIRE(q.n * 8 < n);
    if (q.type == FL_PS_MSG_DENSE_PUSH || q.type == FL_PS_MSG_DENSE_INIT)
        REQUIRE(q.n * 4 < n);
    if (q.type == FL_PS_MSG_DENSE_PUSH || q.type == FL_PS_MSG_SPARSE_PUSH)
        REQUIRE(isfinite(q.lr) && q.step >= 0);
    uint8_t head[FL_PS_HEAD_MAX];
    fl_ps_span sp[FL_PS_REQ_PARTS];
    int np = fl_ps_req_encode(&q, head, sp);
    same_bytes(sp, np, d, n);
}

static void reply(const uint8_t *d, size_t n, int type) {
    fl_ps_rep r;
    char why[256];
    if (fl_ps_rep_parse(d, n, type, &r, why, sizeof why) < 0)
        return;
    REQUIRE(r.status == 0 || r.status == 1);
    if (r.status) {
        REQUIRE(r.err_len >= 1 && r.err_len <= FL_PS_ERR_MAX && r.err_len + FL_PS_REP_HEAD == n);
        return;
    }
    REQUIRE(r.type == type);
    if (type == FL_PS_MSG_SPARSE_PULL)
        REQUIRE(r.dim >= 1 && r.n * (uint64_t)r.dim * 4 + 32 == n);
    if (type == FL_PS_MSG_SHRINK || type == FL_PS_MSG_STATS)
        REQUIRE(n == 40 && (type == FL_PS_MSG_SHRINK || r.removed == 0));
    uint8_t head[FL_PS_HEAD_MAX];
    fl_ps_span sp[2];
    int np = fl_ps_rep_encode(&r, head, sp);
    same_bytes(sp, np, d, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    /* the parsers want a malloc'ed (8-byte aligned) buffer, as a receive buffer is */
    uint8_t *d = malloc(n ? n : 1);
    if (!d)
        return 0;
    memcpy(d, data, n);
    request(d, n);
    for (int t = 1; t < FL_PS_MSG_COUNT; t++)
        reply(d, n, t);
    free(d);
    return 0;
}
