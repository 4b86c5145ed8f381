/* server_reply.c - how a parameter server's receiving thread answers a worker (server.h): a
 * reply, a refusal (the worker hears why, and the server fails with it), the refusal of a
 * request that found the server failed, the check that a table request names a declared table,
 * and the room for a reply's values. */
#include "server.h"

#include "fleet/status.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_send_reply(ps_recv *r, const fl_ps_rep *rep) {
    uint8_t head[FL_PS_HEAD_MAX];
    fl_ps_span sp[2];
    int np = fl_ps_rep_encode(rep, head, sp);
    fl_msg_part parts[2];
    for (int i = 0; i < np; i++)
        parts[i] = (fl_msg_part){sp[i].p, sp[i].n};
    return fl_msg_sendv(r->m, parts, np);
}

int ps_refuse(ps_recv *r, int type, int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fl_ps_rep rep = {.type = type, .status = 1, .err = msg, .err_len = strlen(msg)};
    ps_send_reply(r, &rep); /* best effort: the worker may be gone */
    ps_server_fail(r->s, code, msg);
    return fl_fail(code, "%s", msg);
}

int ps_failed_reply(ps_recv *r, int type) {
    char msg[1100];
    snprintf(msg, sizeof msg, "server %d stopped serving: %s", r->s->s, r->s->fail_msg);
    pthread_mutex_unlock(&r->s->mu);
    fl_ps_rep rep = {.type = type, .status = 1, .err = msg, .err_len = strlen(msg)};
    ps_send_reply(r, &rep);
    pthread_mutex_lock(&r->s->mu);
    return fl_fail(FL_EPEER, "%s", msg);
}

int ps_grow(void **p, int64_t *cap, int64_t want, size_t size) {
    if (want <= *cap)
        return 0;
    int64_t n = want < 1024 ? 1024 : want;
    void *q = realloc(*p, (size_t)n * size);
    if (!q)
        return fl_fail(FL_ENOMEM, "out of memory for %" PRId64 " entries", n);
    *p = q;
    *cap = n;
    return 0;
}

int ps_out_reserve(ps_recv *r, int64_t n) {
    int64_t cap = (int64_t)r->out_cap;
    int rc = ps_grow((void **)&r->out, &cap, n, sizeof(float));
    r->out_cap = (size_t)cap;
    return rc;
}

void ps_describe_owner(ps_server *s, int by, char *buf, size_t cap) {
    if (by >= 0)
        snprintf(buf, cap, "%s declared", s->names[by]);
    else
        snprintf(buf, cap, "server %d's checkpoint (step %" PRId64 ") has", s->s,
                 s->loaded_step);
}

int ps_need_table(ps_recv *r, const fl_ps_req *q, bool dense) {
    pthread_mutex_lock(&r->s->mu);
    bool ok = dense ? r->s->dense[q->table].declared && r->s->dense[q->table].ready
                    : r->s->sparse[q->table].declared;
    pthread_mutex_unlock(&r->s->mu);
    if (!ok)
        return ps_refuse(r, q->type, FL_EPEER, "%s sends %s for %s table %d, which it has not "
                         "declared", r->name, fl_ps_msg_name(q->type), dense ? "dense" : "sparse",
                         q->table);
    return 0;
}
