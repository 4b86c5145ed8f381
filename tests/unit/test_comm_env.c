/* test_comm_env.c - fl_comm_env_read: the variables of fleetrun/paddle launch, torchrun and
 * mpirun, fleet's own knobs, and every inconsistency refused with a message naming the
 * variable and its value. */
#include "test.h"

#include "fleet/comm.h"
#include "fleet/log.h"
#include "fleet/status.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *all_vars[] = {
    "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS",
    "PADDLE_CURRENT_ENDPOINT", "FLAGS_selected_gpus", "RANK", "WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
    "FLEET_JOB_TOKEN", "FLEET_COMM_TIMEOUT", "FLEET_LISTEN_FD", "FLEET_COMM_BACKEND",
    "FLEET_COMM_LOCAL", "FLEET_COMM_ENCRYPT", "FLEET_RESTART_COUNT", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++)
        unsetenv(all_vars[i]);
}

/* Sets "NAME=value" pairs (NULL-terminated list) on a clean environment. */
static void set_env(const char *const *kv) {
    clear_env();
    for (; kv && kv[0]; kv += 2)
        setenv(kv[0], kv[1], 1);
}

/* Expects fl_comm_env_read to refuse with a message containing each needle. */
static void expect_refusal(int line, const char *const *kv, const char *n1, const char *n2) {
    set_env(kv);
    fl_comm_env env;
    int rc = fl_comm_env_read(&env);
    if (rc != FL_ECONFIG) {
        fprintf(stderr, "%s:%d: env_read returned %d, want FL_ECONFIG (%s)\n", __FILE__, line, rc,
                fl_errmsg());
        test_failures++;
        if (rc == 0)
            fl_comm_env_clear(&env);
        return;
    }
    CHECK(env.endpoints == NULL); /* nothing leaks on failure */
    if ((n1 && !strstr(fl_errmsg(), n1)) || (n2 && !strstr(fl_errmsg(), n2))) {
        fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\" / \"%s\"\n", __FILE__, line,
                fl_errmsg(), n1, n2 ? n2 : "");
        test_failures++;
    }
}
#define REFUSED(n1, n2, ...) \
    expect_refusal(__LINE__, (const char *const[]){__VA_ARGS__, NULL}, n1, n2)

static void test_defaults(void) {
    clear_env();
    fl_comm_env env;
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.rank == 0 && env.size == 1 && env.endpoints == NULL && env.master[0] == '\0');
    CHECK(env.token[0] == '\0'); /* a single rank needs none */
    CHECK(env.timeout_s == 300.0 && env.listen_fd == -1 && env.gpu == -1);
    CHECK(env.backend[0] == '\0');
    fl_comm_env_clear(&env);
    CHECK(env.endpoints == NULL);
    fl_comm_env_clear(&env); /* twice is fine */
}

