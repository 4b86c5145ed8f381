/* test_ps_wire.c - the parameter server's messages (src/ps/ps_wire.c): every request and reply
 * round-trips; each is refused when cut short at any length or given a byte too many; counts
 * that do not fit the message, unknown types, bad magic and reserved bits are refused with a
 * reason; random bytes are never taken for a message. */
#include "test.h"

#include "ps/ps_wire.h"

#include <stdint.h>

static uint64_t buf_space[(1 << 16) / 8]; /* 8-byte aligned, as a receive buffer is */

static int has(const char *s, const char *needle) {
    if (strstr(s, needle))
        return 1;
    fprintf(stderr, "reason \"%s\" lacks \"%s\"\n", s, needle);
    return 0;
}

/* Gathers the parts into buf_space; returns the length. */
static size_t gather(const fl_ps_span *p, int np) {
    size_t n = 0;
    for (int i = 0; i < np; i++) {
        memcpy((uint8_t *)buf_space + n, p[i].p, p[i].n);
        n += p[i].n;
    }
    return n;
}

static size_t enc_req(const fl_ps_req *r) {
    uint8_t head[FL_PS_HEAD_MAX];
    fl_ps_span sp[FL_PS_REQ_PARTS];
    int np = fl_ps_req_encode(r, head, sp);
    size_t n = gather(sp, np);
    CHECK(n == fl_ps_span_bytes(sp, np));
    return n;
}

/* Every prefix and one byte more are refused. */
static void check_lengths_req(size_t n) {
    char why[200];
    for (size_t k = 0; k < n; k++)
        if (fl_ps_req_parse(buf_space, k, NULL, why, sizeof why) == 0) {
            fprintf(stderr, "request accepted when cut to %zu of %zu bytes\n", k, n);
            test_failures++;
            break;
        }
    ((uint8_t *)buf_space)[n] = 0;
    CHECK(fl_ps_req_parse(buf_space, n + 1, NULL, why, sizeof why) < 0);
}

