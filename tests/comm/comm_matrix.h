/* comm_matrix.h - the collective test matrix shared by comm_check (one process per rank) and
 * test_comm_algorithms (one thread per rank over socketpairs): every collective x dtype x op x
 * count, each rank filling its input from (seed, case, rank) and computing the expected result
 * for all ranks serially. Two kinds of input: small integers, whose float sums are exact and
 * so compared bit for bit, and floats spread over magnitudes, whose sums depend on the order
 * (compared with a tolerance, and across ranks by a 64-bit hash of the output: every rank
 * must hold the same bits). Header-only; thread-safe per communicator (no globals). */
#ifndef FLEET_TESTS_COMM_MATRIX_H
#define FLEET_TESTS_COMM_MATRIX_H

#include "fleet/comm.h"
#include "fleet/log.h"
#include "fleet/status.h"
#include "fleet/tensor.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    fl_comm  *c;
    int       rank, size;
    uint64_t  seed;
    bool      verbose;
    int       max_reports; /* mismatch lines printed before going quiet */
    /* results */
    long      checks, failures;
    uint64_t  hash;  /* of every output of every rank, in case order: equal on all ranks */
    bool      fatal; /* a collective returned an error; the communicator is unusable */
    long      case_id;
} mx_ctx;

enum { MX_EXACT = 0, MX_ORDER = 1 }; /* input kinds */

static const fl_dtype mx_dtypes[] = {FL_DTYPE_F32, FL_DTYPE_F64, FL_DTYPE_F16,
                                     FL_DTYPE_BF16, FL_DTYPE_I32, FL_DTYPE_I64};
#define MX_NDTYPES ((int)(sizeof mx_dtypes / sizeof mx_dtypes[0]))

static inline uint64_t mx_mix(uint64_t x) { /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t mx_hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return mx_mix(h ^ n);
}

static inline void mx_put(fl_dtype t, void *b, size_t i, double v) {
    switch (t) {
    case FL_DTYPE_F32: ((float *)b)[i] = (float)v; break;
    case FL_DTYPE_F64: ((double *)b)[i] = v; break;
    case FL_DTYPE_F16: ((uint16_t *)b)[i] = fl_f32_to_f16((float)v); break;
    case FL_DTYPE_BF16: ((uint16_t *)b)[i] = fl_f32_to_bf16((float)v); break;
    case FL_DTYPE_I32: ((int32_t *)b)[i] = (int32_t)v; break;
    case FL_DTYPE_I64: ((int64_t *)b)[i] = (int64_t)v; break;
    default: ((uint8_t *)b)[i] = (uint8_t)v; break;
    }
}

static inline double mx_get(fl_dtype t, const void *b, size_t i) {
    switch (t) {
    case FL_DTYPE_F32: return ((const float *)b)[i];
    case FL_DTYPE_F64: return ((const double *)b)[i];
    case FL_DTYPE_F16: return fl_f16_to_f32(((const uint16_t *)b)[i]);
    case FL_DTYPE_BF16: return fl_bf16_to_f32(((const uint16_t *)b)[i]);
    case FL_DTYPE_I32: return ((const int32_t *)b)[i];
    case FL_DTYPE_I64: return (double)((const int64_t *)b)[i];
    default: return ((const uint8_t *)b)[i];
    }
}

