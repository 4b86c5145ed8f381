/* env.c - who this process is in the job, read from what its launcher exported: fleetrun /
 * paddle.distributed.launch (PADDLE_*), torchrun (RANK, WORLD_SIZE, MASTER_*), mpirun (OMPI_* or
 * PMI_*), plus fleet's own FLEET_* knobs. Every refusal names the variable and its value, since
 * a typo in a launch script is the usual cause. */
#include "comm_impl.h"
#include "wire.h"

#include "fleet/comm.h"
#include "fleet/log.h"
#include "fleet/status.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define DEFAULT_TIMEOUT_S 300.0

/* getenv, with "" counted as unset. */
static const char *env_get(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

/* Parses a whole decimal integer. 0 ok, -1 not an integer. */
static int parse_long(const char *s, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || isspace((unsigned char)s[0]))
        return -1;
    *out = v;
    return 0;
}

static int read_size(const char *name, const char *v, int *out) {
    long n;
    if (parse_long(v, &n) < 0)
        return fl_fail(FL_ECONFIG, "%s=%s is not an integer", name, v);
    if (n < 1 || n > FL_COMM_MAX_RANKS)
        return fl_fail(FL_ECONFIG, "%s=%s is out of range (1..%d)", name, v, FL_COMM_MAX_RANKS);
    *out = (int)n;
    return 0;
}

/* rank_name=v within 0..size-1; `of` says where size came from ("PADDLE_TRAINERS_NUM=4"). */
static int read_rank(const char *name, const char *v, int size, const char *of, int *out) {
    long n;
    if (parse_long(v, &n) < 0)
        return fl_fail(FL_ECONFIG, "%s=%s is not an integer", name, v);
    if (n < 0 || n >= size)
        return fl_fail(FL_ECONFIG, "%s=%s is out of range for %s", name, v, of);
    *out = (int)n;
    return 0;
}

/* Same endpoint, written the same or differently ("LOCALHOST:6170" vs "localhost:6170"). */
bool fl_comm_same_endpoint(const char *a, const char *b) {
    char ha[FL_WIRE_ENDPOINT_LEN], hb[FL_WIRE_ENDPOINT_LEN];
    int pa, pb;
    if (fl_wire_endpoint_parse(a, ha, sizeof ha, &pa, NULL, 0) != FL_WIRE_OK ||
        fl_wire_endpoint_parse(b, hb, sizeof hb, &pb, NULL, 0) != FL_WIRE_OK)
        return strcmp(a, b) == 0;
    return pa == pb && strcasecmp(ha, hb) == 0;
}

int fl_comm_endpoints_split(const char *name, const char *list, int max,
                            char (**out)[FL_ENDPOINT_MAX], int *count) {
    int n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    if (n > max)
        return fl_fail(FL_ECONFIG, "%s has %d entries, more than %d", name, n, max);
    char (*eps)[FL_ENDPOINT_MAX] = calloc((size_t)n, sizeof *eps);
    if (!eps)
        return fl_fail(FL_ENOMEM, "out of memory reading %s", name);
    const char *p = list;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const char *e = strchr(p, ',');
        if (!e)
            e = p + strlen(p);
        while (p < e && isspace((unsigned char)*p))
            p++;
        const char *q = e;
        while (q > p && isspace((unsigned char)q[-1]))
            q--;
        size_t len = (size_t)(q - p);
        char reason[128];
        if (len == 0)
            rc = fl_fail(FL_ECONFIG, "%s has an empty entry (number %d)", name, i);
        else if (len >= FL_WIRE_ENDPOINT_LEN)
            rc = fl_fail(FL_ECONFIG, "cannot parse endpoint '%.*s' in %s: longer than %d "
                         "characters", (int)len, p, name, FL_WIRE_ENDPOINT_LEN - 1);
        if (rc == 0) {
            memcpy(eps[i], p, len);
            eps[i][len] = '\0';
            if (fl_wire_endpoint_parse(eps[i], NULL, 0, NULL, reason, sizeof reason) !=
                FL_WIRE_OK)
                rc = fl_fail(FL_ECONFIG, "cannot parse endpoint '%s' in %s: %s", eps[i], name,
                             reason);
        }
        for (int j = 0; rc == 0 && j < i; j++)
            if (fl_comm_same_endpoint(eps[j], eps[i]))
                rc = fl_fail(FL_ECONFIG, "%s lists %s twice (entries %d and %d)", name, eps[j],
                             j, i);
        p = *e ? e + 1 : e;
    }
    if (rc < 0) {
        free(eps);
        return rc;
    }
    *out = eps;
    *count = n;
    return FL_OK;
}

