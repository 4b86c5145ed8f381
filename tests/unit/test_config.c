/* test_config.c - fl_config_load against a schema three sections deep: every type filled from a
 * file, defaults kept, was_set, -o overrides; every refusal with its key and file:line (the
 * line computed from the test's own YAML) or -o; print / to_json exact text; and hostile input
 * (deep nesting, huge keys and scalars, binary garbage) that must end in an error, not a crash;
 * fl_config_origin (the -o or file:line that set a key, the line kept by the loader). */
#include "fleet/config.h"
#include "fleet/status.h"
#include "test.h"

#include <stdint.h>
#include <unistd.h>

typedef struct {
    int64_t seed;
    char model_type[16];
    int64_t model_depth;
    int opt_type;
    double momentum;
    bool nesterov;
    int sched_type;
    fl_cfg_int_list milestones;
    fl_cfg_double_list values;
    bool dgc;
    int64_t rampup;
    fl_cfg_double_list sparsity;
    char data_root[64];
} cfg;

#define OFF(f) offsetof(cfg, f)
static const fl_cfg_key schema[] = {
    {"seed", FL_CFG_INT, OFF(seed), 0, 0, 0, NULL, false, "random seed"},
    {"model.type", FL_CFG_STRING, OFF(model_type), 16, 0, 0, NULL, true, "model name"},
    {"model.depth", FL_CFG_INT, OFF(model_depth), 0, 1, 200, NULL, false, "layers"},
    {"optimizer.type", FL_CFG_ENUM, OFF(opt_type), 0, 0, 0, "sgd|momentum", false, "optimizer"},
    {"optimizer.momentum", FL_CFG_DOUBLE, OFF(momentum), 0, 0, 0.999, NULL, false, "momentum"},
    {"optimizer.nesterov", FL_CFG_BOOL, OFF(nesterov), 0, 0, 0, NULL, false, "nesterov"},
    {"optimizer.lr_schedule.type", FL_CFG_ENUM, OFF(sched_type), 0, 0, 0,
     "constant|piecewise|cosine", false, "schedule"},
    {"optimizer.lr_schedule.milestones", FL_CFG_INT_LIST, OFF(milestones), 0, 0, 1000, NULL, false,
     "epochs"},
    {"optimizer.lr_schedule.values", FL_CFG_DOUBLE_LIST, OFF(values), 0, 0, 0, NULL, false,
     "learning rates"},
    {"strategy.dgc", FL_CFG_BOOL, OFF(dgc), 0, 0, 0, NULL, false, "dgc"},
    {"strategy.dgc_configs.rampup_begin_step", FL_CFG_INT, OFF(rampup), 0, 0, 1e9, NULL, false,
     "rampup"},
    {"strategy.dgc_configs.sparsity", FL_CFG_DOUBLE_LIST, OFF(sparsity), 0, 0, 1, NULL, false,
     "sparsity"},
    {"data.root", FL_CFG_STRING, OFF(data_root), 64, 0, 0, NULL, false, "data"},
};
#define NKEYS ((int)(sizeof schema / sizeof schema[0]))

static char dir[] = "/tmp/fleet_test_config_XXXXXX";
static char paths[64][300];
static int npaths;

static cfg defaults(void) {
    cfg c = {0};
    c.seed = 42;
    c.model_depth = 18;
    c.momentum = 0.5;
    c.sched_type = 2;
    snprintf(c.data_root, sizeof c.data_root, "/data/default");
    return c;
}

/* Writes len bytes into dir/name; returns the path. */
static const char *write_bytes(const char *name, const char *text, size_t len) {
    char *p = paths[npaths++ % 64];
    snprintf(p, 300, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(text, 1, len, f) != len) {
        fprintf(stderr, "cannot write %s\n", p);
        exit(1);
    }
    fclose(f);
    return p;
}
static const char *write_file(const char *name, const char *text) {
    return write_bytes(name, text, strlen(text));
}

/* 1-based line of the first occurrence of needle in text. */
static int line_of(const char *text, const char *needle) {
    const char *at = strstr(text, needle);
    if (!at) {
        fprintf(stderr, "test bug: '%s' not in its own YAML\n", needle);
        exit(1);
    }
    int line = 1;
    for (const char *p = text; p < at; p++)
        line += *p == '\n';
    return line;
}

/* Checks that the message names path:line, where line is that of needle in text. */
#define CHECK_LINE(path, text, needle)                                                             \
    do {                                                                                           \
        char want_[400];                                                                           \
        snprintf(want_, sizeof want_, "%s:%d: ", (path), line_of((text), (needle)));               \
        CHECK_MSG(want_);                                                                          \
    } while (0)

/* Loads a YAML text (with a required model.type added unless the text sets it). */
static int load_text(const char *text, cfg *c, bool *was_set, const char **path_out) {
    const char *path = write_file("t.yaml", text);
    if (path_out)
        *path_out = path;
    *c = defaults();
    return fl_config_load(path, NULL, 0, schema, NKEYS, c, was_set);
}