/* Rank q's element i of the current case, as a value exactly representable in t. */
static inline double mx_value(const mx_ctx *m, fl_dtype t, int kind, int q, size_t i) {
    uint64_t x = mx_mix(mx_mix(m->seed ^ ((uint64_t)m->case_id << 20)) ^ ((uint64_t)q << 48) ^ i);
    double v;
    if (kind == MX_EXACT) {
        bool is_float = t == FL_DTYPE_F32 || t == FL_DTYPE_F64 || t == FL_DTYPE_F16 ||
                        t == FL_DTYPE_BF16; /* fl_dtype_is_float, inline: called per value */
        int span = is_float ? 8 : 1000;
        v = (double)((int)(x % (uint64_t)(2 * span + 1)) - span);
    } else { /* +-2^[-6, 6] * [1, 2): sums that round differently in every order */
        int e = (int)((x >> 8) % 13) - 6;
        double f = 1.0 + (double)((x >> 16) & 0xffffff) / 16777216.0;
        /* f * 2^e, exact (ldexp's call was a tenth of the run) */
        v = f * (double)(e < 0 ? 1.0 / (double)(1 << -e) : (double)(1 << e)) * ((x & 1) ? -1.0 : 1.0);
    }
    unsigned char tmp[8];
    mx_put(t, tmp, 0, v);
    return mx_get(t, tmp, 0);
}

/* Whether the es-byte elements a and b hold the same bits: inline for the sizes of the dtypes
 * (a memcmp call per element was a sixth of a run's time). */
static inline bool mx_same(const void *a, const void *b, size_t es) {
    switch (es) {
    case 1: return *(const uint8_t *)a == *(const uint8_t *)b;
    case 2: { uint16_t x, y; memcpy(&x, a, 2); memcpy(&y, b, 2); return x == y; }
    case 4: { uint32_t x, y; memcpy(&x, a, 4); memcpy(&y, b, 4); return x == y; }
    case 8: { uint64_t x, y; memcpy(&x, a, 8); memcpy(&y, b, 8); return x == y; }
    default: return memcmp(a, b, es) == 0;
    }
}

static inline void *mx_alloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "comm matrix: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

static inline void mx_fail(mx_ctx *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void mx_fail(mx_ctx *m, const char *fmt, ...) {
    m->failures++;
    if (m->failures > m->max_reports)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "rank %d: FAIL: %s\n", m->rank, line);
}

/* A collective returned an error: report it; everything after is skipped. */
static inline bool mx_rc(mx_ctx *m, int rc, const char *what) {
    if (rc >= 0)
        return true;
    fprintf(stderr, "rank %d: %s: error %s: %s\n", m->rank, what, fl_status_name(rc),
            fl_errmsg());
    m->failures++;
    m->fatal = true;
    return false;
}

/* Allgathers h; if same_everywhere, every rank's must equal ours. Folds all into m->hash. */
static inline void mx_hashes(mx_ctx *m, const char *what, uint64_t h, bool same_everywhere) {
    uint64_t *all = mx_alloc((size_t)m->size * sizeof *all);
    if (mx_rc(m, fl_comm_allgather(m->c, &h, all, 1, FL_DTYPE_I64), "allgather of hashes")) {
        for (int q = 0; q < m->size; q++) {
            if (same_everywhere && all[q] != h)
                mx_fail(m, "%s: rank %d's result differs from rank %d's (hash %016llx vs "
                        "%016llx)", what, q, m->rank, (unsigned long long)all[q],
                        (unsigned long long)h);
            m->hash = mx_mix(m->hash ^ all[q]);
        }
        m->checks++;
    }
    free(all);
}

/* Expected value of a reduction over ranks of element i of block `blk` (count elements per
 * block); for MX_ORDER also the sum of magnitudes, to scale the tolerance. */
static inline double mx_expect(const mx_ctx *m, fl_dtype t, fl_redop op, int kind, size_t i,
                               double *mag) {
    double acc = 0, absum = 0;
    for (int q = 0; q < m->size; q++) {
        double v = mx_value(m, t, kind, q, i);
        if (op == FL_REDOP_MAX)
            acc = q == 0 || v > acc ? v : acc;
        else
            acc += v;
        absum += fabs(v);
    }
    if (mag)
        *mag = absum;
    return acc;
}

/* Writes the exact expected element for MX_EXACT inputs (sums of small integers are exact in
 * every dtype; avg divides in the dtype's precision as the library does). */
