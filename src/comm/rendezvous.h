/* rendezvous.h - torchrun-style start-up for the tcp transport: only MASTER_ADDR:MASTER_PORT is
 * known in advance, so every rank learns every other rank's endpoint through rank 0 before the
 * transport's own set-up. Private to src/comm. */
#ifndef FLEET_RENDEZVOUS_H
#define FLEET_RENDEZVOUS_H

#include "fleet/comm.h"

/* Every rank listens on an ephemeral port of the interface that routes to env->master
 * (*listen_fd, owned by the caller on success) and sends (rank, that endpoint) to rank 0 with
 * the job token in a rendezvous handshake; rank 0 listens on env->master, collects all of them
 * (strangers are dropped as on any listener) and answers each rank with the full table, which
 * lands in endpoints[size]. Fails with FL_ETIMEOUT after env->timeout_s naming the ranks that
 * never checked in, or FL_EPEER when rank 0 refuses us or sends a malformed table. */
int fl_rendezvous_exchange(const fl_comm_env *env, char (*endpoints)[FL_ENDPOINT_MAX],
                           int *listen_fd);

#endif /* FLEET_RENDEZVOUS_H */
