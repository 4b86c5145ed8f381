/* registry.h - where communicators are made: registry.c takes a blank communicator from comm.c
 * (fl_comm_new), picks a backend for it (env->backend, else mpi when launched by mpirun and
 * built, else tcp) and lets that backend's constructor fill it in; fl_comm_init is here.
 * comm.c itself knows no backend. Private to src/comm. */
#ifndef FLEET_COMM_REGISTRY_H
#define FLEET_COMM_REGISTRY_H

#include "comm_impl.h"

/* registry.c: chooses the backend for env and runs its constructor on c. */
int fl_comm_registry_open(fl_comm *c, const fl_comm_env *env);

#endif /* FLEET_COMM_REGISTRY_H */