static inline void mx_put_expected(const mx_ctx *m, fl_dtype t, fl_redop op, void *b, size_t i,
                                   double v) {
    if (op != FL_REDOP_AVG || m->size == 1) {
        mx_put(t, b, i, v);
        return;
    }
    switch (t) {
    case FL_DTYPE_F32: ((float *)b)[i] = (float)v / (float)m->size; break;
    case FL_DTYPE_F64: ((double *)b)[i] = v / m->size; break;
    case FL_DTYPE_F16:
        ((uint16_t *)b)[i] = fl_f32_to_f16((float)v / (float)m->size);
        break;
    case FL_DTYPE_BF16:
        ((uint16_t *)b)[i] = fl_f32_to_bf16((float)v / (float)m->size);
        break;
    case FL_DTYPE_I32: ((int32_t *)b)[i] = (int32_t)((int64_t)v / m->size); break;
    case FL_DTYPE_I64: ((int64_t *)b)[i] = (int64_t)v / m->size; break;
    default: break;
    }
}

static inline double mx_eps(fl_dtype t) {
    switch (t) {
    case FL_DTYPE_F32: return ldexp(1, -24);
    case FL_DTYPE_F64: return ldexp(1, -53);
    case FL_DTYPE_F16: return ldexp(1, -11);
    case FL_DTYPE_BF16: return ldexp(1, -8);
    default: return 0;
    }
}

/* Checks elements first, first + step, ... of `got` (n elements: element j is global element
 * base + j of the reduction). An output that every rank holds whole (allreduce) is checked in
 * rank-strided shares, the ranks' shares together all of it: mx_hashes proves the ranks hold
 * the same bits. */
static inline void mx_check_reduced(mx_ctx *m, const char *what, fl_dtype t, fl_redop op,
                                    int kind, const void *got, size_t base, size_t n,
                                    size_t first, size_t step) {
    size_t es = fl_dtype_size(t);
    m->checks++;
    if (kind == MX_EXACT) {
        unsigned char want[8];
        for (size_t j = first; j < n; j += step) {
            mx_put_expected(m, t, op, want, 0, mx_expect(m, t, op, kind, base + j, NULL));
            if (!mx_same(want, (const char *)got + j * es, es)) {
                mx_fail(m, "%s: element %zu: got %.9g want %.9g", what, j, mx_get(t, got, j),
                        mx_get(t, want, 0));
                return;
            }
        }
        return;
    }
    double div = op == FL_REDOP_AVG ? m->size : 1;
    for (size_t j = first; j < n; j += step) {
        double mag, want = mx_expect(m, t, op, kind, base + j, &mag) / div;
        double tol = (m->size + 2) * mx_eps(t) * mag / div;
        double g = mx_get(t, got, j);
        if (!(fabs(g - want) <= tol)) {
            mx_fail(m, "%s: element %zu: got %.9g want %.9g (tolerance %.3g)", what, j, g, want,
                    tol);
            return;
        }
    }
}

static inline void mx_name(char *buf, size_t cap, const char *coll, fl_dtype t, int op,
                           int kind, size_t count) {
    snprintf(buf, cap, "%s %s%s%s count %zu%s", coll, fl_dtype_name(t), op >= 0 ? " " : "",
             op >= 0 ? fl_redop_name((fl_redop)op) : "", count,
             kind == MX_ORDER ? " (order-sensitive values)" : "");
}

static inline void mx_allreduce(mx_ctx *m, fl_dtype t, fl_redop op, int kind, size_t count) {
    char what[160];
    mx_name(what, sizeof what, "allreduce", t, (int)op, kind, count);
    m->case_id++;
    size_t es = fl_dtype_size(t);
    void *buf = mx_alloc(count * es);
    for (size_t i = 0; i < count; i++)
        mx_put(t, buf, i, mx_value(m, t, kind, m->rank, i));
    double t0 = fl_now();
    if (mx_rc(m, fl_comm_allreduce(m->c, buf, count, t, op), what)) {
        double dt = fl_now() - t0;
        if (m->verbose && m->rank == 0)
            fprintf(stderr, "%s: %.3f ms\n", what, dt * 1e3);
        mx_check_reduced(m, what, t, op, kind, buf, 0, count, (size_t)m->rank, (size_t)m->size);
        mx_hashes(m, what, mx_hash_bytes(0, buf, count * es), true);
    }
    free(buf);
}