static const char good_yaml[] =
    "# a good config: every type, sections three deep, flow and block lists\n"
    "seed: -7\n"
    "model:\n"
    "  type: resnet50\n"
    "optimizer:\n"
    "  type: momentum\n"
    "  momentum: 0.9\n"
    "  nesterov: Yes\n"
    "  lr_schedule:\n"
    "    type: piecewise\n"
    "    milestones: [30, 60, 90]\n"
    "    values:\n"
    "      - 0.1\n"
    "      - 1e-2\n"
    "      - 1\n"
    "      - .5e-3\n"
    "strategy:\n"
    "  dgc: on\n"
    "  dgc_configs:\n"
    "    rampup_begin_step: 2504\n"
    "    sparsity: 0.999   # a single scalar is a list of one\n";

static void test_good_file(void) {
    cfg c;
    bool was_set[NKEYS];
    memset(was_set, 0xff, sizeof was_set);
    CHECK_OK(load_text(good_yaml, &c, was_set, NULL));
    CHECK(c.seed == -7);
    CHECK(strcmp(c.model_type, "resnet50") == 0);
    CHECK(c.model_depth == 18); /* default kept */
    CHECK(c.opt_type == 1);
    CHECK(c.momentum == 0.9);
    CHECK(c.nesterov == true);
    CHECK(c.sched_type == 1);
    CHECK(c.milestones.n == 3 && c.milestones.v[0] == 30 && c.milestones.v[1] == 60 &&
          c.milestones.v[2] == 90);
    CHECK(c.values.n == 4 && c.values.v[0] == 0.1 && c.values.v[1] == 0.01 &&
          c.values.v[2] == 1.0 && c.values.v[3] == 0.0005);
    CHECK(c.dgc == true);
    CHECK(c.rampup == 2504);
    CHECK(c.sparsity.n == 1 && c.sparsity.v[0] == 0.999);
    CHECK(strcmp(c.data_root, "/data/default") == 0); /* default kept */
    for (int k = 0; k < NKEYS; k++) {
        bool want =
            strcmp(schema[k].path, "model.depth") != 0 && strcmp(schema[k].path, "data.root") != 0;
        if (was_set[k] != want) {
            fprintf(stderr, "was_set[%s] = %d, want %d\n", schema[k].path, was_set[k], want);
            test_failures++;
        }
    }

    /* Dotted keys at any level, quoted strings, bool spellings, empty lists, an empty section. */
    CHECK_OK(load_text("model.type: \"a: b # c\"\n"
                       "optimizer:\n"
                       "  lr_schedule.milestones: []\n"
                       "  nesterov: OFF\n"
                       "strategy.dgc: TRUE\n"
                       "data:\n"
                       "  # root: commented out\n"
                       "optimizer.lr_schedule.values: [0.5]\n"
                       "model.depth: '200'\n",
                       &c, NULL, NULL));
    CHECK(strcmp(c.model_type, "a: b # c") == 0);
    CHECK(c.milestones.n == 0);
    CHECK(c.nesterov == false);
    CHECK(c.dgc == true);
    CHECK(c.values.n == 1 && c.values.v[0] == 0.5);
    CHECK(c.model_depth == 200);
    CHECK(strcmp(c.data_root, "/data/default") == 0);

    /* A string of size-1 bytes fits; UTF-8 passes through. */
    CHECK_OK(
        load_text("model:\n  type: \"123456789012345\"\ndata: {root: \"d\xc3\xa9j\xc3\xa0\"}\n", &c,
                  NULL, NULL));
    CHECK(strcmp(c.model_type, "123456789012345") == 0);
    CHECK(strcmp(c.data_root, "d\xc3\xa9j\xc3\xa0") == 0);

    /* An empty file, a file of comments, a bare "---": no keys set (here, overrides give the
     * required one). */
    const char *empties[] = {"", "# nothing\n\n", "---\n", "--- ~\n"};
    const char *ov[] = {"model.type=mlp"};
    for (int i = 0; i < 4; i++) {
        const char *path = write_file("empty.yaml", empties[i]);
        c = defaults();
        bool ws[NKEYS];
        CHECK_OK(fl_config_load(path, ov, 1, schema, NKEYS, &c, ws));
        CHECK(c.seed == 42 && strcmp(c.model_type, "mlp") == 0);
        int nset = 0;
        for (int k = 0; k < NKEYS; k++)
            nset += ws[k];
        CHECK(nset == 1);
    }
}