/* Splits PADDLE_TRAINER_ENDPOINTS into env->endpoints; sets *count. */
static int read_endpoints(fl_comm_env *env, const char *name, const char *list, int *count) {
    return fl_comm_endpoints_split(name, list, FL_COMM_MAX_RANKS, &env->endpoints, count);
}

/* fleetrun / paddle.distributed.launch */
static int read_paddle(fl_comm_env *env) {
    const char *id = env_get("PADDLE_TRAINER_ID"), *num = env_get("PADDLE_TRAINERS_NUM");
    const char *eps = env_get("PADDLE_TRAINER_ENDPOINTS");
    const char *cur = env_get("PADDLE_CURRENT_ENDPOINT");
    char of[96];
    int count = 0;
    if (!id)
        return fl_fail(FL_ECONFIG, "PADDLE_TRAINER_ID is not set (but %s is)",
                       num ? "PADDLE_TRAINERS_NUM" : "PADDLE_TRAINER_ENDPOINTS");
    if (num)
        FL_TRY(read_size("PADDLE_TRAINERS_NUM", num, &env->size));
    if (eps)
        FL_TRY(read_endpoints(env, "PADDLE_TRAINER_ENDPOINTS", eps, &count));
    if (num && eps && count != env->size)
        return fl_fail(FL_ECONFIG, "PADDLE_TRAINER_ENDPOINTS has %d entries but "
                       "PADDLE_TRAINERS_NUM=%s", count, num);
    if (!num && eps)
        env->size = count;
    if (num)
        snprintf(of, sizeof of, "PADDLE_TRAINERS_NUM=%s", num);
    else if (eps)
        snprintf(of, sizeof of, "the %d entries of PADDLE_TRAINER_ENDPOINTS", count);
    else
        snprintf(of, sizeof of, "a single trainer (PADDLE_TRAINERS_NUM is not set)");
    FL_TRY(read_rank("PADDLE_TRAINER_ID", id, env->size, of, &env->rank));
    if (env->size > 1 && !eps && strcmp(env->backend, "mpi") != 0)
        return fl_fail(FL_ECONFIG, "PADDLE_TRAINERS_NUM=%s but PADDLE_TRAINER_ENDPOINTS is not "
                       "set", num);
    if (cur && eps) {
        char reason[128];
        if (fl_wire_endpoint_parse(cur, NULL, 0, NULL, reason, sizeof reason) != FL_WIRE_OK)
            return fl_fail(FL_ECONFIG, "cannot parse endpoint '%s' in PADDLE_CURRENT_ENDPOINT: "
                           "%s", cur, reason);
        if (!fl_comm_same_endpoint(cur, env->endpoints[env->rank]))
            return fl_fail(FL_ECONFIG, "PADDLE_CURRENT_ENDPOINT=%s is not entry %d of "
                           "PADDLE_TRAINER_ENDPOINTS (%s)", cur, env->rank,
                           env->endpoints[env->rank]);
    }
    return 0;
}

/* torchrun: endpoints are exchanged through MASTER_ADDR:MASTER_PORT at rendezvous. */
static int read_torchrun(fl_comm_env *env) {
    const char *rank = env_get("RANK"), *world = env_get("WORLD_SIZE");
    if (!rank || !world)
        return fl_fail(FL_ECONFIG, "%s is set but %s is not (torchrun sets both)",
                       rank ? "RANK" : "WORLD_SIZE", rank ? "WORLD_SIZE" : "RANK");
    FL_TRY(read_size("WORLD_SIZE", world, &env->size));
    char of[64];
    snprintf(of, sizeof of, "WORLD_SIZE=%s", world);
    FL_TRY(read_rank("RANK", rank, env->size, of, &env->rank));
    if (env->size == 1 || strcmp(env->backend, "mpi") == 0)
        return 0;
    const char *addr = env_get("MASTER_ADDR"), *port = env_get("MASTER_PORT");
    if (!addr || !port)
        return fl_fail(FL_ECONFIG, "WORLD_SIZE=%s needs MASTER_ADDR and MASTER_PORT (%s is not "
                       "set)", world, addr ? "MASTER_PORT" : "MASTER_ADDR");
    long p;
    if (parse_long(port, &p) < 0 || p < 1 || p > 65535)
        return fl_fail(FL_ECONFIG, "MASTER_PORT=%s is not a port number (1..65535)", port);
    char ep[FL_WIRE_ENDPOINT_LEN + 16], reason[128];
    bool v6 = strchr(addr, ':') && addr[0] != '[';
    snprintf(ep, sizeof ep, v6 ? "[%s]:%ld" : "%s:%ld", addr, p);
    if (strlen(ep) >= FL_ENDPOINT_MAX ||
        fl_wire_endpoint_parse(ep, NULL, 0, NULL, reason, sizeof reason) != FL_WIRE_OK)
        return fl_fail(FL_ECONFIG, "MASTER_ADDR=%s is not a usable address (%s)", addr,
                       strlen(ep) >= FL_ENDPOINT_MAX ? "too long" : reason);
    memcpy(env->master, ep, strlen(ep) + 1); /* fits: checked above */
    return 0;
}