static inline void mx_reduce_scatter(mx_ctx *m, fl_dtype t, fl_redop op, int kind,
                                     size_t count) {
    char what[160];
    mx_name(what, sizeof what, "reduce_scatter", t, (int)op, kind, count);
    m->case_id++;
    size_t es = fl_dtype_size(t), total = count * (size_t)m->size;
    void *in = mx_alloc(total * es), *out = mx_alloc(count * es);
    for (size_t i = 0; i < total; i++)
        mx_put(t, in, i, mx_value(m, t, kind, m->rank, i));
    if (mx_rc(m, fl_comm_reduce_scatter(m->c, in, out, count, t, op), what)) {
        mx_check_reduced(m, what, t, op, kind, out, (size_t)m->rank * count, count, 0, 1);
        mx_hashes(m, what, mx_hash_bytes(0, out, count * es), false);
    }
    free(in);
    free(out);
}

/* allgather (counts NULL: count each; in_place: in is out's own block) or allgatherv; every
 * rank checks its rank-strided share of the output, mx_hashes that all hold the same bits. */
static inline void mx_allgather(mx_ctx *m, fl_dtype t, size_t count, const size_t *counts,
                                bool in_place) {
    char what[160];
    mx_name(what, sizeof what, counts ? "allgatherv" : in_place ? "allgather (in place)"
                                                                : "allgather",
            t, -1, MX_EXACT, count);
    m->case_id++;
    size_t es = fl_dtype_size(t), total = 0, mine = 0;
    for (int q = 0; q < m->size; q++) {
        if (q == m->rank)
            mine = total;
        total += counts ? counts[q] : count;
    }
    size_t my_n = counts ? counts[m->rank] : count;
    void *out = mx_alloc(total * es);
    void *in = in_place ? (char *)out + mine * es : mx_alloc(my_n * es);
    memset(out, 0xa5, total * es);
    for (size_t i = 0; i < my_n; i++)
        mx_put(t, in, i, mx_value(m, t, MX_EXACT, m->rank, i));
    int rc = counts ? fl_comm_allgatherv(m->c, in, out, counts, t)
                    : fl_comm_allgather(m->c, in, out, count, t);
    if (mx_rc(m, rc, what)) {
        m->checks++;
        size_t off = 0, sz = (size_t)m->size;
        unsigned char want[8];
        for (int q = 0; q < m->size; q++) { /* this rank's share: (off + i) % size == rank */
            size_t n = counts ? counts[q] : count;
            for (size_t i = ((size_t)m->rank + sz - off % sz) % sz; i < n; i += sz) {
                mx_put(t, want, 0, mx_value(m, t, MX_EXACT, q, i));
                if (!mx_same(want, (char *)out + (off + i) * es, es)) {
                    mx_fail(m, "%s: rank %d's element %zu: got %.9g want %.9g", what, q, i,
                            mx_get(t, out, off + i), mx_get(t, want, 0));
                    q = m->size;
                    break;
                }
            }
            off += n;
        }
        mx_hashes(m, what, mx_hash_bytes(0, out, total * es), true);
    }
    if (!in_place)
        free(in);
    free(out);
}

/* alltoallv: rank q sends rank p a block of mx_a2a_count(q, p) elements (0 for a third of the
 * pairs, sizes that differ per pair), each element a function of (q, p, i); every rank checks
 * every block it received and that the results agree (hash of all blocks, gathered). */