static void test_overrides(void) {
    const char *path = write_file("o.yaml", good_yaml);
    cfg c = defaults();
    bool was_set[NKEYS];
    const char *ov[] = {
        "optimizer.momentum=0.1",
        "optimizer.momentum = 0.2 ", /* blanks around key and value */
        "seed=5",
        "optimizer.lr_schedule.milestones=[1, 2]",
        "strategy.dgc_configs.sparsity=[0.75, 0.9375]",
        "optimizer.lr_schedule.values=0.25", /* a scalar is a list of one */
        "model.depth=34",
        "data.root=/mnt/x=y",                     /* only the first '=' splits */
        "optimizer={type: sgd, nesterov: false}", /* a section as a flow mapping */
        "optimizer.type=momentum",                /* later wins */
    };
    CHECK_OK(fl_config_load(path, ov, 10, schema, NKEYS, &c, was_set));
    CHECK(c.momentum == 0.2);
    CHECK(c.seed == 5);
    CHECK(c.milestones.n == 2 && c.milestones.v[0] == 1 && c.milestones.v[1] == 2);
    CHECK(c.sparsity.n == 2 && c.sparsity.v[0] == 0.75 && c.sparsity.v[1] == 0.9375);
    CHECK(c.values.n == 1 && c.values.v[0] == 0.25);
    CHECK(c.model_depth == 34);
    CHECK(strcmp(c.data_root, "/mnt/x=y") == 0);
    CHECK(c.nesterov == false);
    CHECK(c.opt_type == 1);
    CHECK(strcmp(c.model_type, "resnet50") == 0); /* from the file */
    CHECK(was_set[2] && was_set[12]);             /* set by overrides only */

    /* Without a file. */
    const char *ov2[] = {"model.type=mlp", "strategy.dgc=yes"};
    c = defaults();
    CHECK_OK(fl_config_load(NULL, ov2, 2, schema, NKEYS, &c, was_set));
    CHECK(strcmp(c.model_type, "mlp") == 0 && c.dgc && c.seed == 42);
    CHECK(was_set[1] && was_set[9] && !was_set[0] && !was_set[4]);
}

/* Loads text expecting FL_ECONFIG; checks the message names path:line of needle and holds
 * each of the fragments. */
static void expect_file_error(const char *text, const char *needle, const char *frag1,
                              const char *frag2) {
    cfg c;
    const char *path;
    fl_clear_error();
    int rc = load_text(text, &c, NULL, &path);
    if (rc != FL_ECONFIG) {
        fprintf(stderr, "for YAML:\n%s--- got rc %d (%s), want FL_ECONFIG\n", text, rc,
                fl_errmsg());
        test_failures++;
        return;
    }
    if (needle)
        CHECK_LINE(path, text, needle);
    if (frag1)
        CHECK_MSG(frag1);
    if (frag2)
        CHECK_MSG(frag2);
}

static void expect_override_error(const char *ov, const char *frag1, const char *frag2) {
    cfg c = defaults();
    const char *list[] = {"model.type=x", ov};
    fl_clear_error();
    CHECK_RC(fl_config_load(NULL, list, 2, schema, NKEYS, &c, NULL), FL_ECONFIG);
    char want[300];
    snprintf(want, sizeof want, "-o %s", ov);
    CHECK_MSG(want);
    if (frag1)
        CHECK_MSG(frag1);
    if (frag2)
        CHECK_MSG(frag2);
}

