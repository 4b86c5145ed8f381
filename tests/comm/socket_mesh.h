/* socket_mesh.h - socketpairs between every two of n ranks, for tests that run a communicator's
 * ranks as threads or forked processes over fl_comm_tcp_from_fds / fl_transport_from_fds.
 * Header-only. */
#ifndef FLEET_TESTS_SOCKET_MESH_H
#define FLEET_TESTS_SOCKET_MESH_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

/* fds[r * n + q] is rank r's end towards rank q (fds[r * n + r] = -1); malloc'd, free it.
 * flags: extra socket type flags (SOCK_CLOEXEC). Exits the test on failure. */
static inline int *socket_mesh(int n, int flags) {
    int *fds = malloc((size_t)n * (size_t)n * sizeof *fds);
    if (!fds) {
        perror("malloc");
        exit(1);
    }
    for (int r = 0; r < n; r++) {
        fds[r * n + r] = -1;
        for (int q = r + 1; q < n; q++) {
            int sv[2];
            if (socketpair(AF_UNIX, SOCK_STREAM | flags, 0, sv) < 0) {
                perror("socketpair");
                exit(1);
            }
            fds[r * n + q] = sv[0];
            fds[q * n + r] = sv[1];
        }
    }
    return fds;
}

#endif /* FLEET_TESTS_SOCKET_MESH_H */
