/* test_safetensors.c - the safetensors reader and writer, the strict JSON parser, and .npy:
 * every dtype round-trips bit-exactly; CRC-32 is zlib's (check value of "123456789"); and each
 * kind of damage is refused with a message naming the file and the tensor: every truncation
 * length, a flipped byte anywhere in the data (checksum) or header, overlapping and
 * out-of-range offsets, a header length beyond the file, wrong shape, wrong dtype, missing and
 * unexpected tensors; a refused load leaves the destination untouched. */
#include "fleet/checkpoint.h"
#include "fleet/npy.h"
#include "fleet/rng.h"
#include "fleet/safetensors.h"
#include "fleet/status.h"
#include "io/json_parse.h"
#include "test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static void path_of(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", dir, name);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    if (fread(b, 1, *n, f) != *n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

/* a file with one tensor of each dtype; values fill the data */
static float w[6] = {1.5f, -2.25f, 3e-38f, 1e30f, -0.0f, 7.0f};
static double d64[3] = {0.1, -1e300, 2.0};
static int64_t i64[2] = {INT64_MIN, 42};
static int32_t i32[4] = {-7, 0, 7, INT32_MAX};
static uint16_t h16[2] = {0x3C00, 0xC000};
static uint16_t b16[2] = {0x3F80, 0x7F80};
static uint8_t u8[5] = {0, 1, 127, 128, 255};

static int write_sample(const char *path) {
    int64_t s_w[2] = {2, 3}, s_d[1] = {3}, s_i64[1] = {2}, s_i32[2] = {2, 2}, s_h[1] = {2},
            s_u8[1] = {5};
    fl_st_entry e[] = {
        {"fc.weight", FL_DTYPE_F32, 2, s_w, w},   {"d", FL_DTYPE_F64, 1, s_d, d64},
        {"counts", FL_DTYPE_I64, 1, s_i64, i64}, {"i", FL_DTYPE_I32, 2, s_i32, i32},
        {"half", FL_DTYPE_F16, 1, s_h, h16},     {"bf", FL_DTYPE_BF16, 1, s_h, b16},
        {"bytes", FL_DTYPE_U8, 1, s_u8, u8},     {"scalar", FL_DTYPE_F32, 0, NULL, w + 5},
    };
    fl_st_meta m[] = {{"fleet.format", "test"}, {"note", "quotes \" and \\ and\nnewline"}};
    return fl_safetensors_write(path, e, 8, m, 2);
}

static void test_crc(void) {
    CHECK(fl_crc32(0, "123456789", 9) == 0xCBF43926u); /* the CRC-32 check value */
    uint32_t c = fl_crc32(0, "1234", 4);
    CHECK(fl_crc32(c, "56789", 5) == 0xCBF43926u);
    CHECK(fl_crc32(0, "", 0) == 0);
}

static void test_json(void) {
    const char *good[] = {"{}", " [1, -2, 3.5e2, true, false, null, \"a\\u00e9\\ud83d\\ude00\"] ",
                          "{\"a\": {\"b\": [[]]}}", "0", "-0.5"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        fl_json *v = fl_json_parse(good[i], strlen(good[i]));
        CHECK(v != NULL);
        if (!v)
            fprintf(stderr, "  rejected %s: %s\n", good[i], fl_errmsg());
        fl_json_free(v);
    }
    fl_json *v = fl_json_parse(good[1], strlen(good[1]));
    CHECK(v && v->n == 7 && v->items[1]->is_int && v->items[1]->i == -2);
    CHECK(v && !v->items[2]->is_int && v->items[2]->d == 350.0);
    CHECK(v && strcmp(v->items[6]->s, "a\xc3\xa9\xf0\x9f\x98\x80") == 0);
    fl_json_free(v);
    const char *bad[] = {"", "{", "[1,]", "{\"a\":1,}", "01", "1.", ".5", "+1", "[1 2]",
                         "\"\\x\"", "\"a", "{\"a\":1,\"a\":2}", "tru", "[1] x", "\"\t\"",
                         "\"\\ud800\"", "{1:2}", "// c\n{}", "NaN", "1e"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fl_json *b = fl_json_parse(bad[i], strlen(bad[i]));
        CHECK(b == NULL);
        if (b)
            fprintf(stderr, "  accepted bad JSON %s\n", bad[i]);
        fl_json_free(b);
    }
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    CHECK(fl_json_parse(deep, 200) == NULL);
    CHECK_MSG("deeper");
}