static void test_errors(void) {
    const char *mt = "model: {type: m}\n";
    char t[1024];
#define WITH_MODEL(s) (snprintf(t, sizeof t, "%s%s", mt, (s)), t)

    /* Unknown keys, with a did-you-mean when close. */
    expect_file_error(WITH_MODEL("optimizer:\n  type: sgd\n  momentun: 0.9\n"), "momentun",
                      "unknown key 'optimizer.momentun'", "(did you mean 'optimizer.momentum'?)");
    expect_file_error(WITH_MODEL("optimzer:\n  momentum: 0.9\n"), "optimzer",
                      "unknown key 'optimzer'", "did you mean 'optimizer'?");
    expect_file_error(WITH_MODEL("optimizer:\n  lr_schedule:\n    milestnoes: [1]\n"), "milestnoes",
                      "did you mean 'optimizer.lr_schedule.milestones'?", NULL);
    expect_file_error(WITH_MODEL("zzzzzzzz: 1\n"), "zzzz", "unknown key 'zzzzzzzz'", NULL);
    CHECK(strstr(fl_errmsg(), "did you mean") == NULL);
    expect_override_error("optimizer.momentun=0.5", "unknown key 'optimizer.momentun'",
                          "did you mean 'optimizer.momentum'?");

    /* Sections and values confused. */
    expect_file_error(WITH_MODEL("optimizer: sgd\n"), "optimizer", "'optimizer' is a section",
                      "got 'sgd'");
    expect_file_error(WITH_MODEL("strategy:\n  dgc_configs: [1, 2]\n"), "dgc_configs",
                      "'strategy.dgc_configs' is a section", "got a sequence");
    expect_file_error(WITH_MODEL("seed:\n  value: 1\n"), "seed",
                      "seed: expected an integer, got a mapping", NULL);
    expect_override_error("optimizer=sgd", "'optimizer' is a section", NULL);
    expect_override_error("optimizer=", "'optimizer' is a section", NULL);

    /* Wrong types. */
    expect_file_error(WITH_MODEL("optimizer:\n  momentum: fast\n"), "momentum",
                      "optimizer.momentum: expected a number, got 'fast'", NULL);
    expect_file_error(WITH_MODEL("seed: 1.5\n"), "seed", "seed: expected an integer, got '1.5'",
                      NULL);
    expect_file_error(WITH_MODEL("seed: 1e3\n"), "seed", "expected an integer, got '1e3'", NULL);
    expect_file_error(WITH_MODEL("seed: 12abc\n"), "seed", "expected an integer", NULL);
    expect_file_error(WITH_MODEL("seed: 99999999999999999999\n"), "seed", "beyond the 64-bit",
                      NULL);
    expect_file_error(WITH_MODEL("seed: [1]\n"), "seed",
                      "seed: expected an integer, got a sequence", NULL);
    expect_file_error(WITH_MODEL("optimizer.momentum: 0.5x\n"), "momentum", "expected a number",
                      NULL);
    expect_file_error(WITH_MODEL("optimizer.momentum: .inf\n"), "momentum",
                      "optimizer.momentum: expected a number, got '.inf'", NULL);
    expect_file_error(WITH_MODEL("optimizer.momentum: inf\n"), "momentum", "not a finite number",
                      NULL);
    expect_file_error(WITH_MODEL("optimizer.momentum: nan\n"), "momentum", "not a finite number",
                      NULL);
    expect_file_error(WITH_MODEL("optimizer.momentum: 1e999\n"), "momentum", "not a finite number",
                      NULL);
    expect_file_error(WITH_MODEL("optimizer.momentum: 0x1p-2\n"), "momentum", "expected a number",
                      NULL);
    expect_file_error(WITH_MODEL("optimizer.momentum: ' 0.5'\n"), "momentum", "expected a number",
                      NULL);
    expect_file_error(WITH_MODEL("strategy.dgc: maybe\n"), "dgc",
                      "strategy.dgc: expected true or false, got 'maybe'", NULL);
    expect_file_error(WITH_MODEL("strategy.dgc: 1\n"), "dgc", "expected true or false", NULL);
    expect_file_error(WITH_MODEL("optimizer:\n  lr_schedule:\n    milestones: [1, two]\n"),
                      "milestones",
                      "optimizer.lr_schedule.milestones[1]: expected an integer, got 'two'", NULL);
    expect_file_error(WITH_MODEL("optimizer.lr_schedule.values: [[1]]\n"), "values",
                      "optimizer.lr_schedule.values[0]: expected a number, got a sequence", NULL);
    expect_file_error(WITH_MODEL("model.depth: \"1\\u00002\"\n"), "depth", "NUL", NULL);
    expect_override_error("optimizer.momentum=fast",
                          "optimizer.momentum: expected a number, got 'fast'", NULL);

    /* No value. */
    expect_file_error(WITH_MODEL("optimizer:\n  momentum:\n  type: sgd\n"), "momentum",
                      "optimizer.momentum: has no value", NULL);
    expect_file_error(WITH_MODEL("seed: ~\n"), "seed", "seed: has no value", NULL);
    expect_file_error(WITH_MODEL("data.root: null\n"), "root", "data.root: has no value", NULL);
    expect_file_error(WITH_MODEL("optimizer.lr_schedule.values: [1, null]\n"), "values",
                      "optimizer.lr_schedule.values[1]: has no value", NULL);
    expect_override_error("seed=", "seed: has no value", NULL);
    /* ... but a quoted empty string is a value. */
    cfg c;
    CHECK_OK(load_text(WITH_MODEL("data.root: ''\n"), &c, NULL, NULL));
    CHECK(c.data_root[0] == '\0');

    /* Out of range, for numbers and list elements, and list length. */
    expect_file_error(WITH_MODEL("optimizer:\n  momentum: 1.5\n"), "momentum",
                      "optimizer.momentum: 1.5 is out of range [0, 0.999]", NULL);
    expect_file_error(WITH_MODEL("optimizer:\n  momentum: -0.1\n"), "momentum", "out of range",
                      NULL);
    expect_file_error(WITH_MODEL("model:\n  depth: 0\n"), NULL, NULL, NULL); /* duplicate 'model' */
    CHECK_MSG("duplicate key 'model' (first at line 1)");
    expect_file_error("model:\n  type: m\n  depth: 201\n", "depth",
                      "model.depth: 201 is out of range [1, 200]", NULL);
    expect_file_error(
        WITH_MODEL("strategy:\n  dgc_configs:\n    sparsity:\n      - 0.5\n      - 2\n"),
        "sparsity", "strategy.dgc_configs.sparsity[1]: 2 is out of range [0, 1]", NULL);
    expect_file_error(WITH_MODEL("strategy.dgc_configs.rampup_begin_step: 1000000001\n"), "rampup",
                      "1000000001 is out of range [0, 1000000000]", NULL);
    char longlist[512] = "optimizer.lr_schedule.values: [";
    for (int i = 0; i <= FL_CFG_LIST_MAX; i++)
        strcat(longlist, i ? ", 1" : "1");
    strcat(longlist, "]\n");
    expect_file_error(WITH_MODEL(longlist), "values", "optimizer.lr_schedule.values",
                      "33 elements, more than the 32 allowed");
    expect_override_error("optimizer.momentum=1", "1 is out of range [0, 0.999]", NULL);

    /* Enums. */
    expect_file_error(WITH_MODEL("optimizer:\n  type: adam\n"), "adam",
                      "optimizer.type: 'adam' is not one of sgd, momentum", NULL);
    expect_file_error(WITH_MODEL("optimizer:\n  type: SGD\n"), "SGD", "is not one of", NULL);
    expect_override_error("optimizer.lr_schedule.type=step",
                          "'step' is not one of constant, piecewise, cosine", NULL);

    /* Strings too long. */
    expect_file_error("model:\n  type: \"1234567890123456\"\n", "type",
                      "model.type: '1234567890123456' is 16 bytes long, more than the 15 allowed",
                      NULL);

    /* Missing required keys. */
    {
        const char *path = write_file("quickstart.yaml", "seed: 1\n");
        cfg d = defaults();
        CHECK_RC(fl_config_load(path, NULL, 0, schema, NKEYS, &d, NULL), FL_ECONFIG);
        char want[400];
        snprintf(want, sizeof want, "%s: missing required key 'model.type'", path);
        CHECK_MSG(want);
        CHECK_MSG("quickstart.yaml: missing required key 'model.type'");
        CHECK_RC(fl_config_load(NULL, NULL, 0, schema, NKEYS, &d, NULL), FL_ECONFIG);
        CHECK_MSG("missing required key 'model.type'");
        CHECK_MSG("-o model.type=");
    }

    /* Duplicate keys: in one mapping, and the same key by two spellings. */
    expect_file_error(WITH_MODEL("seed: 1\nseed: 2\n"), "seed: 2",
                      "duplicate key 'seed' (first at line 2)", NULL);
    expect_file_error(WITH_MODEL("optimizer:\n  type: sgd\n  momentum: 0.1\n  momentum: 0.2\n"),
                      "momentum: 0.2", "duplicate key 'optimizer.momentum' (first at line 4)",
                      NULL);
    expect_file_error(WITH_MODEL("optimizer:\n  momentum: 0.1\noptimizer.momentum: 0.2\n"),
                      "optimizer.momentum",
                      "duplicate key 'optimizer.momentum' (first set at line 3)", NULL);
    expect_override_error("optimizer={momentum: 0.1, momentum: 0.2}",
                          "duplicate key 'optimizer.momentum'", NULL);
    /* The same key twice in overrides is not a duplicate: the later wins (tested above). */

    /* YAML syntax errors: libyaml's line and column. */
    {
        const char *bad = "model:\n  type: m\n  depth: 3\n   seed: 4\n";
        cfg d;
        const char *path;
        CHECK_RC(load_text(bad, &d, NULL, &path), FL_ECONFIG);
        char want[400];
        snprintf(want, sizeof want, "%s:4:8: YAML syntax error: mapping values are not allowed",
                 path);
        CHECK_MSG(want);
        bad = "model: {type: m\nseed: 4\n";
        CHECK_RC(load_text(bad, &d, NULL, &path), FL_ECONFIG);
        snprintf(want, sizeof want,
                 "%s:2:5: YAML syntax error: did not find expected ',' or '}' (while parsing a "
                 "flow mapping at line 1)",
                 path);
        CHECK_MSG(want);
        bad = "model:\n  type: \"unterminated\n";
        CHECK_RC(load_text(bad, &d, NULL, &path), FL_ECONFIG);
        CHECK_MSG("YAML syntax error");
        CHECK_MSG("t.yaml:3:1");
        /* Not UTF-8, and a control character: libyaml's reader, with the line counted. */
        CHECK_RC(load_text("model:\n  type: m\nseed: \xff\xfe\n", &d, NULL, &path), FL_ECONFIG);
        CHECK_MSG("t.yaml:3: not valid YAML text");
        CHECK_RC(load_text("model:\n  type: m\x01\n", &d, NULL, &path), FL_ECONFIG);
        CHECK_MSG("t.yaml:2: not valid YAML text");
        expect_override_error("optimizer.lr_schedule.values=[1,", "YAML syntax error: did not find",
                              NULL);
        expect_override_error("seed=a: b: c", "YAML syntax error at column 5: mapping values",
                              NULL);
        expect_override_error("data.root=@x", "YAML syntax error", NULL);
    }

    /* Anchors are fine, aliases are refused; one document only; keys must be scalars. */
    CHECK_OK(load_text(WITH_MODEL("seed: &s 3\n"), &c, NULL, NULL));
    CHECK(c.seed == 3);
    expect_file_error(WITH_MODEL("seed: &s 3\nmodel.depth: *s\n"), "*s", "aliases", NULL);
    expect_file_error(WITH_MODEL("---\nseed: 1\n"), "---\nseed", "a second YAML document", NULL);
    expect_file_error(WITH_MODEL("? [a, b]\n: 1\n"), "? [a", "a mapping key must be a scalar",
                      NULL);
    expect_file_error(WITH_MODEL("'': 1\n"), "''", "empty key", NULL);

    /* The top level must be a mapping. */
    expect_file_error("- a\n- b\n", "- a",
                      "the top level must be a mapping of keys, got a sequence", NULL);
    expect_file_error("# comment\njust text\n", "just", "top level must be a mapping",
                      "'just text'");

    /* Malformed overrides. */
    expect_override_error("noequals", "expected key=value", NULL);
    expect_override_error("=5", "empty key", NULL);
    expect_override_error("  =5", "empty key", NULL);

    /* A file that cannot be opened or read: FL_EIO with the path and the reason. */
    {
        char missing[400];
        snprintf(missing, sizeof missing, "%s/nope.yaml", dir);
        cfg d = defaults();
        CHECK_RC(fl_config_load(missing, NULL, 0, schema, NKEYS, &d, NULL), FL_EIO);
        CHECK_MSG(missing);
        CHECK_MSG("No such file or directory");
        CHECK_RC(fl_config_load(dir, NULL, 0, schema, NKEYS, &d, NULL), FL_EIO);
        CHECK_MSG(dir);
        CHECK_MSG("Is a directory");
    }
#undef WITH_MODEL
}