static void test_paddle(void) {
    fl_comm_env env;
    set_env((const char *[]){"PADDLE_TRAINER_ID", "2", "PADDLE_TRAINERS_NUM", "4",
                             "PADDLE_TRAINER_ENDPOINTS",
                             "127.0.0.1:6170,127.0.0.1:6171, 127.0.0.1:6172 ,[::1]:6173",
                             "PADDLE_CURRENT_ENDPOINT", "127.0.0.1:6172", "FLAGS_selected_gpus",
                             "3", "FLEET_JOB_TOKEN", "tok-123", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.rank == 2 && env.size == 4 && env.gpu == 3);
    CHECK(env.endpoints && strcmp(env.endpoints[0], "127.0.0.1:6170") == 0);
    CHECK(env.endpoints && strcmp(env.endpoints[2], "127.0.0.1:6172") == 0); /* trimmed */
    CHECK(env.endpoints && strcmp(env.endpoints[3], "[::1]:6173") == 0);
    CHECK(strcmp(env.token, "tok-123") == 0 && env.master[0] == '\0');
    fl_comm_env_clear(&env);

    /* PADDLE_TRAINERS_NUM may be left out: the endpoint list gives the count */
    set_env((const char *[]){"PADDLE_TRAINER_ID", "1", "PADDLE_TRAINER_ENDPOINTS",
                             "a:1,b:2,c:3", "FLAGS_selected_gpus", "1,2", NULL});
    fl_log_set_level(FL_LOG_ERROR); /* the derived-token warning is expected here */
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.size == 3 && env.rank == 1 && env.gpu == 1);
    /* no FLEET_JOB_TOKEN: derived from the endpoint list, the same on every rank */
    char tok[FL_TOKEN_MAX];
    snprintf(tok, sizeof tok, "%s", env.token);
    CHECK(tok[0] != '\0');
    fl_comm_env_clear(&env);
    setenv("PADDLE_TRAINER_ID", "2", 1);
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(strcmp(env.token, tok) == 0);
    fl_comm_env_clear(&env);
    setenv("PADDLE_TRAINER_ENDPOINTS", "a:1,b:2,c:4", 1);
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(strcmp(env.token, tok) != 0); /* another job, another token */
    fl_comm_env_clear(&env);
    fl_log_set_level(FL_LOG_INFO);

    /* a single trainer needs no endpoints */
    set_env((const char *[]){"PADDLE_TRAINER_ID", "0", "PADDLE_TRAINERS_NUM", "1", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.size == 1 && env.rank == 0 && env.token[0] == '\0');
    fl_comm_env_clear(&env);

    REFUSED("PADDLE_TRAINER_ID=5 is out of range for PADDLE_TRAINERS_NUM=4", NULL,
            "PADDLE_TRAINER_ID", "5", "PADDLE_TRAINERS_NUM", "4", "PADDLE_TRAINER_ENDPOINTS",
            "h:1,h:2,h:3,h:4");
    REFUSED("PADDLE_TRAINER_ID=-1 is out of range", NULL, "PADDLE_TRAINER_ID", "-1",
            "PADDLE_TRAINERS_NUM", "4", "PADDLE_TRAINER_ENDPOINTS", "h:1,h:2,h:3,h:4");
    REFUSED("PADDLE_TRAINER_ID=x1 is not an integer", NULL, "PADDLE_TRAINER_ID", "x1",
            "PADDLE_TRAINERS_NUM", "1");
    REFUSED("PADDLE_TRAINER_ID=3 is out of range for the 3 entries of PADDLE_TRAINER_ENDPOINTS",
            NULL, "PADDLE_TRAINER_ID", "3", "PADDLE_TRAINER_ENDPOINTS", "h:1,h:2,h:3");
    REFUSED("PADDLE_TRAINERS_NUM=0 is out of range", NULL, "PADDLE_TRAINER_ID", "0",
            "PADDLE_TRAINERS_NUM", "0");
    REFUSED("PADDLE_TRAINERS_NUM=4x is not an integer", NULL, "PADDLE_TRAINER_ID", "0",
            "PADDLE_TRAINERS_NUM", "4x");
    REFUSED("PADDLE_TRAINERS_NUM=5000 is out of range", NULL, "PADDLE_TRAINER_ID", "0",
            "PADDLE_TRAINERS_NUM", "5000");
    REFUSED("PADDLE_TRAINER_ENDPOINTS has 3 entries but PADDLE_TRAINERS_NUM=4", NULL,
            "PADDLE_TRAINER_ID", "0", "PADDLE_TRAINERS_NUM", "4", "PADDLE_TRAINER_ENDPOINTS",
            "h:1,h:2,h:3");
    REFUSED("PADDLE_TRAINERS_NUM=2 but PADDLE_TRAINER_ENDPOINTS is not set", NULL,
            "PADDLE_TRAINER_ID", "0", "PADDLE_TRAINERS_NUM", "2");
    REFUSED("PADDLE_TRAINER_ID is not set", NULL, "PADDLE_TRAINERS_NUM", "2",
            "PADDLE_TRAINER_ENDPOINTS", "h:1,h:2");
    REFUSED("PADDLE_CURRENT_ENDPOINT=127.0.0.1:6171 is not entry 0 of PADDLE_TRAINER_ENDPOINTS "
            "(127.0.0.1:6170)", NULL, "PADDLE_TRAINER_ID", "0", "PADDLE_TRAINERS_NUM", "2",
            "PADDLE_TRAINER_ENDPOINTS", "127.0.0.1:6170,127.0.0.1:6171",
            "PADDLE_CURRENT_ENDPOINT", "127.0.0.1:6171");
    REFUSED("cannot parse endpoint 'bogus' in PADDLE_CURRENT_ENDPOINT", NULL,
            "PADDLE_TRAINER_ID", "0", "PADDLE_TRAINER_ENDPOINTS", "h:1,h:2",
            "PADDLE_CURRENT_ENDPOINT", "bogus");
    REFUSED("cannot parse endpoint 'localhost:abc' in PADDLE_TRAINER_ENDPOINTS", NULL,
            "PADDLE_TRAINER_ID", "0", "PADDLE_TRAINERS_NUM", "2", "PADDLE_TRAINER_ENDPOINTS",
            "localhost:6170,localhost:abc");
    REFUSED("cannot parse endpoint 'h:70000' in PADDLE_TRAINER_ENDPOINTS", "port",
            "PADDLE_TRAINER_ID", "0", "PADDLE_TRAINER_ENDPOINTS", "h:1,h:70000");
    REFUSED("cannot parse endpoint '::1:80' in PADDLE_TRAINER_ENDPOINTS", "[addr]:port",
            "PADDLE_TRAINER_ID", "0", "PADDLE_TRAINER_ENDPOINTS", "h:1,::1:80");
    REFUSED("PADDLE_TRAINER_ENDPOINTS has an empty entry", NULL, "PADDLE_TRAINER_ID", "0",
            "PADDLE_TRAINER_ENDPOINTS", "h:1,,h:2");
    REFUSED("PADDLE_TRAINER_ENDPOINTS has an empty entry", NULL, "PADDLE_TRAINER_ID", "0",
            "PADDLE_TRAINER_ENDPOINTS", "h:1,h:2,");
    REFUSED("PADDLE_TRAINER_ENDPOINTS lists h:2 twice (entries 1 and 2)", NULL,
            "PADDLE_TRAINER_ID", "0", "PADDLE_TRAINER_ENDPOINTS", "h:1,h:2,H:2");
    REFUSED("FLAGS_selected_gpus=gpu0 is not a GPU index", NULL, "FLAGS_selected_gpus", "gpu0");
    char longep[100];
    memset(longep, 'h', sizeof longep);
    strcpy(longep + 70, ":6170");
    REFUSED("in PADDLE_TRAINER_ENDPOINTS: longer than 63 characters", "hhhh:6170",
            "PADDLE_TRAINER_ID", "0", "PADDLE_TRAINER_ENDPOINTS", longep);
}

static void test_torchrun(void) {
    fl_comm_env env;
    set_env((const char *[]){"RANK", "1", "WORLD_SIZE", "3", "MASTER_ADDR", "10.1.2.3",
                             "MASTER_PORT", "29500", "FLEET_JOB_TOKEN", "t", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.rank == 1 && env.size == 3);
    CHECK(env.endpoints == NULL); /* to be exchanged through the master */
    CHECK(strcmp(env.master, "10.1.2.3:29500") == 0);
    fl_comm_env_clear(&env);
    set_env((const char *[]){"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "fd00::1",
                             "MASTER_PORT", "29500", NULL});
    fl_log_set_level(FL_LOG_ERROR);
    CHECK_OK(fl_comm_env_read(&env));
    fl_log_set_level(FL_LOG_INFO);
    CHECK(strcmp(env.master, "[fd00::1]:29500") == 0);
    CHECK(env.token[0] != '\0'); /* derived from the master address */
    fl_comm_env_clear(&env);
    set_env((const char *[]){"RANK", "0", "WORLD_SIZE", "1", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.size == 1 && env.master[0] == '\0');
    fl_comm_env_clear(&env);
    /* paddle's variables win over torchrun's */
    set_env((const char *[]){"RANK", "5", "WORLD_SIZE", "8", "PADDLE_TRAINER_ID", "0",
                             "PADDLE_TRAINERS_NUM", "1", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.size == 1 && env.rank == 0);
    fl_comm_env_clear(&env);

    REFUSED("RANK=4 is out of range for WORLD_SIZE=4", NULL, "RANK", "4", "WORLD_SIZE", "4",
            "MASTER_ADDR", "h", "MASTER_PORT", "1");
    REFUSED("RANK is set but WORLD_SIZE is not", NULL, "RANK", "0");
    REFUSED("WORLD_SIZE is set but RANK is not", NULL, "WORLD_SIZE", "2");
    REFUSED("WORLD_SIZE=two is not an integer", NULL, "RANK", "0", "WORLD_SIZE", "two");
    REFUSED("MASTER_ADDR", "WORLD_SIZE=2", "RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT",
            "29500");
    REFUSED("MASTER_PORT=99999 is not a port number", NULL, "RANK", "0", "WORLD_SIZE", "2",
            "MASTER_ADDR", "h", "MASTER_PORT", "99999");
    REFUSED("MASTER_ADDR=bad host is not a usable address", NULL, "RANK", "0", "WORLD_SIZE", "2",
            "MASTER_ADDR", "bad host", "MASTER_PORT", "1");
}

static void test_mpirun(void) {
    fl_comm_env env;
    set_env((const char *[]){"OMPI_COMM_WORLD_RANK", "3", "OMPI_COMM_WORLD_SIZE", "4", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.rank == 3 && env.size == 4 && strcmp(env.backend, "mpi") == 0);
    CHECK(env.endpoints == NULL && env.token[0] == '\0');
    fl_comm_env_clear(&env);
    set_env((const char *[]){"PMI_RANK", "1", "PMI_SIZE", "2", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.rank == 1 && env.size == 2 && strcmp(env.backend, "mpi") == 0);
    fl_comm_env_clear(&env);
    REFUSED("OMPI_COMM_WORLD_RANK=4 is out of range for OMPI_COMM_WORLD_SIZE=4", NULL,
            "OMPI_COMM_WORLD_RANK", "4", "OMPI_COMM_WORLD_SIZE", "4");
    REFUSED("OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not", NULL,
            "OMPI_COMM_WORLD_SIZE", "4");
    REFUSED("FLEET_COMM_BACKEND=tcp", "mpirun", "OMPI_COMM_WORLD_RANK", "0",
            "OMPI_COMM_WORLD_SIZE", "2", "FLEET_COMM_BACKEND", "tcp");
}

static void test_knobs(void) {
    fl_comm_env env;
    set_env((const char *[]){"FLEET_COMM_TIMEOUT", "2.5", "FLEET_COMM_BACKEND", "tcp", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.timeout_s == 2.5 && strcmp(env.backend, "tcp") == 0);
    fl_comm_env_clear(&env);
    set_env((const char *[]){"FLEET_COMM_BACKEND", "auto", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.backend[0] == '\0');
    fl_comm_env_clear(&env);
    REFUSED("FLEET_COMM_TIMEOUT=0 is not a positive number of seconds", NULL,
            "FLEET_COMM_TIMEOUT", "0");
    REFUSED("FLEET_COMM_TIMEOUT=-3", NULL, "FLEET_COMM_TIMEOUT", "-3");
    REFUSED("FLEET_COMM_TIMEOUT=ten", NULL, "FLEET_COMM_TIMEOUT", "ten");
    REFUSED("FLEET_COMM_TIMEOUT=5s", NULL, "FLEET_COMM_TIMEOUT", "5s");
    REFUSED("FLEET_COMM_TIMEOUT=inf", NULL, "FLEET_COMM_TIMEOUT", "inf");
    REFUSED("FLEET_COMM_BACKEND=nccl is not a backend", NULL, "FLEET_COMM_BACKEND", "nccl");
    set_env((const char *[]){"FLEET_COMM_LOCAL", "0", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.tcp_only == 1);
    fl_comm_env_clear(&env);
    set_env((const char *[]){"FLEET_COMM_LOCAL", "1", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.tcp_only == 0);
    fl_comm_env_clear(&env);
    REFUSED("FLEET_COMM_LOCAL=yes: expected 1", NULL, "FLEET_COMM_LOCAL", "yes");
    clear_env(); /* encryption: automatic unless said */
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.encrypt == FL_COMM_ENCRYPT_AUTO && env.round == 0);
    fl_comm_env_clear(&env);
    const char *enc[][2] = {{"1", "2"}, {"on", "2"}, {"0", "1"}, {"off", "1"}, {"auto", "0"}};
    for (int i = 0; i < 5; i++) {
        set_env((const char *[]){"FLEET_COMM_ENCRYPT", enc[i][0], NULL});
        CHECK_OK(fl_comm_env_read(&env));
        CHECK(env.encrypt == enc[i][1][0] - '0');
        fl_comm_env_clear(&env);
    }
    REFUSED("FLEET_COMM_ENCRYPT=yes: expected 1", NULL, "FLEET_COMM_ENCRYPT", "yes");
    set_env((const char *[]){"FLEET_RESTART_COUNT", "3", NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.round == 3);
    fl_comm_env_clear(&env);
    REFUSED("FLEET_RESTART_COUNT=-1 is not a round", NULL, "FLEET_RESTART_COUNT", "-1");

    /* token: up to 64 characters */
    char tok[80];
    memset(tok, 'a', 64);
    tok[64] = '\0';
    set_env((const char *[]){"FLEET_JOB_TOKEN", tok, NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(strcmp(env.token, tok) == 0);
    fl_comm_env_clear(&env);
    strcat(tok, "b");
    REFUSED("FLEET_JOB_TOKEN is 65 characters long; at most 64", NULL, "FLEET_JOB_TOKEN", tok);

    /* FLEET_LISTEN_FD must be a listening socket */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    char num[16];
    snprintf(num, sizeof num, "%d", s);
    REFUSED("is a socket that is not listening", num, "FLEET_LISTEN_FD", num);
    CHECK(listen(s, 4) == 0);
    set_env((const char *[]){"FLEET_LISTEN_FD", num, NULL});
    CHECK_OK(fl_comm_env_read(&env));
    CHECK(env.listen_fd == s);
    fl_comm_env_clear(&env);
    close(s);
    int f = open("/dev/null", O_RDONLY);
    snprintf(num, sizeof num, "%d", f);
    REFUSED("is not a listening socket", num, "FLEET_LISTEN_FD", num);
    close(f);
    REFUSED("FLEET_LISTEN_FD=9999 is not a listening socket", NULL, "FLEET_LISTEN_FD", "9999");
    REFUSED("FLEET_LISTEN_FD=fd3 is not a file descriptor", NULL, "FLEET_LISTEN_FD", "fd3");
}

/* Reads env from kv and checks the topology fields. */
static void expect_topology(int line, const char *const *kv, int local_rank, int local_size,
                            int node, int nnodes) {
    set_env(kv);
    fl_comm_env env;
    int rc = fl_comm_env_read(&env);
    if (rc != 0) {
        fprintf(stderr, "%s:%d: env_read failed: %s\n", __FILE__, line, fl_errmsg());
        test_failures++;
        return;
    }
    if (env.local_rank != local_rank || env.local_size != local_size || env.node != node ||
        env.nnodes != nnodes) {
        fprintf(stderr, "%s:%d: topology local %d of %d, node %d of %d; want local %d of %d, "
                "node %d of %d\n", __FILE__, line, env.local_rank, env.local_size, env.node,
                env.nnodes, local_rank, local_size, node, nnodes);
        test_failures++;
    }
    fl_comm_env_clear(&env);
}
#define TOPOLOGY(lr, ls, nd, nn, ...) \
    expect_topology(__LINE__, (const char *const[]){__VA_ARGS__, NULL}, lr, ls, nd, nn)

/* Node and local rank: from the launcher's variables, else the endpoints' hosts. */
static void test_topology(void) {
    const char *eps = "10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170,10.0.0.2:6171,10.0.0.3:6170";
    TOPOLOGY(0, 1, 0, 1, "FLEET_COMM_LOCAL", "1"); /* alone */
    TOPOLOGY(1, 2, 1, 3, "PADDLE_TRAINER_ID", "3", "PADDLE_TRAINERS_NUM", "5",
             "PADDLE_TRAINER_ENDPOINTS", eps, "PADDLE_CURRENT_ENDPOINT", "10.0.0.2:6171");
    TOPOLOGY(0, 1, 2, 3, "PADDLE_TRAINER_ID", "4", "PADDLE_TRAINERS_NUM", "5",
             "PADDLE_TRAINER_ENDPOINTS", eps, "PADDLE_CURRENT_ENDPOINT", "10.0.0.3:6170");
    TOPOLOGY(2, 3, 0, 1, "PADDLE_TRAINER_ID", "2", "PADDLE_TRAINERS_NUM", "3",
             "PADDLE_TRAINER_ENDPOINTS", "[::1]:1,[::1]:2,[::1]:3", "PADDLE_CURRENT_ENDPOINT",
             "[::1]:3");
    /* the launcher's variables win over the endpoints: 2 nodes of 2 emulated on one host */
    const char *one_host = "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4";
    TOPOLOGY(1, 2, 1, 2, "PADDLE_TRAINER_ID", "3", "PADDLE_TRAINERS_NUM", "4",
             "PADDLE_TRAINER_ENDPOINTS", one_host, "PADDLE_CURRENT_ENDPOINT", "127.0.0.1:4",
             "LOCAL_RANK", "1", "LOCAL_WORLD_SIZE", "2");
    TOPOLOGY(3, 4, 0, 1, "PADDLE_TRAINER_ID", "3", "PADDLE_TRAINERS_NUM", "4",
             "PADDLE_TRAINER_ENDPOINTS", one_host, "PADDLE_CURRENT_ENDPOINT", "127.0.0.1:4");
    TOPOLOGY(0, 3, 1, 2, "RANK", "3", "WORLD_SIZE", "6", "MASTER_ADDR", "127.0.0.1",
             "MASTER_PORT", "29500", "LOCAL_RANK", "0", "LOCAL_WORLD_SIZE", "3", "GROUP_RANK",
             "1");
    TOPOLOGY(1, 2, 2, 3, "OMPI_COMM_WORLD_RANK", "5", "OMPI_COMM_WORLD_SIZE", "6",
             "OMPI_COMM_WORLD_LOCAL_RANK", "1", "OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    TOPOLOGY(0, 1, 5, 6, "OMPI_COMM_WORLD_RANK", "5", "OMPI_COMM_WORLD_SIZE", "6");
    /* inconsistent variables are refused, named */
    REFUSED("LOCAL_RANK is set but LOCAL_WORLD_SIZE is not", NULL, "LOCAL_RANK", "0");
    REFUSED("LOCAL_RANK=2 is not a number from 0 to 1", NULL, "RANK", "2", "WORLD_SIZE", "4",
            "MASTER_ADDR", "h", "MASTER_PORT", "1", "LOCAL_RANK", "2", "LOCAL_WORLD_SIZE", "2");
    REFUSED("LOCAL_WORLD_SIZE=5 is not a number from 1 to 4", NULL, "RANK", "2", "WORLD_SIZE",
            "4", "MASTER_ADDR", "h", "MASTER_PORT", "1", "LOCAL_RANK", "0", "LOCAL_WORLD_SIZE",
            "5");
    REFUSED("GROUP_RANK=2 is not a number from 0 to 1", NULL, "RANK", "2", "WORLD_SIZE", "4",
            "MASTER_ADDR", "h", "MASTER_PORT", "1", "LOCAL_RANK", "0", "LOCAL_WORLD_SIZE", "2",
            "GROUP_RANK", "2");
}

int main(void) {
    test_defaults();
    test_paddle();
    test_torchrun();
    test_mpirun();
    test_knobs();
    test_topology();
    clear_env();
    TEST_DONE();
}