static inline size_t mx_a2a_count(size_t count, int q, int p) {
    return (q + p) % 3 == 1 || count == 0 ? 0 : count + (size_t)q + 2 * (size_t)p;
}

static inline void mx_alltoallv(mx_ctx *m, fl_dtype t, size_t count) {
    char what[160];
    mx_name(what, sizeof what, "alltoallv", t, -1, MX_EXACT, count);
    m->case_id++;
    size_t es = fl_dtype_size(t), stotal = 0, rtotal = 0, n = (size_t)m->size;
    size_t *sc = mx_alloc(2 * n * sizeof *sc), *rc_ = sc + n;
    for (int p = 0; p < m->size; p++) {
        sc[p] = mx_a2a_count(count, m->rank, p);
        rc_[p] = mx_a2a_count(count, p, m->rank);
        stotal += sc[p];
        rtotal += rc_[p];
    }
    char *in = mx_alloc(stotal * es), *out = mx_alloc(rtotal * es);
    memset(out, 0xa5, rtotal * es);
    size_t off = 0;
    for (int p = 0; p < m->size; p++)
        for (size_t i = 0; i < sc[p]; i++, off++)
            mx_put(t, in, off, mx_value(m, t, MX_EXACT, m->rank, (size_t)p << 32 | i));
    if (mx_rc(m, fl_comm_alltoallv(m->c, in, sc, out, rc_, t), what)) {
        m->checks++;
        unsigned char want[8];
        off = 0;
        bool bad = false;
        for (int q = 0; q < m->size && !bad; q++) {
            for (size_t i = 0; i < rc_[q] && !bad; i++) {
                mx_put(t, want, 0, mx_value(m, t, MX_EXACT, q, (size_t)m->rank << 32 | i));
                if (!mx_same(want, out + (off + i) * es, es)) {
                    mx_fail(m, "%s: from rank %d, element %zu: got %.9g want %.9g", what, q, i,
                            mx_get(t, out, off + i), mx_get(t, want, 0));
                    bad = true;
                }
            }
            off += rc_[q];
        }
        mx_hashes(m, what, mx_hash_bytes(0, out, rtotal * es), false);
    }
    free(in);
    free(out);
    free(sc);
}

/* alltoall: rank q sends rank p a block of count elements, each a function of (q, p, i), by
 * the blocking or the async call; every rank checks every block it received bit for bit (they
 * are copies) and the results fold into the hash. */
static inline void mx_alltoall(mx_ctx *m, fl_dtype t, size_t count, bool async) {
    char what[160];
    mx_name(what, sizeof what, async ? "ialltoall" : "alltoall", t, -1, MX_EXACT, count);
    m->case_id++;
    size_t es = fl_dtype_size(t), n = (size_t)m->size;
    char *in = mx_alloc(n * count * es), *out = mx_alloc(n * count * es);
    memset(out, 0xa5, n * count * es);
    for (size_t p = 0; p < n; p++)
        for (size_t i = 0; i < count; i++)
            mx_put(t, in, p * count + i, mx_value(m, t, MX_EXACT, m->rank, p << 32 | i));
    fl_request *r = NULL;
    int rc = async ? fl_comm_ialltoall(m->c, in, out, count, t, &r)
                   : fl_comm_alltoall(m->c, in, out, count, t);
    if (rc >= 0)
        rc = fl_request_wait(r);
    if (mx_rc(m, rc, what)) {
        m->checks++;
        unsigned char want[8];
        bool bad = false;
        for (int q = 0; q < m->size && !bad; q++) {
            for (size_t i = 0; i < count && !bad; i++) {
                size_t at = (size_t)q * count + i;
                mx_put(t, want, 0, mx_value(m, t, MX_EXACT, q, (size_t)m->rank << 32 | i));
                if (!mx_same(want, out + at * es, es)) {
                    mx_fail(m, "%s: from rank %d, element %zu: got %.9g want %.9g", what, q, i,
                            mx_get(t, out, at), mx_get(t, want, 0));
                    bad = true;
                }
            }
        }
        mx_hashes(m, what, mx_hash_bytes(0, out, n * count * es), false);
    }
    free(in);
    free(out);
}