/* --- print and to_json on a small schema --- */

typedef struct {
    bool flag;
    int64_t count;
    double rate;
    double big;
    char quoted[32];
    char plain[16];
    int kind;
    fl_cfg_int_list ids;
    fl_cfg_double_list ws;
    fl_cfg_double_list none;
} small;

static const fl_cfg_key small_schema[] = {
    {"flag", FL_CFG_BOOL, offsetof(small, flag), 0, 0, 0, NULL, false, ""},
    {"a.count", FL_CFG_INT, offsetof(small, count), 0, 0, 0, NULL, false, ""},
    {"a.rate", FL_CFG_DOUBLE, offsetof(small, rate), 0, 0, 0, NULL, false, ""},
    {"a.big", FL_CFG_DOUBLE, offsetof(small, big), 0, 0, 0, NULL, false, ""},
    {"a.b.quoted", FL_CFG_STRING, offsetof(small, quoted), 32, 0, 0, NULL, false, ""},
    {"a.b.plain", FL_CFG_STRING, offsetof(small, plain), 16, 0, 0, NULL, false, ""},
    {"kind", FL_CFG_ENUM, offsetof(small, kind), 0, 0, 0, "alpha|beta|gamma", false, ""},
    {"ids", FL_CFG_INT_LIST, offsetof(small, ids), 0, 0, 0, NULL, false, ""},
    {"ws", FL_CFG_DOUBLE_LIST, offsetof(small, ws), 0, 0, 0, NULL, false, ""},
    {"none", FL_CFG_DOUBLE_LIST, offsetof(small, none), 0, 0, 0, NULL, false, ""},
};
#define NSMALL ((int)(sizeof small_schema / sizeof small_schema[0]))