static void test_requests(void) {
    fl_ps_req r, q;
    char why[200];
    float vals[5] = {1, -2, 3.5f, 0, 1e-3f};
    uint64_t ids[3] = {7, UINT64_MAX, 0};
    fl_ps_rule rule = {.type = FL_PS_RULE_ADAM, .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8,
                       .weight_decay = 0.01, .nesterov = true, .momentum = 0.5,
                       .initial_g2sum = 3};

    r = (fl_ps_req){.type = FL_PS_MSG_HELLO, .worker = 2, .mode = FL_PS_GEO, .servers = 3,
                    .workers = 4, .version = FL_PS_WIRE_VERSION};
    size_t n = enc_req(&r);
    CHECK(n == 32 && memcmp(buf_space, "FLPQ", 4) == 0);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0);
    CHECK(q.type == r.type && q.worker == 2 && q.mode == FL_PS_GEO && q.servers == 3 &&
          q.workers == 4);
    check_lengths_req(n);

    r = (fl_ps_req){.type = FL_PS_MSG_DENSE_INIT, .table = 63, .numel = 100, .step = 42,
                    .rule = rule, .n = 5, .values = vals};
    n = enc_req(&r);
    CHECK(n == 88 + 20);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0);
    CHECK(q.table == 63 && q.numel == 100 && q.step == 42 && q.n == 5);
    CHECK(memcmp(&q.rule, &rule, sizeof rule) == 0 || (q.rule.type == rule.type &&
          q.rule.beta2 == rule.beta2 && q.rule.nesterov && q.rule.weight_decay == 0.01 &&
          q.rule.initial_g2sum == 3 && q.rule.momentum == 0.5 && q.rule.epsilon == 1e-8));
    CHECK(memcmp(q.values, vals, sizeof vals) == 0);
    CHECK(q.values == (const float *)((uint8_t *)buf_space + 88)); /* no copy */
    check_lengths_req(n);

    r = (fl_ps_req){.type = FL_PS_MSG_DENSE_PULL, .table = 1, .version64 = -1};
    n = enc_req(&r);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0 && q.version64 == -1);
    check_lengths_req(n);

    r = (fl_ps_req){.type = FL_PS_MSG_DENSE_PUSH, .table = 2, .step = 9, .lr = 0.125, .n = 5,
                    .values = vals};
    n = enc_req(&r);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0);
    CHECK(q.step == 9 && q.lr == 0.125 && q.n == 5 && q.values[2] == 3.5f);
    check_lengths_req(n);

    r = (fl_ps_req){.type = FL_PS_MSG_SPARSE_INIT, .table = 3, .dim = 8, .rule = rule,
                    .init = {FL_PS_INIT_UNIFORM, -0.1, 0.1, 77}};
    r.rule.type = FL_PS_RULE_ADAGRAD;
    r.opts = (fl_ps_sparse_opts){.entry = FL_PS_ENTRY_COUNT, .entry_count = 3,
                                 .entry_probability = 0.25, .show_click_decay = 0.98,
                                 .delete_threshold = 0.8, .nonclk_coeff = 0.1,
                                 .click_coeff = 2, .delete_after_unseen = 30};
    n = enc_req(&r);
    CHECK(n == 152);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0);
    CHECK(q.dim == 8 && q.rule.type == FL_PS_RULE_ADAGRAD && q.init.type == FL_PS_INIT_UNIFORM);
    CHECK(q.init.a == -0.1 && q.init.b == 0.1 && q.init.seed == 77);
    CHECK(memcmp(&q.opts, &r.opts, sizeof r.opts) == 0 ||
          (q.opts.entry == FL_PS_ENTRY_COUNT && q.opts.entry_count == 3 &&
           q.opts.entry_probability == 0.25 && q.opts.show_click_decay == 0.98 &&
           q.opts.delete_threshold == 0.8 && q.opts.nonclk_coeff == 0.1 &&
           q.opts.click_coeff == 2 && q.opts.delete_after_unseen == 30));
    check_lengths_req(n);
    r.opts.show_click_decay = 0; /* out of (0, 1] */
    n = enc_req(&r);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) < 0 && has(why, "life cycle"));
    r.opts.show_click_decay = 1;
    r.opts.entry = (fl_ps_entry_type)3;
    n = enc_req(&r);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) < 0 && has(why, "entry rule 3"));

    r = (fl_ps_req){.type = FL_PS_MSG_SPARSE_PULL, .table = 4, .n = 3, .ids = ids};
    n = enc_req(&r);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0);
    CHECK(q.n == 3 && q.ids[1] == UINT64_MAX && q.ids[2] == 0);
    check_lengths_req(n);

    float g[6] = {1, 2, 3, 4, 5, 6};
    r = (fl_ps_req){.type = FL_PS_MSG_SPARSE_PUSH, .table = 5, .step = 3, .lr = 0.5, .n = 3,
                    .dim = 2, .ids = ids, .values = g};
    n = enc_req(&r);
    CHECK(n == 40 + 3 * 8 + 6 * 4);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0);
    CHECK(q.n == 3 && q.dim == 2 && q.ids[0] == 7 && q.values[5] == 6 && q.lr == 0.5);
    CHECK(q.counts == NULL);
    check_lengths_req(n);

    /* with counts: n shows, then n clicks */
    float counts[6] = {1, 2, 0.5f, 0, 1, 0};
    r.counts = counts;
    n = enc_req(&r);
    CHECK(n == 40 + 3 * 8 + 6 * 4 + 6 * 4);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0);
    CHECK(q.counts && q.counts[1] == 2 && q.counts[4] == 1 && q.values[5] == 6);
    check_lengths_req(n);
    counts[4] = -1;
    n = enc_req(&r);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) < 0 &&
          has(why, "click count -1 of id 18446744073709551615"));
    counts[4] = INFINITY;
    n = enc_req(&r);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) < 0 && has(why, "click count"));
    r.counts = NULL;
    n = enc_req(&r);
    ((uint8_t *)buf_space)[36] = 2; /* unknown flag */
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) < 0 && has(why, "flags"));

    r = (fl_ps_req){.type = FL_PS_MSG_SHRINK, .table = 9};
    n = enc_req(&r);
    CHECK(n == 8 && fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0);
    CHECK(q.type == FL_PS_MSG_SHRINK && q.table == 9);
    check_lengths_req(n);
    r = (fl_ps_req){.type = FL_PS_MSG_STATS, .table = 63};
    n = enc_req(&r);
    CHECK(n == 8 && fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0);
    CHECK(q.type == FL_PS_MSG_STATS && q.table == 63);
    check_lengths_req(n);

    r = (fl_ps_req){.type = FL_PS_MSG_SAVE, .step = 100, .save_mode = FL_PS_SAVE_DELTA};
    n = enc_req(&r);
    CHECK(fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0);
    CHECK(q.step == 100 && q.save_mode == FL_PS_SAVE_DELTA);
    check_lengths_req(n);

    r = (fl_ps_req){.type = FL_PS_MSG_STOP};
    n = enc_req(&r);
    CHECK(n == 8 && fl_ps_req_parse(buf_space, n, &q, why, sizeof why) == 0);
    check_lengths_req(n);
}

