/* ps_wire.h - the parameter server's messages as bytes: one request or reply per msgconn
 * message (include/fleet/msgconn.h carries, authenticates and frames them). Pure encode/parse
 * functions (no I/O, no allocation, no library state) so that tests/fuzz/fuzz_ps_wire.c can
 * drive them with arbitrary bytes; every parser checks each count against the message's size
 * and a sane bound, and says why it refused in a short reason.
 *
 * All integers and floats are little-endian (f64 for learning rates and rule fields, f32 for
 * values). Every layout below starts with an 8-byte head and keeps its u64 arrays 8-byte
 * aligned and its f32 arrays 4-byte aligned inside the message, so that a parsed message's
 * arrays are pointers into the (malloc'ed) receive buffer, not copies. Byte offsets:
 *
 *   request head: 0 magic "FLPQ" u32 | 4 type u16 | 6 table u16 (0 where there is none)
 *   HELLO       8 worker u32 | 12 mode u32 | 16 servers u32 | 20 workers u32 | 24 version u32 |
 *               28 reserved u32 (0)                                                     = 32
 *   DENSE_INIT  8 numel i64 | 16 resume step i64 (-1 none) | 24 rule (56) | 80 nvalues u64
 *               (0, or this server's share of the table) | 88 values f32[nvalues]
 *   DENSE_PULL  8 version i64 (< 0: what is there)                                       = 16
 *   DENSE_PUSH  8 step i64 | 16 lr f64 | 24 ngrads u64 | 32 grads f32[ngrads]
 *   SPARSE_INIT 8 dim u32 | 12 init type u32 | 16 rule (56) | 72 init a f64 | 80 init b f64 |
 *               88 init seed u64 | 96 opts (56)                                          = 152
 *   SPARSE_PULL 8 n u64 | 16 ids u64[n]
 *   SPARSE_PUSH 8 step i64 | 16 lr f64 | 24 n u64 | 32 dim u32 | 36 flags u32 (bit 0: counts) |
 *               40 ids u64[n] | grads f32[n * dim] | with counts: shows f32[n], clicks f32[n]
 *               (finite, >= 0; without: one show per id)
 *   SAVE        8 step i64 | 16 mode u32 | 20 reserved u32 (0)                           = 24
 *   STOP        (head only)                                                              = 8
 *   SHRINK, STATS (head only, with the table)                                            = 8
 *   opts (56): 0 entry u32 | 4 delete after unseen u32 | 8 entry count | 16 entry
 *              probability | 24 show/click decay | 32 delete threshold | 40 nonclk coeff |
 *              48 click coeff (f64 each)
 *   rule (56): 0 type u32 | 4 nesterov u32 (0/1) | 8 momentum | 16 weight decay | 24 beta1 |
 *              32 beta2 | 40 epsilon | 48 initial g2sum (f64 each)
 *
 *   reply head: 0 magic "FLPR" u32 | 4 status u32 (0 ok, 1 error) | 8 type u16 (of the request
 *               answered) | 10 reserved u16 (0) | 12 reserved u32 (0)                   = 16
 *   error       16 text (the rest of the message, 1 .. FL_PS_ERR_MAX bytes, no NUL)
 *   HELLO, SPARSE_INIT, STOP: head only
 *   DENSE_INIT  16 version i64 | 24 saved step i64 (-1: nothing loaded)                   = 32
 *   DENSE_PULL  16 version i64 | 24 n u64 | 32 values f32[n]
 *   DENSE_PUSH, SPARSE_PUSH  16 version i64 (after this push) | 24 staleness i64         = 32
 *   SPARSE_PULL 16 n u64 | 24 dim u32 | 28 reserved u32 (0) | 32 rows f32[n * dim]
 *   SAVE        16 step i64                                                              = 24
 *   SHRINK, STATS 16 removed u64 (STATS: 0) | 24 rows u64 | 32 bytes u64                  = 40
 *
 * What parse checks: magic, type, reserved fields zero, each count against the bytes that are
 * there (exact: no trailing bytes) and against bounds (FL_PS_MAX_* below), finite learning
 * rates and rule fields, known enum values. What it leaves to the server: whether the numbers
 * fit the tables (a numel equal to the declared one, ids' dim equal to the table's). */
#ifndef FLEET_PS_WIRE_H
#define FLEET_PS_WIRE_H

#include "fleet/ps.h"

#include <stddef.h>
#include <stdint.h>

