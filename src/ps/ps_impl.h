/* ps_impl.h - the inside of an fl_ps handle (include/fleet/ps.h), shared by the role reader
 * (ps_role.c), the worker's client (ps_client*.c) and the server (server*.c). Private to
 * src/ps. */
#ifndef FLEET_PS_IMPL_H
#define FLEET_PS_IMPL_H

#include "fleet/msgconn.h"
#include "fleet/ps.h"

#include <stdbool.h>
#include <stdint.h>

/* Who a process is in a PS job: what fl_ps_init reads from the environment, or what a test
 * fills in by hand (then several servers and workers can live in one process). */
typedef struct {
    bool          server;     /* PSERVER, else TRAINER */
    int           index;      /* this server's or this worker's index */
    int           nservers, nworkers;
    const char   *const *servers; /* [nservers] "host:port" */
    const char   *const *workers; /* [nworkers] or NULL: only used to name workers */
    fl_msg_config msg;        /* world = nservers + nworkers, token, round, encrypt, timeout */
    int           listen_fd;  /* a server's inherited listening socket, -1: bind the endpoint */
} fl_ps_roles;

/* A handle from explicit roles (copied). FL_ECONFIG naming the field when inconsistent. */
int fl_ps_create(const fl_ps_roles *r, fl_ps **out);

struct ps_server;      /* server.h */
struct ps_client;      /* ps_client.h */

struct fl_ps {
    bool   server;
    int    index, nservers, nworkers;
    char (*servers)[FL_ENDPOINT_MAX]; /* [nservers] */
    char (*workers)[FL_ENDPOINT_MAX]; /* [nworkers] or NULL */
    fl_msg_config msg;
    int    listen_fd;
    int64_t resume_step;              /* fl_ps_set_resume_step; -1 none */
    struct ps_server *srv;            /* after fl_ps_init_server */
    struct ps_client *cli;            /* after fl_ps_init_worker */
};

/* The server's and the client's halves of fl_ps_free. */
void fl_ps_server_free(struct ps_server *s);
void fl_ps_client_free(struct ps_client *c);

/* Thread of a sparse id among a server's T shard threads: a second mix of the id, so that it
 * does not follow the split over servers (all ids of one server share fl_ps_shard_of(id, S)). */
static inline int fl_ps_thread_of(uint64_t id, int nthreads) {
    return fl_ps_shard_of(id * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull, nthreads);
}

#endif /* FLEET_PS_IMPL_H */