static void test_refusals(void) {
    fl_ps_req r;
    char why[200];
    uint8_t *b = (uint8_t *)buf_space;
    uint64_t ids[2] = {1, 2};
    float g[4] = {0};

    /* a count that claims more than the message holds: no huge allocation, a reason */
    r = (fl_ps_req){.type = FL_PS_MSG_SPARSE_PUSH, .table = 0, .step = 1, .lr = 0.1, .n = 2,
                    .dim = 2, .ids = ids, .values = g};
    size_t n = enc_req(&r);
    b[24] = 0xff; b[25] = 0xff; b[26] = 0xff; b[27] = 0xff; b[31] = 0x7f; /* n huge */
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0);
    CHECK(has(why, "does not fit"));
    n = enc_req(&r);
    b[32] = 3; /* dim 3: 2 ids of dim 3 need 40 bytes, 32 are there */
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0);
    n = enc_req(&r);
    b[33] = 0x10; /* dim 4099 */
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0 && has(why, "1..4096"));

    r = (fl_ps_req){.type = FL_PS_MSG_SPARSE_PULL, .n = 2, .ids = ids};
    n = enc_req(&r);
    b[15] = 0x20; /* 2^61 + 2 ids */
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0 && has(why, "SPARSE_PULL"));

    r = (fl_ps_req){.type = FL_PS_MSG_DENSE_PUSH, .step = 1, .lr = 0.1, .n = 2, .values = g};
    n = enc_req(&r);
    double nan = NAN;
    memcpy(b + 16, &nan, 8);
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0 && has(why, "learning rate"));

    r = (fl_ps_req){.type = FL_PS_MSG_DENSE_INIT, .numel = 1, .n = 2, .values = g};
    r.rule.type = FL_PS_RULE_SGD;
    n = enc_req(&r);
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0 &&
          has(why, "2 initial values for a table of 1"));

    r = (fl_ps_req){.type = FL_PS_MSG_STOP};
    n = enc_req(&r);
    b[0] = 'X';
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0 && has(why, "magic"));
    n = enc_req(&r);
    b[4] = 99;
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0 &&
          has(why, "unknown request type 99"));
    n = enc_req(&r);
    b[6] = 1; /* STOP names no table */
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0 && has(why, "table"));
    r = (fl_ps_req){.type = FL_PS_MSG_DENSE_PULL, .table = 0};
    n = enc_req(&r);
    b[6] = 64;
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0 && has(why, "0..63"));

    r = (fl_ps_req){.type = FL_PS_MSG_HELLO, .worker = 4, .workers = 4, .servers = 1,
                    .version = FL_PS_WIRE_VERSION};
    n = enc_req(&r);
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0 &&
          has(why, "worker 4 of 4"));
    r.worker = 0;
    r.version = 1; /* before SHRINK, STATS and the counts */
    n = enc_req(&r);
    CHECK(fl_ps_req_parse(buf_space, n, NULL, why, sizeof why) < 0 && has(why, "version 1"));

    /* an unaligned buffer is refused, not read */
    CHECK(fl_ps_req_parse(b + 1, 8, NULL, why, sizeof why) < 0 && has(why, "aligned"));

    /* random bytes: never a request or a reply of a type they do not claim */
    uint64_t x = 88172645463325252ull;
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        size_t len = (size_t)(it % 200);
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            b[i] = (uint8_t)x;
        }
        accepted += fl_ps_req_parse(buf_space, len, NULL, why, sizeof why) == 0;
        accepted += fl_ps_rep_parse(buf_space, len, FL_PS_MSG_DENSE_PULL, NULL, why,
                                    sizeof why) == 0;
    }
    CHECK(accepted == 0);
}

static size_t enc_rep(const fl_ps_rep *r) {
    uint8_t head[FL_PS_HEAD_MAX];
    fl_ps_span sp[2];
    int np = fl_ps_rep_encode(r, head, sp);
    return gather(sp, np);
}