#define FL_PS_REQ_MAGIC   0x51504c46u /* "FLPQ" */
#define FL_PS_REP_MAGIC   0x52504c46u /* "FLPR" */
#define FL_PS_WIRE_VERSION 2 /* 2: SPARSE_INIT's opts, SPARSE_PUSH's counts, SHRINK, STATS */
#define FL_PS_REQ_HEAD    8
#define FL_PS_REP_HEAD    16
#define FL_PS_HEAD_MAX    152  /* longest fixed part of any message */
#define FL_PS_REQ_PARTS   4    /* most pieces of a request: head, ids, gradients, counts */
#define FL_PS_ERR_MAX     1024 /* longest error text */
#define FL_PS_MAX_NUMEL   ((int64_t)1 << 40) /* values of one dense table */
#define FL_PS_MAX_DIM     4096               /* values of one sparse row */
#define FL_PS_MAX_WORKERS 4096

enum {
    FL_PS_MSG_HELLO = 1,
    FL_PS_MSG_DENSE_INIT = 2,
    FL_PS_MSG_DENSE_PULL = 3,
    FL_PS_MSG_DENSE_PUSH = 4,
    FL_PS_MSG_SPARSE_INIT = 5,
    FL_PS_MSG_SPARSE_PULL = 6,
    FL_PS_MSG_SPARSE_PUSH = 7,
    FL_PS_MSG_SAVE = 8,
    FL_PS_MSG_STOP = 9,
    FL_PS_MSG_SHRINK = 10,
    FL_PS_MSG_STATS = 11,
    FL_PS_MSG_COUNT
};

/* "DENSE_PUSH"; "?" for an unknown type. */
const char *fl_ps_msg_name(int type);

/* A request. Arrays point into the parsed buffer (or, to encode, at the caller's data). */
typedef struct {
    int type;
    int table;                       /* 0 .. FL_PS_MAX_TABLES-1 for table requests */
    /* HELLO */
    int worker, mode, servers, workers, version;
    /* DENSE_INIT: numel, step (resume), rule, n/values. DENSE_PULL: version64.
     * DENSE_PUSH: step, lr, n/values (the gradients). SPARSE_INIT: dim, rule, init, opts.
     * SPARSE_PULL: n/ids. SPARSE_PUSH: step, lr, n/ids, dim, values (n * dim gradients),
     * counts (NULL, or n shows then n clicks). SAVE: step, save_mode. SHRINK, STATS: table. */
    int64_t numel, step, version64;
    double lr;
    fl_ps_rule rule;
    fl_ps_init_rule init;
    fl_ps_sparse_opts opts;
    int dim, save_mode;
    uint64_t n;
    const uint64_t *ids;
    const float *values;
    const float *counts;
} fl_ps_req;

/* A reply. */
typedef struct {
    int type;                        /* the request's */
    int status;                      /* 0 ok, 1 error */
    const char *err;                 /* error: text (not NUL-terminated) of err_len bytes */
    size_t err_len;
    int64_t version, step, staleness; /* DENSE_INIT: version, step (saved); PUSH: version,
                                        staleness; SAVE: step; DENSE_PULL: version */
    uint64_t n;                       /* DENSE_PULL: values; SPARSE_PULL: rows */
    uint64_t removed, rows, bytes;    /* SHRINK, STATS */
    int dim;                          /* SPARSE_PULL */
    const float *values;
} fl_ps_rep;

/* One piece of a message to send: the head, then the arrays, gathered in order. */
typedef struct {
    const void *p;
    size_t      n;
} fl_ps_span;

/* Encodes r's fixed part into head[FL_PS_HEAD_MAX] and lists the message's pieces in
 * parts[0..FL_PS_REQ_PARTS) (parts[0] is head; the arrays follow, borrowed from r). Returns
 * the number of parts (1 .. 4). r must be valid (FL_ASSERT on an unknown type). */
int fl_ps_req_encode(const fl_ps_req *r, uint8_t head[FL_PS_HEAD_MAX],
                     fl_ps_span parts[FL_PS_REQ_PARTS]);
int fl_ps_rep_encode(const fl_ps_rep *r, uint8_t head[FL_PS_HEAD_MAX], fl_ps_span parts[2]);
/* Total bytes of the parts. */
size_t fl_ps_span_bytes(const fl_ps_span *parts, int nparts);

/* Parses the message buf[0..n) (buf 8-byte aligned, as malloc gives it). 0 and *out filled
 * (arrays point into buf), or -1 with a reason in reason[cap] ("SPARSE_PUSH of 3 ids of dim 8
 * needs 152 bytes, got 150"). A reply parser also checks the answered type against want_type
 * (an error reply may answer any type). */
int fl_ps_req_parse(const void *buf, size_t n, fl_ps_req *out, char *reason, size_t cap);
int fl_ps_rep_parse(const void *buf, size_t n, int want_type, fl_ps_rep *out, char *reason,
                    size_t cap);

#endif /* FLEET_PS_WIRE_H */
