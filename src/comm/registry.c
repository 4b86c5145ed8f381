/* registry.c - makes communicators: a blank one from comm.c filled by the backend picked here
 * (env->backend if set, else mpi when the process was started by mpirun / srun, i.e.
 * OMPI_COMM_WORLD_SIZE or PMI_SIZE set, and fleet was built with MPI, else tcp). The only
 * place besides mpi.c and nccl.c that knows whether MPI and NCCL were built; nccl is chosen
 * only by name (comm.backend: nccl, FLEET_COMM_BACKEND=nccl). */
#include "registry.h"

#include "nccl_comm.h"
#include "tcp.h"

#include "fleet/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool fl_comm_mpi_available(void) {
#ifdef FL_USE_MPI
    return true;
#else
    return false;
#endif
}

#ifndef FL_USE_MPI
int fl_comm_mpi_open(fl_comm *c, const fl_comm_env *env) {
    (void)c;
    (void)env;
    return fl_fail(FL_EUNSUPPORTED, "backend mpi: this fleet was built without MPI "
                   "(install libopenmpi-dev and reconfigure), or use backend tcp");
}
#endif

#ifndef FL_USE_NCCL
bool fl_comm_nccl_available(void) { return false; }

int fl_comm_nccl_open(fl_comm *c, const fl_comm_env *env) {
    (void)c;
    return fl_fail(FL_EUNSUPPORTED, "backend nccl: rank %d: this fleet was built without NCCL "
                   "(it needs the cuda backend and NCCL 2.14+: nvidia-nccl-cu13 or libnccl-dev; "
                   "reconfigure), or use backend tcp", env->rank);
}
#endif

static bool launched_by_mpi(void) {
    const char *a = getenv("OMPI_COMM_WORLD_SIZE"), *b = getenv("PMI_SIZE");
    return (a && *a) || (b && *b);
}

int fl_comm_registry_open(fl_comm *c, const fl_comm_env *env) {
    const char *name = env->backend;
    if (!name[0])
        name = launched_by_mpi() && fl_comm_mpi_available() ? "mpi" : "tcp";
    if (strcmp(name, "tcp") == 0)
        return fl_comm_tcp_open(c, env);
    if (strcmp(name, "mpi") == 0)
        return fl_comm_mpi_open(c, env);
    if (strcmp(name, "nccl") == 0)
        return fl_comm_nccl_open(c, env);
    return fl_fail(FL_EINVAL, "unknown comm backend \"%s\" (want tcp, mpi or nccl)", name);
}

int fl_comm_init(const fl_comm_env *env, fl_comm **out) {
    FL_ASSERT(out != NULL);
    *out = NULL;
    fl_comm_env own;
    int rc;
    bool read_env = env == NULL;
    if (read_env) {
        memset(&own, 0, sizeof own);
        if ((rc = fl_comm_env_read(&own)) < 0)
            return rc;
        env = &own;
    }
    fl_comm *c = fl_comm_new();
    if (!c) {
        rc = FL_ENOMEM;
        goto fail;
    }
    if ((rc = fl_comm_registry_open(c, env)) < 0)
        goto fail;
    c->env_local_size = env->local_size;
    c->env_node = env->node;
    if (read_env)
        fl_comm_env_clear(&own);
    *out = c;
    return 0;
fail:
    fl_comm_free(c);
    if (read_env)
        fl_comm_env_clear(&own);
    return rc;
}

int fl_comm_init_from_env(const char *backend_override, fl_comm **out) {
    FL_ASSERT(out != NULL);
    *out = NULL;
    fl_comm_env env;
    memset(&env, 0, sizeof env);
    int rc = fl_comm_env_read(&env);
    if (rc < 0)
        return rc;
    if (backend_override && backend_override[0]) {
        if (strlen(backend_override) >= sizeof env.backend) {
            rc = fl_fail(FL_EINVAL, "unknown comm backend \"%s\" (want tcp, mpi or nccl)",
                         backend_override);
            goto done;
        }
        snprintf(env.backend, sizeof env.backend, "%s", backend_override);
    }
    rc = fl_comm_init(&env, out);
done:
    fl_comm_env_clear(&env);
    return rc;
}

int fl_comm_tcp_from_fds(int rank, int size, const int *fds, double timeout_s, fl_comm **out) {
    *out = NULL;
    fl_comm *c = fl_comm_new();
    if (!c) { /* the fds are ours to close */
        for (int r = 0; r < size; r++)
            if (r != rank && fds[r] >= 0)
                close(fds[r]);
        return FL_ENOMEM;
    }
    int rc = fl_comm_tcp_open_fds(c, rank, size, fds, timeout_s);
    if (rc < 0) {
        fl_comm_free(c);
        return rc;
    }
    *out = c;
    return 0;
}