static small small_value(void) {
    small s = {0};
    s.flag = true;
    s.count = -7;
    s.rate = 0.1;
    s.big = 1e20;
    snprintf(s.quoted, sizeof s.quoted, "say \"hi\"\\\n\x01: x");
    snprintf(s.plain, sizeof s.plain, "x/y_z-1.0");
    s.kind = 1;
    s.ids = (fl_cfg_int_list){.n = 3, .v = {1, -2, 3000000000LL}};
    s.ws = (fl_cfg_double_list){.n = 3, .v = {0.5, 1e-300, 2.0 / 3.0}};
    return s;
}

static void test_print_json(void) {
    small s = small_value();
    const char *want_yaml = "flag: true\n"
                            "a.count: -7\n"
                            "a.rate: 0.1\n"
                            "a.big: 1e+20\n"
                            "a.b.quoted: \"say \\\"hi\\\"\\\\\\n\\u0001: x\"\n"
                            "a.b.plain: x/y_z-1.0\n"
                            "kind: beta\n"
                            "ids: [1, -2, 3000000000]\n"
                            "ws: [0.5, 1e-300, 0.6666666666666666]\n"
                            "none: []\n";
    const char *want_json =
        "{\"flag\":true,\"a.count\":-7,\"a.rate\":0.1,\"a.big\":1e+20,"
        "\"a.b.quoted\":\"say \\\"hi\\\"\\\\\\n\\u0001: x\",\"a.b.plain\":\"x/y_z-1.0\","
        "\"kind\":\"beta\",\"ids\":[1,-2,3000000000],"
        "\"ws\":[0.5,1e-300,0.6666666666666666],\"none\":[]}";
    char path[400];
    snprintf(path, sizeof path, "%s/printed.yaml", dir);
    FILE *f = fopen(path, "w");
    fl_config_print(small_schema, NSMALL, &s, f);
    fclose(f);
    char got[2048] = "";
    f = fopen(path, "r");
    size_t n = fread(got, 1, sizeof got - 1, f);
    got[n] = '\0';
    fclose(f);
    if (strcmp(got, want_yaml) != 0) {
        fprintf(stderr, "print:\n%s\nwant:\n%s\n", got, want_yaml);
        test_failures++;
    }

    /* What print writes reads back as the same values. */
    small r = {0};
    CHECK_OK(fl_config_load(path, NULL, 0, small_schema, NSMALL, &r, NULL));
    CHECK(r.flag == s.flag && r.count == s.count && r.rate == s.rate && r.big == s.big);
    CHECK(strcmp(r.quoted, s.quoted) == 0 && strcmp(r.plain, s.plain) == 0 && r.kind == s.kind);
    CHECK(r.ids.n == 3 && r.ids.v[2] == 3000000000LL);
    CHECK(r.ws.n == 3 && r.ws.v[1] == 1e-300 && r.ws.v[2] == 2.0 / 3.0 && r.none.n == 0);

    char buf[2048];
    size_t need = fl_config_to_json(small_schema, NSMALL, &s, buf, sizeof buf);
    CHECK(need == strlen(want_json));
    if (strcmp(buf, want_json) != 0) {
        fprintf(stderr, "to_json:\n%s\nwant:\n%s\n", buf, want_json);
        test_failures++;
    }
    /* Truncated to cap, still NUL terminated; the return says what it needed. */
    char small_buf[10];
    CHECK(fl_config_to_json(small_schema, NSMALL, &s, small_buf, sizeof small_buf) == need);
    CHECK(strcmp(small_buf, "{\"flag\":t") == 0);
    CHECK(fl_config_to_json(small_schema, NSMALL, &s, NULL, 0) == need);

    /* Values a caller's defaults may hold but a file cannot: non-finite numbers, bad enum index. */
    s.rate = NAN;
    s.big = -INFINITY;
    s.kind = 7;
    fl_config_to_json(small_schema, 4, &s, buf, sizeof buf);
    CHECK(strcmp(buf, "{\"flag\":true,\"a.count\":-7,\"a.rate\":null,\"a.big\":null}") == 0);
    fl_config_to_json(small_schema + 6, 1, &s, buf, sizeof buf);
    CHECK(strcmp(buf, "{\"kind\":7}") == 0);
    CHECK(fl_config_to_json(small_schema, 0, &s, buf, sizeof buf) == 2 && strcmp(buf, "{}") == 0);
}

