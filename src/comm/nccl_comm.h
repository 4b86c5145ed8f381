/* nccl_comm.h - the nccl backend's constructor (nccl.c; docs/nccl.md). Named nccl_comm.h, not
 * nccl.h, so that it never shadows NCCL's own <nccl.h>. Private to src/comm: registry.c is the
 * only caller, and the only file besides nccl.c that knows whether NCCL was built
 * (FL_USE_NCCL). */
#ifndef FLEET_COMM_NCCL_H
#define FLEET_COMM_NCCL_H

#include "comm_impl.h"

#include <stdbool.h>

/* Fills the blank communicator c with the nccl backend for env: binds the rank's GPU
 * (FLAGS_selected_gpus, else the cuda backend's bound device, else LOCAL_RANK), opens fleet's
 * authenticated tcp transport when there are several ranks and broadcasts rank 0's NCCL unique
 * ids over it, then creates FLEET_NCCL_COMM_NUM (default 1) non-blocking NCCL communicators.
 * Fails before any network traffic with "backend nccl: rank R: no CUDA device (...)" where
 * there is no GPU; FL_ETIMEOUT when NCCL's set-up does not finish within env->timeout_s.
 * Without NCCL in the build (registry.c's stub): FL_EUNSUPPORTED. */
int fl_comm_nccl_open(fl_comm *c, const fl_comm_env *env);
/* Whether this fleet was built with the nccl backend. */
bool fl_comm_nccl_available(void);

#endif /* FLEET_COMM_NCCL_H */