static inline void mx_broadcast(mx_ctx *m, fl_dtype t, size_t count, int root) {
    char what[160];
    mx_name(what, sizeof what, "broadcast", t, -1, MX_EXACT, count);
    snprintf(what + strlen(what), sizeof what - strlen(what), " root %d", root);
    m->case_id++;
    size_t es = fl_dtype_size(t);
    void *buf = mx_alloc(count * es);
    for (size_t i = 0; i < count; i++) /* non-roots start from their own values */
        mx_put(t, buf, i, mx_value(m, t, MX_EXACT, m->rank, i));
    if (mx_rc(m, fl_comm_broadcast(m->c, buf, count, t, root), what)) {
        m->checks++;
        unsigned char want[8];
        for (size_t i = 0; i < count; i++) {
            mx_put(t, want, 0, mx_value(m, t, MX_EXACT, root, i));
            if (!mx_same(want, (char *)buf + i * es, es)) {
                mx_fail(m, "%s: element %zu: got %.9g want %.9g", what, i, mx_get(t, buf, i),
                        mx_get(t, want, 0));
                break;
            }
        }
        mx_hashes(m, what, mx_hash_bytes(0, buf, count * es), true);
    }
    free(buf);
}

/* Several iallreduces (and an iallgather, an ibroadcast) outstanding at once while this thread
 * computes the expected results; then a blocking allreduce right behind more async ones. They
 * must complete in issue order with the right results. */