static void test_roundtrip(void) {
    char p[512];
    path_of(p, sizeof p, "all.safetensors");
    CHECK_OK(write_sample(p));
    fl_safetensors *st;
    CHECK_OK(fl_safetensors_open(p, &st));
    if (!st)
        return;
    CHECK(fl_safetensors_count(st) == 8);
    CHECK(fl_safetensors_has_checksums(st));
    const fl_st_tensor *t = fl_safetensors_find(st, "fc.weight");
    CHECK(t && t->dtype == FL_DTYPE_F32 && t->ndim == 2 && t->shape[1] == 3 &&
          memcmp(t->data, w, sizeof w) == 0);
    t = fl_safetensors_find(st, "d");
    CHECK(t && memcmp(t->data, d64, sizeof d64) == 0);
    t = fl_safetensors_find(st, "counts");
    CHECK(t && t->dtype == FL_DTYPE_I64 && memcmp(t->data, i64, sizeof i64) == 0);
    t = fl_safetensors_find(st, "i");
    CHECK(t && t->dtype == FL_DTYPE_I32 && memcmp(t->data, i32, sizeof i32) == 0);
    t = fl_safetensors_find(st, "half");
    CHECK(t && t->dtype == FL_DTYPE_F16 && memcmp(t->data, h16, sizeof h16) == 0);
    t = fl_safetensors_find(st, "bf");
    CHECK(t && t->dtype == FL_DTYPE_BF16 && memcmp(t->data, b16, sizeof b16) == 0);
    t = fl_safetensors_find(st, "bytes");
    CHECK(t && t->dtype == FL_DTYPE_U8 && memcmp(t->data, u8, sizeof u8) == 0);
    t = fl_safetensors_find(st, "scalar");
    float sc = 0; /* after the U8 tensor: unaligned, so copied out */
    if (t)
        memcpy(&sc, t->data, sizeof sc);
    CHECK(t && t->ndim == 0 && t->numel == 1 && sc == 7.0f);
    const char *note = fl_safetensors_meta(st, "note");
    CHECK(note && strcmp(note, "quotes \" and \\ and\nnewline") == 0);
    CHECK(fl_safetensors_meta(st, "crc32.fc.weight") != NULL);
    fl_safetensors_close(st);

    /* the header length is 8-aligned and the data is exactly the tensors */
    size_t n;
    unsigned char *b = slurp(p, &n);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | b[i];
    CHECK(hl % 8 == 0);
    size_t data = sizeof w + sizeof d64 + sizeof i64 + sizeof i32 + sizeof h16 + sizeof b16 +
                  sizeof u8 + sizeof(float);
    CHECK(n == 8 + hl + data);
    free(b);

    /* duplicate names and reserved metadata keys are refused, and nothing is written */
    int64_t s1[1] = {1};
    fl_st_entry dup[] = {{"a", FL_DTYPE_F32, 1, s1, w}, {"a", FL_DTYPE_F32, 1, s1, w}};
    path_of(p, sizeof p, "dup.safetensors");
    CHECK_RC(fl_safetensors_write(p, dup, 2, NULL, 0), FL_EINVAL);
    CHECK_MSG("'a' given twice");
    CHECK(access(p, F_OK) != 0);
    fl_st_meta crc[] = {{"crc32.a", "00000000"}};
    CHECK_RC(fl_safetensors_write(p, dup, 1, crc, 1), FL_EINVAL);
}

/* every proper prefix of the file is refused with FL_EFORMAT naming the file */
static void test_truncation(void) {
    char p[512], q[512];
    path_of(p, sizeof p, "all.safetensors");
    path_of(q, sizeof q, "cut.safetensors");
    size_t n;
    unsigned char *b = slurp(p, &n);
    int refused = 0;
    for (size_t len = 0; len < n; len++) {
        spit(q, b, len);
        fl_safetensors *st = NULL;
        int rc = fl_safetensors_open(q, &st);
        refused += rc == FL_EFORMAT && st == NULL && strstr(fl_errmsg(), q) != NULL;
        fl_safetensors_close(st);
    }
    CHECK(refused == (int)n);
    spit(q, b, n - 3); /* cut inside the last tensor's data: the tensor is named */
    fl_safetensors *st;
    CHECK_RC(fl_safetensors_open(q, &st), FL_EFORMAT);
    CHECK_MSG("tensor 'scalar'");
    CHECK_MSG("truncated");
    spit(q, b, 100); /* cut inside the header */
    CHECK_RC(fl_safetensors_open(q, &st), FL_EFORMAT);
    CHECK_MSG("runs past the end of the file");
    free(b);
}

