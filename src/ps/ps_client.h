/* ps_client.h - the inside of a worker's parameter-server client, private to src/ps: its
 * connections to every server and the scratch of its table operations, shared by the calls
 * over the connections (ps_client.c) and the table operations (ps_client_dense.c,
 * ps_client_sparse.c). Every operation runs whole under the client's lock. */
#ifndef FLEET_PS_CLIENT_H
#define FLEET_PS_CLIENT_H

#include "ps_impl.h"
#include "ps_wire.h"

#include <pthread.h>
#include <stdint.h>

typedef struct ps_client {
    fl_ps_mode    mode;
    int           S;
    fl_msg_conn **conns;      /* [S] */
    char        (*names)[FL_ENDPOINT_MAX + 32];
    void        **rbuf;       /* [S] */
    size_t       *rcap;
    int64_t       dense_numel[FL_PS_MAX_TABLES]; /* 0: not declared */
    int           sparse_dim[FL_PS_MAX_TABLES];
    fl_msg_part  *parts;      /* dense: head + a block per part */
    int64_t       parts_cap;
    /* a sparse call's distinct ids, grouped by server */
    uint64_t     *hkey;       /* open-addressing index of distinct ids */
    int32_t      *hval;
    int64_t       hcap;
    uint64_t     *uid;        /* [nuniq] grouped by server after grouping */
    int32_t      *userver, *upos, *map;
    float        *urows;
    float        *ucounts;    /* per server: its distinct ids' shows, then their clicks */
    int64_t       ucap, mapcap, rowcap, countcap;
    int64_t      *cnt, *off;  /* [S] */
    uint8_t      *pending;    /* [S] 1: a request sent whose reply is not read yet */
    fl_ps_stats   st;
    double        stale_sum;
    pthread_mutex_t call;     /* held for each whole operation (recursive) */
} ps_client;

/* Sends q to server s. 0 or the connection's failure. */
int ps_client_send(fl_ps *ps, int s, const fl_ps_req *q);
/* Sends a request already encoded as parts to server s (marks its reply pending). */
int ps_client_sendv(fl_ps *ps, int s, const fl_msg_part *parts, int nparts);
/* The reply of server s to a `type` request; FL_EPEER carrying the server's message, naming
 * the server, when it refused, closed or sent garbage. A refusal is often another process's
 * failure seen from afar (a server gives up on a worker that died because a second server
 * went silent): before it is passed on, the other servers still owing this operation a reply
 * get REFUSAL_GRACE_S to answer, and one that stays silent or has closed is named first. */
int ps_client_recv(fl_ps *ps, int s, int type, fl_ps_rep *rep);
/* Sends q to every server and collects the replies (*last: the last one). */
int ps_client_all(fl_ps *ps, const fl_ps_req *q, fl_ps_rep *last);
/* FL_ESTATE before fl_ps_init_worker; FL_EINVAL for a table out of range. */
int ps_client_need(const fl_ps *ps);
int ps_client_check_table(int table);
/* Counts a push whose servers answered with at most `stale` staleness. */
void ps_client_count_push(ps_client *c, int64_t stale);
/* Takes the client's lock for one whole operation (FL_ESTATE before fl_ps_init_worker);
 * ps_client_unlock releases it and returns rc. */
int ps_client_lock(fl_ps *ps);
int ps_client_unlock(fl_ps *ps, int rc);

#endif /* FLEET_PS_CLIENT_H */