/* mpirun (OpenMPI) or a PMI launcher (MPICH, srun): the mpi backend. */
static int read_mpi(fl_comm_env *env) {
    const char *rn = "OMPI_COMM_WORLD_RANK", *sn = "OMPI_COMM_WORLD_SIZE";
    if (!env_get(rn) && !env_get(sn)) {
        rn = "PMI_RANK";
        sn = "PMI_SIZE";
    }
    const char *rank = env_get(rn), *size = env_get(sn);
    if (!rank || !size)
        return fl_fail(FL_ECONFIG, "%s is set but %s is not", rank ? rn : sn, rank ? sn : rn);
    FL_TRY(read_size(sn, size, &env->size));
    char of[64];
    snprintf(of, sizeof of, "%s=%s", sn, size);
    FL_TRY(read_rank(rn, rank, env->size, of, &env->rank));
    if (env->backend[0] == '\0')
        snprintf(env->backend, sizeof env->backend, "mpi");
    if (strcmp(env->backend, "tcp") == 0 && env->size > 1)
        return fl_fail(FL_ECONFIG, "FLEET_COMM_BACKEND=tcp, but mpirun gives no endpoints "
                       "(%s=%s): use the mpi backend, or start the job with fleetrun", sn, size);
    return 0;
}

/* FNV-1a over s, from seed. */
static uint64_t fnv1a(uint64_t h, const char *s) {
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

/* Without FLEET_JOB_TOKEN a multi-rank job still needs every rank to agree on one: derive it
 * from what they share. It keeps two jobs from joining each other by accident, but anyone who
 * can read the endpoint list can compute it. */
static void derive_token(fl_comm_env *env) {
    const char *from = env->master[0] ? "MASTER_ADDR:MASTER_PORT" : "PADDLE_TRAINER_ENDPOINTS";
    uint64_t a = fnv1a(14695981039346656037ull, "fleet-job-token\n");
    uint64_t b = fnv1a(0x6a09e667f3bcc908ull, "fleet-job-token\n");
    char size[16];
    snprintf(size, sizeof size, "%d\n", env->size);
    a = fnv1a(a, size);
    b = fnv1a(b, size);
    if (env->master[0]) {
        a = fnv1a(a, env->master);
        b = fnv1a(b, env->master);
    }
    for (int i = 0; env->endpoints && i < env->size; i++) {
        a = fnv1a(fnv1a(a, env->endpoints[i]), ",");
        b = fnv1a(fnv1a(b, env->endpoints[i]), ",");
    }
    snprintf(env->token, sizeof env->token, "derived-%016llx%016llx", (unsigned long long)a,
             (unsigned long long)b);
    FL_WARN("comm: FLEET_JOB_TOKEN is not set; using a token derived from %s (fleetrun always "
            "sets one; set FLEET_JOB_TOKEN for jobs started another way)", from);
}

/* FLEET_* and FLAGS_selected_gpus: the same whichever launcher started us (also read by the
 * parameter server's role maker, src/ps/ps_role.c). */
int fl_comm_env_knobs(fl_comm_env *env) {
    const char *v;
    if ((v = env_get("FLEET_COMM_BACKEND"))) {
        if (strcmp(v, "tcp") != 0 && strcmp(v, "mpi") != 0 && strcmp(v, "auto") != 0)
            return fl_fail(FL_ECONFIG, "FLEET_COMM_BACKEND=%s is not a backend (tcp, mpi or "
                           "auto)", v);
        if (strcmp(v, "auto") != 0)
            snprintf(env->backend, sizeof env->backend, "%s", v);
    }
    if ((v = env_get("FLEET_COMM_LOCAL"))) {
        if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
            return fl_fail(FL_ECONFIG, "FLEET_COMM_LOCAL=%s: expected 1 (peers on this host use a "
                           "unix socket, the default) or 0 (TCP only)", v);
        env->tcp_only = strcmp(v, "0") == 0;
    }
    if ((v = env_get("FLEET_COMM_ENCRYPT"))) {
        if (strcmp(v, "0") == 0 || strcmp(v, "off") == 0)
            env->encrypt = FL_COMM_ENCRYPT_OFF;
        else if (strcmp(v, "1") == 0 || strcmp(v, "on") == 0)
            env->encrypt = FL_COMM_ENCRYPT_ON;
        else if (strcmp(v, "auto") != 0)
            return fl_fail(FL_ECONFIG, "FLEET_COMM_ENCRYPT=%s: expected 1 (encrypt every "
                           "connection), 0 (none) or auto (between hosts, the default)", v);
    }
    if ((v = env_get("FLEET_RESTART_COUNT"))) {
        long n;
        if (parse_long(v, &n) < 0 || n < 0 || n > INT_MAX)
            return fl_fail(FL_ECONFIG, "FLEET_RESTART_COUNT=%s is not a round number", v);
        env->round = (unsigned)n;
    }
    if ((v = env_get("FLEET_COMM_TIMEOUT"))) {
        char *end;
        double s = strtod(v, &end);
        if (end == v || *end != '\0' || !isfinite(s) || s <= 0)
            return fl_fail(FL_ECONFIG, "FLEET_COMM_TIMEOUT=%s is not a positive number of "
                           "seconds", v);
        env->timeout_s = s;
    }
    if ((v = env_get("FLAGS_selected_gpus"))) {
        char first[32];
        size_t n = strcspn(v, ",");
        snprintf(first, sizeof first, "%.*s", (int)(n < 31 ? n : 31), v);
        long g;
        if (n >= 31 || parse_long(first, &g) < 0 || g < 0 || g > 4096)
            return fl_fail(FL_ECONFIG, "FLAGS_selected_gpus=%s is not a GPU index", v);
        env->gpu = (int)g;
    }
    if ((v = env_get("FLEET_LISTEN_FD"))) {
        long fd;
        int on = 0;
        socklen_t len = sizeof on;
        if (parse_long(v, &fd) < 0 || fd < 0 || fd > INT_MAX)
            return fl_fail(FL_ECONFIG, "FLEET_LISTEN_FD=%s is not a file descriptor", v);
        if (getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) < 0)
            return fl_fail(FL_ECONFIG, "FLEET_LISTEN_FD=%s is not a listening socket: %s", v,
                           strerror(errno));
        if (!on)
            return fl_fail(FL_ECONFIG, "FLEET_LISTEN_FD=%s is a socket that is not listening",
                           v);
        env->listen_fd = (int)fd;
    }
    if ((v = env_get("FLEET_JOB_TOKEN"))) {
        size_t n = strlen(v);
        if (n > FL_TOKEN_MAX - 1)
            return fl_fail(FL_ECONFIG, "FLEET_JOB_TOKEN is %zu characters long; at most %d", n,
                           FL_TOKEN_MAX - 1);
        memcpy(env->token, v, n + 1);
    }
    return 0;
}