/* every single flipped byte is refused: in the data by the tensor's checksum (named), in the
 * header by the parser, the layout checks or the checksum entries; padding spaces aside */
static void test_flipped_bytes(void) {
    char p[512], q[512];
    path_of(p, sizeof p, "all.safetensors");
    path_of(q, sizeof q, "flip.safetensors");
    size_t n;
    unsigned char *b = slurp(p, &n);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | b[i];
    int data_refused = 0, data_n = 0, header_refused = 0, header_n = 0;
    for (size_t i = 0; i < n; i++) {
        if (i >= 8 && i < 8 + hl && b[i] == ' ')
            continue; /* padding / layout whitespace: not content */
        b[i] ^= 0x10;
        spit(q, b, n);
        b[i] ^= 0x10;
        fl_safetensors *st = NULL;
        int rc = fl_safetensors_open(q, &st);
        fl_safetensors_close(st);
        if (i >= 8 + hl) {
            data_n++;
            data_refused += rc == FL_EFORMAT && strstr(fl_errmsg(), "checksum mismatch") &&
                            strstr(fl_errmsg(), q);
        } else if (i >= 8) {
            header_n++;
            header_refused += rc < 0;
            if (rc == 0)
                fprintf(stderr, "  flip at header byte %zu ('%c') accepted\n", i - 8, b[i]);
        }
    }
    CHECK(data_refused == data_n);
    printf("flipped bytes: %d/%d in the data refused by checksum, %d/%d in the header refused\n",
           data_refused, data_n, header_refused, header_n);
    CHECK(header_refused == header_n); /* the metadata has its own checksum */
    /* a flip in the first tensor's data names it */
    b[8 + hl] ^= 1;
    spit(q, b, n);
    fl_safetensors *st;
    CHECK_RC(fl_safetensors_open(q, &st), FL_EFORMAT);
    CHECK_MSG("tensor 'fc.weight': checksum mismatch");
    free(b);
}

/* random damage (several bytes set to random values, sometimes a cut), 3000 times: every
 * outcome is a refusal with a message naming the file, or (when only checksum-free padding
 * changed) an open file; under ASan/UBSan (make test) nothing reads out of bounds */
static void test_random_damage(void) {
    char p[512], q[512];
    path_of(p, sizeof p, "all.safetensors");
    path_of(q, sizeof q, "rnd.safetensors");
    size_t n;
    unsigned char *b = slurp(p, &n), *c = malloc(n);
    fl_rng r;
    fl_rng_init(&r, 2024, 0);
    int refused = 0, opened = 0, unnamed = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(c, b, n);
        int k = 1 + (int)fl_rng_below(&r, 4);
        for (int j = 0; j < k; j++) /* mostly in the header, where the parser is */
            c[fl_rng_below(&r, fl_rng_below(&r, 4) ? 8 + 770 : n)] = (unsigned char)fl_rng_u32(&r);
        size_t len = fl_rng_below(&r, 8) == 0 ? fl_rng_below(&r, n) : n;
        spit(q, c, len);
        fl_safetensors *st = NULL;
        int rc = fl_safetensors_open(q, &st);
        if (rc == 0) {
            opened++;
            for (int i = 0; i < fl_safetensors_count(st); i++) /* touch every byte */
                fl_crc32(0, fl_safetensors_tensor(st, i)->data,
                         fl_safetensors_tensor(st, i)->nbytes);
        } else {
            refused++;
            unnamed += strstr(fl_errmsg(), q) == NULL;
        }
        fl_safetensors_close(st);
    }
    printf("random damage: %d refused, %d opened (a byte set to its old value, or padding to "
           "other whitespace), %d messages without the file\n",
           refused, opened, unnamed);
    CHECK(unnamed == 0);
    CHECK(refused >= 2900);
    free(b);
    free(c);
}

/* hand-made headers: layout damage of each kind */
static int open_raw(const char *json, const void *data, size_t ndata) {
    char q[512];
    path_of(q, sizeof q, "raw.safetensors");
    size_t hl = strlen(json);
    unsigned char *b = malloc(8 + hl + ndata + 1);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    if (ndata)
        memcpy(b + 8 + hl, data, ndata);
    spit(q, b, 8 + hl + ndata);
    free(b);
    fl_safetensors *st = NULL;
    int rc = fl_safetensors_open(q, &st);
    fl_safetensors_close(st);
    return rc;
}