/* --- hostile input: an error or success, never a crash (run under ASan) --- */

static void try_load(const char *text, size_t len) {
    const char *path = write_bytes("hostile.yaml", text, len);
    cfg c = defaults();
    int rc = fl_config_load(path, NULL, 0, schema, NKEYS, &c, NULL);
    CHECK(rc == 0 || rc == FL_ECONFIG);
    CHECK(strlen(fl_errmsg()) < 1024);
}

static void test_hostile(void) {
    /* 1000 levels of block mappings, of flow sequences, and 100000 of flow mappings. */
    size_t cap = 4u << 20;
    char *t = malloc(cap);
    size_t n = 0;
    for (int d = 0; d < 1000; d++) {
        memset(t + n, ' ', (size_t)d * 2);
        n += (size_t)d * 2;
        n += (size_t)sprintf(t + n, "optimizer:\n");
    }
    try_load(t, n);
    CHECK_MSG("nesting deeper than");
    n = 0;
    n += (size_t)sprintf(t, "optimizer.lr_schedule.values: ");
    for (int d = 0; d < 1000; d++)
        t[n++] = '[';
    for (int d = 0; d < 1000; d++)
        t[n++] = ']';
    t[n++] = '\n';
    try_load(t, n);
    n = 0;
    for (int d = 0; d < 100000; d++)
        n += (size_t)sprintf(t + n, "{a: ");
    try_load(t, n);

    /* A very long key (1 MB): libyaml refuses simple keys over 1024 characters; as an
     * override it is an unknown key, with a message that stays short. */
    memset(t, 'k', 1 << 20);
    n = 1 << 20;
    n += (size_t)sprintf(t + n, ": 1\n");
    try_load(t, n);
    CHECK_MSG("YAML syntax error");
    memcpy(t + (1 << 20), "=1", 3);
    {
        const char *ov[] = {"model.type=m", t};
        cfg c = defaults();
        CHECK_RC(fl_config_load(NULL, ov, 2, schema, NKEYS, &c, NULL), FL_ECONFIG);
        CHECK_MSG("unknown key 'kkkk");
        CHECK(strlen(fl_errmsg()) < 1024);
    }

    /* A 10 MB scalar: for a string (too long), a number, an unknown key, and an override. */
    size_t big = 10u << 20;
    char *s = malloc(big + 64);
    const char *prefixes[] = {"data.root: ", "model.depth: ", "optimizer.m: ", "data.root="};
    const char *frags[] = {"more than the 63 allowed", "beyond the 64-bit", "unknown key",
                           "data.root"};
    for (int i = 0; i < 4; i++) {
        n = (size_t)sprintf(s, "%s", prefixes[i]);
        memset(s + n, '9', big);
        n += big;
        s[n] = '\0';
        if (i < 3) {
            s[n++] = '\n';
            try_load(s, n);
        } else {
            const char *ov[] = {"model.type=m", s};
            cfg c = defaults();
            CHECK_RC(fl_config_load(NULL, ov, 2, schema, NKEYS, &c, NULL), FL_ECONFIG);
            CHECK(strlen(fl_errmsg()) < 1024);
        }
        CHECK_MSG(frags[i]);
    }
    free(s);

    /* 200000 copies of one key: a duplicate, found at once. */
    n = 0;
    for (int i = 0; i < 200000; i++)
        n += (size_t)sprintf(t + n, "seed: %d\n", i);
    try_load(t, n);
    CHECK_MSG("duplicate key 'seed'");

    /* Binary garbage, and a good file with random bytes flipped. */
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (int trial = 0; trial < 200; trial++) {
        size_t len = 1 + (size_t)(trial * 37 % 4000);
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            static const char yamlish[] = " :-[]{},#\n'\"&*!|>%@`?abc019.";
            t[i] = trial % 2 ? (char)(x & 0xff) : yamlish[x % (sizeof yamlish - 1)];
        }
        try_load(t, len);
    }
    size_t glen = strlen(good_yaml);
    for (int trial = 0; trial < 300; trial++) {
        memcpy(t, good_yaml, glen);
        for (int k = 0; k < 1 + trial % 4; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t[x % glen] = (char)(x >> 32);
        }
        try_load(t, glen);
    }
    free(t);
}