static inline void mx_async(mx_ctx *m, size_t count) {
    enum { NA = 4 };
    static const fl_dtype ts[NA] = {FL_DTYPE_F32, FL_DTYPE_I64, FL_DTYPE_F16, FL_DTYPE_F64};
    static const fl_redop ops[NA] = {FL_REDOP_SUM, FL_REDOP_MAX, FL_REDOP_AVG, FL_REDOP_SUM};
    static const int kinds[NA] = {MX_EXACT, MX_EXACT, MX_EXACT, MX_ORDER};
    void *bufs[NA];
    long ids[NA];
    fl_request *req[NA + 2] = {0};
    char what[160];
    snprintf(what, sizeof what, "async iallreduce x%d + iallgather + ibroadcast count %zu", NA,
             count);
    for (int k = 0; k < NA; k++) {
        ids[k] = ++m->case_id;
        bufs[k] = mx_alloc(count * fl_dtype_size(ts[k]));
        for (size_t i = 0; i < count; i++)
            mx_put(ts[k], bufs[k], i, mx_value(m, ts[k], kinds[k], m->rank, i));
    }
    long gid = ++m->case_id;
    int32_t *gin = mx_alloc(count * 4), *gout = mx_alloc(count * 4 * (size_t)m->size);
    for (size_t i = 0; i < count; i++)
        gin[i] = (int32_t)mx_value(m, FL_DTYPE_I32, MX_EXACT, m->rank, i);
    long bid = ++m->case_id;
    int root = (int)(count % (size_t)m->size);
    double *bbuf = mx_alloc(count * 8);
    for (size_t i = 0; i < count; i++)
        bbuf[i] = m->rank == root ? mx_value(m, FL_DTYPE_F64, MX_EXACT, root, i) : -1;

    bool ok = true;
    for (int k = 0; k < NA && ok; k++)
        ok = mx_rc(m, fl_comm_iallreduce(m->c, bufs[k], count, ts[k], ops[k], &req[k]), what);
    if (ok)
        ok = mx_rc(m, fl_comm_iallgather(m->c, gin, gout, count, FL_DTYPE_I32, &req[NA]), what);
    if (ok)
        ok = mx_rc(m, fl_comm_ibroadcast(m->c, bbuf, count, FL_DTYPE_F64, root, &req[NA + 1]),
                   what);
    /* the caller computes meanwhile: here, the expected results */
    void *want[NA];
    long saved = m->case_id;
    for (int k = 0; k < NA; k++) {
        want[k] = mx_alloc(count * fl_dtype_size(ts[k]));
        m->case_id = ids[k];
        if (kinds[k] == MX_EXACT)
            for (size_t i = 0; i < count; i++)
                mx_put_expected(m, ts[k], ops[k], want[k], i,
                                mx_expect(m, ts[k], ops[k], kinds[k], i, NULL));
    }
    m->case_id = saved;
    if (ok) {
        /* the last one done means all before it are done (issue order) */
        int rc = fl_request_wait(req[NA + 1]);
        req[NA + 1] = NULL;
        if (mx_rc(m, rc, what)) {
            m->checks++;
            for (int k = 0; k < NA + 1; k++)
                if (!fl_request_test(req[k]))
                    mx_fail(m, "%s: request %d not complete after request %d", what, k, NA + 1);
        }
    }
    for (int k = 0; k < NA + 2; k++) {
        int rc = fl_request_wait(req[k]);
        if (ok && rc < 0)
            ok = mx_rc(m, rc, what);
    }
    if (ok) {
        for (int k = 0; k < NA; k++) {
            saved = m->case_id;
            m->case_id = ids[k];
            if (kinds[k] == MX_EXACT) {
                m->checks++;
                if (memcmp(want[k], bufs[k], count * fl_dtype_size(ts[k])) != 0)
                    mx_fail(m, "%s: iallreduce %d (%s %s) result wrong", what, k,
                            fl_dtype_name(ts[k]), fl_redop_name(ops[k]));
            } else {
                mx_check_reduced(m, what, ts[k], ops[k], kinds[k], bufs[k], 0, count, 0, 1);
            }
            m->case_id = saved;
        }
        saved = m->case_id;
        m->checks++;
        m->case_id = gid;
        for (int q = 0; q < m->size; q++)
            for (size_t i = 0; i < count; i++)
                if (gout[(size_t)q * count + i] !=
                    (int32_t)mx_value(m, FL_DTYPE_I32, MX_EXACT, q, i)) {
                    mx_fail(m, "%s: iallgather: rank %d's element %zu wrong", what, q, i);
                    q = m->size;
                    break;
                }
        m->case_id = bid;
        for (size_t i = 0; i < count; i++)
            if (bbuf[i] != mx_value(m, FL_DTYPE_F64, MX_EXACT, root, i)) {
                mx_fail(m, "%s: ibroadcast: element %zu wrong", what, i);
                break;
            }
        m->case_id = saved;
        uint64_t h = 0;
        for (int k = 0; k < NA; k++)
            h = mx_hash_bytes(h, bufs[k], count * fl_dtype_size(ts[k]));
        mx_hashes(m, what, h, true);
    }
    for (int k = 0; k < NA; k++) {
        free(bufs[k]);
        free(want[k]);
    }
    free(gin);
    free(gout);
    free(bbuf);
    if (!ok)
        return;

    /* a blocking call behind async ones waits for them */
    snprintf(what, sizeof what, "iallreduce then blocking allreduce count %zu", count);
    long id1 = ++m->case_id, id2 = ++m->case_id;
    float *a = mx_alloc(count * 4), *b = mx_alloc(count * 4);
    m->case_id = id1;
    for (size_t i = 0; i < count; i++)
        a[i] = (float)mx_value(m, FL_DTYPE_F32, MX_EXACT, m->rank, i);
    m->case_id = id2;
    for (size_t i = 0; i < count; i++)
        b[i] = (float)mx_value(m, FL_DTYPE_F32, MX_EXACT, m->rank, i);
    fl_request *r = NULL;
    if (mx_rc(m, fl_comm_iallreduce(m->c, a, count, FL_DTYPE_F32, FL_REDOP_SUM, &r), what) &&
        mx_rc(m, fl_comm_allreduce(m->c, b, count, FL_DTYPE_F32, FL_REDOP_MAX), what)) {
        m->checks++;
        if (!fl_request_test(r))
            mx_fail(m, "%s: the blocking call returned before the async one completed", what);
        if (mx_rc(m, fl_request_wait(r), what)) {
            m->case_id = id1;
            mx_check_reduced(m, what, FL_DTYPE_F32, FL_REDOP_SUM, MX_EXACT, a, 0, count, 0, 1);
            m->case_id = id2;
            mx_check_reduced(m, what, FL_DTYPE_F32, FL_REDOP_MAX, MX_EXACT, b, 0, count, 0, 1);
        }
        r = NULL;
    }
    fl_request_wait(r);
    m->case_id = id2;
    free(a);
    free(b);
}