static void test_layouts(void) {
    float v[4] = {1, 2, 3, 4};
    CHECK_OK(open_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", v, 16));
    CHECK_RC(open_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", v, 16),
             FL_EFORMAT);
    CHECK_MSG("overlap");
    CHECK_RC(open_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", v, 8),
             FL_EFORMAT);
    CHECK_MSG("tensor 'a': data_offsets [0, 16] run past the end");
    CHECK_RC(open_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", v, 16),
             FL_EFORMAT);
    CHECK_MSG("tensor 'a': shape (3) of F32 needs 12 bytes");
    CHECK_RC(open_raw("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", v,
                      4), FL_EFORMAT);
    CHECK_MSG("tensor 'a': dtype 'F8_E4M3'");
    CHECK_RC(open_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", v, 16),
             FL_EFORMAT);
    CHECK_MSG("unused bytes");
    CHECK_RC(open_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", v, 8),
             FL_EFORMAT);
    CHECK_RC(open_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}",
                      v, 8), FL_EFORMAT);
    CHECK_MSG("unknown field 'x'");
    CHECK_RC(open_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"__metadata__\":{\"crc32.b\":\"00000000\"}}", v, 8), FL_EFORMAT);
    CHECK_MSG("'b', which is not in the file");
    CHECK_RC(open_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"__metadata__\":{\"k\":3}}", v, 8), FL_EFORMAT);
    CHECK_RC(open_raw("[]", NULL, 0), FL_EFORMAT);
    /* a foreign file without checksums opens (PyTorch's safetensors writes none) */
    CHECK_OK(open_raw("{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", v, 4));
    /* a header length beyond the file */
    char q[512];
    path_of(q, sizeof q, "long.safetensors");
    unsigned char b[16] = {0xFF, 0xFF, 0x00, 0x00, 0, 0, 0, 0, '{', '}'};
    spit(q, b, 10);
    fl_safetensors *st;
    CHECK_RC(fl_safetensors_open(q, &st), FL_EFORMAT);
    CHECK_MSG("header length 65535 runs past the end of the file (10 bytes)");
    b[7] = 0x10;
    spit(q, b, 10);
    CHECK_RC(fl_safetensors_open(q, &st), FL_EFORMAT);
    CHECK_MSG("beyond the format's limit");
}