int fl_comm_env_read(fl_comm_env *env) {
    FL_ASSERT(env);
    memset(env, 0, sizeof *env);
    env->rank = 0;
    env->size = 1;
    env->timeout_s = DEFAULT_TIMEOUT_S;
    env->listen_fd = -1;
    env->gpu = -1;
    int rc = fl_comm_env_knobs(env);
    if (rc < 0)
        goto fail;
    if (env_get("PADDLE_TRAINER_ID") || env_get("PADDLE_TRAINERS_NUM") ||
        env_get("PADDLE_TRAINER_ENDPOINTS"))
        rc = read_paddle(env);
    else if (env_get("RANK") || env_get("WORLD_SIZE"))
        rc = read_torchrun(env);
    else if (env_get("OMPI_COMM_WORLD_RANK") || env_get("OMPI_COMM_WORLD_SIZE") ||
             env_get("PMI_RANK") || env_get("PMI_SIZE"))
        rc = read_mpi(env);
    if (rc < 0 || (rc = fl_comm_env_topology(env)) < 0)
        goto fail;
    if (env->size > 1 && !env->token[0] && strcmp(env->backend, "mpi") != 0)
        derive_token(env);
    return 0;
fail:
    fl_comm_env_clear(env);
    return rc;
}

void fl_comm_env_clear(fl_comm_env *env) {
    if (!env)
        return;
    free(env->endpoints);
    env->endpoints = NULL;
}

/* FLEET_COMM_SPIN_US: microseconds a rank busy-polls per exchange before it sleeps (default 50;
 * 0 turns spinning off, e.g. when many more ranks than cores share a machine). */
#define SPIN_US_DEFAULT 50
double fl_comm_spin_budget_s(void) {
    const char *v = getenv("FLEET_COMM_SPIN_US");
    if (!v || !*v)
        return SPIN_US_DEFAULT * 1e-6;
    char *end;
    long us = strtol(v, &end, 10);
    if (*end || us < 0 || us > 1000000) {
        FL_WARN("FLEET_COMM_SPIN_US=%s is not a number of microseconds in [0, 1000000]; using %d",
                v, SPIN_US_DEFAULT);
        return SPIN_US_DEFAULT * 1e-6;
    }
    return (double)us * 1e-6;
}