/* Runs the whole matrix for each count. Returns this rank's failures (and m->fatal). */
static inline long mx_run(mx_ctx *m, const size_t *counts, int ncounts) {
    static const fl_redop ops[] = {FL_REDOP_SUM, FL_REDOP_AVG, FL_REDOP_MAX};
    m->rank = fl_comm_rank(m->c);
    m->size = fl_comm_size(m->c);
    if (m->max_reports == 0)
        m->max_reports = 20;
    for (int ci = 0; ci < ncounts && !m->fatal; ci++) {
        size_t count = counts[ci];
        for (int d = 0; d < MX_NDTYPES && !m->fatal; d++) {
            fl_dtype t = mx_dtypes[d];
            for (int o = 0; o < 3 && !m->fatal; o++) {
                mx_allreduce(m, t, ops[o], MX_EXACT, count);
                mx_reduce_scatter(m, t, ops[o], MX_EXACT, count);
                if (fl_dtype_is_float(t) && ops[o] != FL_REDOP_MAX) {
                    mx_allreduce(m, t, ops[o], MX_ORDER, count);
                    mx_reduce_scatter(m, t, ops[o], MX_ORDER, count);
                }
            }
        }
        size_t *vc = mx_alloc(2 * (size_t)m->size * sizeof *vc), *uc = vc + m->size;
        for (int q = 0; q < m->size; q++) { /* some ranks contribute nothing */
            vc[q] = q % 3 == 1 ? 0 : (count ? count + (size_t)q : 0);
            /* very unequal: rank 0 nothing, one rank 3 * count + 5, the others 0 or 1 */
            uc[q] = q == m->size - 1 ? 3 * count + 5 : (size_t)(q % 2);
        }
        for (int d = 0; d < MX_NDTYPES && !m->fatal; d++) {
            fl_dtype t = mx_dtypes[d];
            mx_allgather(m, t, count, NULL, false);
            mx_allgather(m, t, count, vc, false);
            mx_allgather(m, t, count, uc, false);
            mx_alltoallv(m, t, count);
            mx_alltoall(m, t, count, d % 2 == 1);
            mx_broadcast(m, t, count, (int)((count + (size_t)d) % (size_t)m->size));
        }
        if (!m->fatal) {
            mx_allgather(m, FL_DTYPE_U8, count, NULL, true);
            mx_allgather(m, FL_DTYPE_I32, count, vc, true);
            mx_allgather(m, FL_DTYPE_F16, count, uc, true);
        }
        free(vc);
        if (count <= 1000) /* every root */
            for (int root = 0; root < m->size && !m->fatal; root++)
                mx_broadcast(m, FL_DTYPE_F32, count, root);
        if (!m->fatal)
            mx_rc(m, fl_comm_barrier(m->c), "barrier");
        if (!m->fatal && count > 0)
            mx_async(m, count);
    }
    return m->failures;
}

#endif /* FLEET_TESTS_COMM_MATRIX_H */
