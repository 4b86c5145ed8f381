/* registry.h - where comm.c meets the backends: comm.c makes a blank communicator, registry.c
 * picks a backend for it (env->backend, else mpi when launched by mpirun and built, else tcp)
 * and lets that backend's constructor fill it in. Private to src/comm. */
#ifndef FLEET_COMM_REGISTRY_H
#define FLEET_COMM_REGISTRY_H

#include "comm_impl.h"

/* comm.c: a zeroed communicator with its locks initialised and no backend (ops NULL), to be
 * filled by a backend constructor and released with fl_comm_free. NULL (message set) when out
 * of memory. */
fl_comm *fl_comm_new(void);

/* registry.c: chooses the backend for env and runs its constructor on c. */
int fl_comm_registry_open(fl_comm *c, const fl_comm_env *env);

#endif /* FLEET_COMM_REGISTRY_H */