/* The schema index of key path p. */
static int key_index(const char *p) {
    for (int k = 0; k < NKEYS; k++)
        if (strcmp(schema[k].path, p) == 0)
            return k;
    fprintf(stderr, "test bug: '%s' is not a schema key\n", p);
    exit(1);
}

/* fl_config_origin: the last override that sets the key or a section holding it, else the
 * file's line (nested or dotted) as fl_config_load_lines kept it, else nothing; the file is not
 * read again (it is gone when origin is asked) */
static void test_origin(void) {
    const char *text = "model:\n"
                       "  type: mlp\n"
                       "strategy:\n"
                       "  dgc: true\n"
                       "  dgc_configs.rampup_begin_step: 3\n"
                       "strategy.dgc_configs:\n"
                       "  sparsity: [0.9]\n";
    const char *path = write_file("origin.yaml", text);
    cfg c = defaults();
    int lines[NKEYS];
    CHECK_OK(fl_config_load_lines(path, NULL, 0, schema, NKEYS, &c, NULL, lines));
    CHECK(lines[key_index("model.type")] == line_of(text, "type: mlp"));
    CHECK(lines[key_index("seed")] == 0);
    CHECK(unlink(path) == 0);
#define LINE(key) lines[key_index(key)]
    char buf[400], want[400];
    CHECK(fl_config_origin(path, LINE("strategy.dgc"), NULL, 0, "strategy.dgc", buf,
                           sizeof buf) == 1);
    snprintf(want, sizeof want, "%s:%d", path, line_of(text, "dgc: true"));
    CHECK(strcmp(buf, want) == 0);
    const char *ramp = "strategy.dgc_configs.rampup_begin_step";
    CHECK(fl_config_origin(path, LINE(ramp), NULL, 0, ramp, buf, sizeof buf) == 1);
    snprintf(want, sizeof want, "%s:%d", path, line_of(text, "dgc_configs.rampup"));
    CHECK(strcmp(buf, want) == 0);
    const char *sparsity = "strategy.dgc_configs.sparsity";
    CHECK(fl_config_origin(path, LINE(sparsity), NULL, 0, sparsity, buf, sizeof buf) == 1);
    snprintf(want, sizeof want, "%s:%d", path, line_of(text, "sparsity"));
    CHECK(strcmp(buf, want) == 0);
    CHECK(fl_config_origin(path, LINE("seed"), NULL, 0, "seed", buf, sizeof buf) == 0 &&
          buf[0] == '\0');

    /* overrides win over the file; the lines the loader keeps are the file's alone */
    const char *ov[] = {"strategy.dgc=false", " strategy = {dgc: true}", "seed=3"};
    path = write_file("origin.yaml", text);
    c = defaults();
    CHECK_OK(fl_config_load_lines(path, ov, 3, schema, NKEYS, &c, NULL, lines));
    CHECK(c.seed == 3 && c.dgc);
    CHECK(LINE("seed") == 0 && LINE("strategy.dgc") == line_of(text, "dgc: true"));
    CHECK(fl_config_origin(path, LINE("strategy.dgc"), ov, 3, "strategy.dgc", buf,
                           sizeof buf) == 1);
    CHECK(strcmp(buf, "-o  strategy = {dgc: true}") == 0);
    CHECK(fl_config_origin(path, LINE("strategy.dgc"), ov, 1, "strategy.dgc", buf,
                           sizeof buf) == 1);
    CHECK(strcmp(buf, "-o strategy.dgc=false") == 0);
    CHECK(fl_config_origin(NULL, 0, ov, 3, "seed", buf, sizeof buf) == 1);
    CHECK(strcmp(buf, "-o seed=3") == 0);
    CHECK(fl_config_origin(NULL, 0, ov, 3, "model.type", buf, sizeof buf) == 0);
    CHECK(fl_config_origin(NULL, 0, ov, 1, "strategy.dg", buf, sizeof buf) == 0);
    CHECK(fl_config_origin(path, LINE("strategy.dgc"), ov, 3, "strategy.dgc", buf, 6) == 1 &&
          strlen(buf) == 5);
#undef LINE
}

int main(void) {
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_good_file();
    test_overrides();
    test_errors();
    test_print_json();
    test_hostile();
    test_origin();

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    TEST_DONE();
}
