/* fleet.c - the collective-mode Fleet API's role maker: who this worker is, from the
 * environment a launcher set (Paddle's PaddleCloudRoleMaker), as a thin layer over the
 * communicator, which does the rendezvous. */
#include "fleet/fleet.h"

#include "fleet/status.h"

#include <stdlib.h>

struct fl_fleet {
    fl_comm *comm; /* owned */
    fl_ps   *ps;   /* borrowed: parameter-server mode, else NULL */
};

int fl_fleet_init(const char *backend, fl_fleet **out) {
    FL_ASSERT(out);
    *out = NULL;
    int rc;
    fl_fleet *f = calloc(1, sizeof *f);
    if (!f)
        return fl_fail(FL_ENOMEM, "fleet: out of memory");
    rc = fl_comm_init_from_env(backend && backend[0] ? backend : NULL, &f->comm);
    if (rc < 0)
        goto fail;
    *out = f;
    return FL_OK;
fail:
    fl_fleet_free(f);
    return rc;
}

void fl_fleet_free(fl_fleet *f) {
    if (!f)
        return;
    fl_comm_free(f->comm);
    free(f);
}

int fl_worker_index(const fl_fleet *f) { return fl_comm_rank(f->comm); }
int fl_worker_num(const fl_fleet *f) { return fl_comm_size(f->comm); }

const char *fl_worker_endpoint(const fl_fleet *f, int i) {
    if (i < 0 || i >= fl_comm_size(f->comm))
        return NULL;
    return fl_comm_endpoint(f->comm, i);
}

fl_comm *fl_fleet_comm(fl_fleet *f) { return f->comm; }

int fl_barrier(fl_fleet *f) { return fl_comm_barrier(f->comm); }

void   fl_fleet_set_ps(fl_fleet *f, fl_ps *ps) { f->ps = ps; }
fl_ps *fl_fleet_ps(const fl_fleet *f) { return f->ps; }
