/* registry.c - picks a communicator backend: env->backend if set, else mpi when the process
 * was started by mpirun / srun (OMPI_COMM_WORLD_SIZE or PMI_SIZE set) and fleet was built
 * with MPI, else tcp. The only place besides mpi.c that knows whether MPI was built. */
#include "registry.h"

#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

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
        return fl_fail(FL_EUNSUPPORTED, "backend nccl is not built yet (use tcp or mpi)");
    return fl_fail(FL_EINVAL, "unknown comm backend \"%s\" (want tcp or mpi)", name);
}