/* strict and partial loading into named parameters: nothing is copied unless all matched */
static void test_load(void) {
    char p[512];
    path_of(p, sizeof p, "all.safetensors");
    fl_safetensors *st;
    CHECK_OK(fl_safetensors_open(p, &st));
    if (!st)
        return;
    float wv[6] = {0}, sv[1] = {0};
    fl_param pw = {.name = "fc.weight"}, ps = {.name = "scalar"}, pd = {.name = "d"};
    int64_t sw[2] = {2, 3}, sbad[2] = {3, 2};
    double dv[3] = {0};
    int64_t sd[1] = {3};
    fl_tensor_view(&pw.value, FL_DTYPE_F32, 2, sw, wv);
    fl_tensor_view(&ps.value, FL_DTYPE_F32, 0, NULL, sv);
    fl_tensor_view(&pd.value, FL_DTYPE_F64, 1, sd, dv);
    const char *skip[] = {"counts", "i", "half", "bf", "bytes"};
    fl_param *all[] = {&pw, &ps, &pd};
    fl_ckpt_report rep;
    CHECK_OK(fl_ckpt_load(st, all, 3, FL_CKPT_STRICT, skip, 5, &rep));
    CHECK(memcmp(wv, w, sizeof w) == 0 && sv[0] == 7.0f && memcmp(dv, d64, sizeof dv) == 0);
    CHECK(rep.loaded == 3 && rep.missing == 0 && rep.unexpected == 0);

    /* unexpected tensors refuse a strict load */
    memset(wv, 0, sizeof wv);
    CHECK_RC(fl_ckpt_load(st, all, 3, FL_CKPT_STRICT, NULL, 0, NULL), FL_EFORMAT);
    CHECK_MSG("unexpected tensor 'counts'");
    CHECK(wv[0] == 0.0f); /* nothing half-loaded */

    /* wrong shape: refused naming file and tensor; nothing copied, also not the good ones */
    memset(sv, 0, sizeof sv);
    memset(dv, 0, sizeof dv);
    fl_tensor_view(&pw.value, FL_DTYPE_F32, 2, sbad, wv);
    CHECK_RC(fl_ckpt_load(st, all, 3, FL_CKPT_STRICT, skip, 5, NULL), FL_ESHAPE);
    CHECK_MSG("tensor 'fc.weight' is F32 (2, 3) in the file but F32 (3, 2) here");
    CHECK_MSG(p);
    CHECK(sv[0] == 0.0f && dv[0] == 0.0);
    /* wrong dtype */
    fl_tensor_view(&pw.value, FL_DTYPE_F32, 2, sw, wv);
    fl_tensor_view(&pd.value, FL_DTYPE_F32, 1, sd, dv);
    CHECK_RC(fl_ckpt_load(st, all, 3, FL_CKPT_STRICT, skip, 5, NULL), FL_ESHAPE);
    CHECK_MSG("tensor 'd' is F64 (3) in the file but F32 (3) here");
    CHECK(wv[0] == 0.0f && sv[0] == 0.0f);
    /* missing */
    fl_param pm = {.name = "fc.bias"};
    float mv[3] = {9, 9, 9};
    int64_t sm[1] = {3};
    fl_tensor_view(&pm.value, FL_DTYPE_F32, 1, sm, mv);
    fl_param *with_missing[] = {&pw, &pm};
    const char *skip2[] = {"counts", "i", "half", "bf", "bytes", "d", "scalar"};
    CHECK_RC(fl_ckpt_load(st, with_missing, 2, FL_CKPT_STRICT, skip2, 7, NULL), FL_EFORMAT);
    CHECK_MSG("tensor 'fc.bias' is missing");
    CHECK(wv[0] == 0.0f);

    /* partial (if_exist): takes what fits, reports the rest */
    fl_param *mixed[] = {&pw, &pm, &pd};
    CHECK_OK(fl_ckpt_load(st, mixed, 3, FL_CKPT_PARTIAL, NULL, 0, &rep));
    CHECK(rep.loaded == 1 && rep.missing == 1 && rep.mismatched == 1 && rep.unexpected == 6);
    CHECK(memcmp(wv, w, sizeof w) == 0 && mv[0] == 9.0f);
    CHECK(strstr(rep.missing_names, "fc.bias") != NULL);
    CHECK(strstr(rep.mismatched_names, "d (file (3) F64, model (3) F32)") != NULL);
    CHECK(strstr(rep.unexpected_names, "counts") != NULL);
    /* partial with nothing matching is an error */
    fl_param *none[] = {&pm};
    CHECK_RC(fl_ckpt_load(st, none, 1, FL_CKPT_PARTIAL, NULL, 0, &rep), FL_EFORMAT);
    CHECK_MSG("no tensor matches");
    fl_safetensors_close(st);
}

static void test_npy(void) {
    char p[512];
    path_of(p, sizeof p, "x.npy");
    float v[6] = {1, 2, 3, 4, 5, -6.5f};
    int64_t shape[2] = {3, 2};
    CHECK_OK(fl_npy_write_f32(p, 2, shape, v));
    size_t n;
    unsigned char *b = slurp(p, &n);
    size_t hlen = n - sizeof v; /* the data starts 64-byte aligned after a '\n' */
    CHECK(b && hlen % 64 == 0 && memcmp(b, "\x93NUMPY\x01\x00", 8) == 0 && b[hlen - 1] == '\n');
    CHECK(b && (size_t)(b[8] | b[9] << 8) == hlen - 10);
    CHECK(b && strstr((const char *)b + 10, "{'descr': '<f4', 'fortran_order': False, "
                                            "'shape': (3, 2), }") != NULL);
    free(b);
    int nd;
    int64_t s2[6];
    float *got;
    CHECK_OK(fl_npy_read_f32(p, &nd, s2, &got));
    CHECK(nd == 2 && s2[0] == 3 && s2[1] == 2 && got && memcmp(got, v, sizeof v) == 0);
    free(got);
    int64_t s1[1] = {6};
    CHECK_OK(fl_npy_write_f32(p, 1, s1, v));
    CHECK_OK(fl_npy_read_f32(p, &nd, s2, &got));
    CHECK(nd == 1 && s2[0] == 6);
    free(got);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/fleet_test_st_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_crc();
    test_json();
    test_roundtrip();
    test_truncation();
    test_flipped_bytes();
    test_random_damage();
    test_layouts();
    test_load();
    test_npy();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    if (test_failures)
        fprintf(stderr, "%d check(s) failed\n", test_failures);
    return test_failures ? 1 : 0;
}