static void test_replies(void) {
    fl_ps_rep r, q;
    char why[200];
    float v[6] = {1, 2, 3, 4, 5, 6};
    static const int types[] = {FL_PS_MSG_HELLO, FL_PS_MSG_DENSE_INIT, FL_PS_MSG_DENSE_PULL,
                                FL_PS_MSG_DENSE_PUSH, FL_PS_MSG_SPARSE_INIT,
                                FL_PS_MSG_SPARSE_PULL, FL_PS_MSG_SPARSE_PUSH, FL_PS_MSG_SAVE,
                                FL_PS_MSG_STOP, FL_PS_MSG_SHRINK, FL_PS_MSG_STATS};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        r = (fl_ps_rep){.type = types[i], .version = 7, .step = 5, .staleness = 3, .n = 3,
                        .dim = 2, .values = v, .rows = 1000, .bytes = 75000};
        if (types[i] == FL_PS_MSG_SHRINK)
            r.removed = 12;
        if (types[i] == FL_PS_MSG_DENSE_PULL)
            r.n = 6;
        size_t n = enc_rep(&r);
        CHECK(memcmp(buf_space, "FLPR", 4) == 0);
        CHECK(fl_ps_rep_parse(buf_space, n, types[i], &q, why, sizeof why) == 0);
        CHECK(q.type == types[i] && q.status == 0);
        if (types[i] == FL_PS_MSG_DENSE_INIT)
            CHECK(q.version == 7 && q.step == 5);
        if (types[i] == FL_PS_MSG_DENSE_PUSH || types[i] == FL_PS_MSG_SPARSE_PUSH)
            CHECK(q.version == 7 && q.staleness == 3);
        if (types[i] == FL_PS_MSG_DENSE_PULL)
            CHECK(q.version == 7 && q.n == 6 && q.values[5] == 6);
        if (types[i] == FL_PS_MSG_SPARSE_PULL)
            CHECK(q.n == 3 && q.dim == 2 && q.values[4] == 5);
        if (types[i] == FL_PS_MSG_SAVE)
            CHECK(q.step == 5);
        if (types[i] == FL_PS_MSG_SHRINK || types[i] == FL_PS_MSG_STATS)
            CHECK(n == 40 && q.rows == 1000 && q.bytes == 75000 &&
                  q.removed == (types[i] == FL_PS_MSG_SHRINK ? 12u : 0u));
        for (size_t k = 0; k < n; k++)
            if (fl_ps_rep_parse(buf_space, k, types[i], NULL, why, sizeof why) == 0) {
                fprintf(stderr, "reply %d accepted at %zu of %zu bytes\n", types[i], k, n);
                test_failures++;
                break;
            }
        ((uint8_t *)buf_space)[n] = 0;
        CHECK(fl_ps_rep_parse(buf_space, n + 1, types[i], NULL, why, sizeof why) < 0);
        /* a reply to another request is not this one's */
        int other = types[(i + 1) % (sizeof types / sizeof types[0])];
        CHECK(fl_ps_rep_parse(buf_space, n, other, NULL, why, sizeof why) < 0 &&
              has(why, "was expected"));
    }
    /* an error answers whatever was asked */
    const char *text = "worker 1 (127.0.0.1:5000) declares dense table 0 with 10 values";
    r = (fl_ps_rep){.type = FL_PS_MSG_DENSE_INIT, .status = 1, .err = text,
                    .err_len = strlen(text)};
    size_t n = enc_rep(&r);
    CHECK(fl_ps_rep_parse(buf_space, n, FL_PS_MSG_DENSE_PULL, &q, why, sizeof why) == 0);
    CHECK(q.status == 1 && q.err_len == strlen(text) && memcmp(q.err, text, q.err_len) == 0);
    CHECK(fl_ps_rep_parse(buf_space, FL_PS_REP_HEAD, FL_PS_MSG_DENSE_PULL, NULL, why,
                          sizeof why) < 0); /* an error with no text */
    /* a SPARSE_PULL reply whose rows do not fill it */
    r = (fl_ps_rep){.type = FL_PS_MSG_SPARSE_PULL, .n = 3, .dim = 2, .values = v};
    n = enc_rep(&r);
    ((uint8_t *)buf_space)[24] = 3;
    CHECK(fl_ps_rep_parse(buf_space, n, FL_PS_MSG_SPARSE_PULL, NULL, why, sizeof why) < 0 &&
          has(why, "3 rows of dim 3"));
    /* a STATS reply that says it removed rows, and counts beyond any table */
    r = (fl_ps_rep){.type = FL_PS_MSG_STATS, .rows = 5, .bytes = 10};
    n = enc_rep(&r);
    ((uint8_t *)buf_space)[16] = 1;
    CHECK(fl_ps_rep_parse(buf_space, n, FL_PS_MSG_STATS, NULL, why, sizeof why) < 0 &&
          has(why, "STATS reply with 1 removed"));
    n = enc_rep(&r);
    ((uint8_t *)buf_space)[31] = 0x80; /* 2^63 rows */
    CHECK(fl_ps_rep_parse(buf_space, n, FL_PS_MSG_STATS, NULL, why, sizeof why) < 0);
}

int main(void) {
    test_requests();
    test_refusals();
    test_replies();
    if (test_failures) {
        fprintf(stderr, "test_ps_wire: %d failures\n", test_failures);
        return 1;
    }
    printf("test_ps_wire: ok\n");
    return 0;
}
