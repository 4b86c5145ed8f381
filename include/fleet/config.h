/* config.h - YAML configuration (libyaml) checked against a schema, with -o overrides.
 *
 * A schema is an array of fl_cfg_key: a dotted path ("optimizer.momentum"), a type, and where
 * the value goes in a caller's struct (offsetof). fl_config_load reads a YAML file of nested
 * mappings, applies "-o a.b.c=value" overrides on top (the value is parsed as YAML, so lists
 * are written "[0.1, 0.01]"), and fills the struct. The caller sets defaults in the struct
 * first; keys that appear overwrite them. Refused, with the key and where it came from
 * ("quickstart.yaml:12" or "-o"): unknown keys (with a did-you-mean), wrong types, values out
 * of range or not among the choices, missing required keys, duplicate keys, YAML syntax
 * errors (with libyaml's line and column). Nothing in the struct is trusted after a failure.
 *
 * Details: a key may be written nested or dotted ("optimizer: {momentum: 0.9}" or
 * "optimizer.momentum: 0.9"); a section left empty in the file ("optimizer:") sets nothing; a
 * null value ("", "~", "null") is refused; a list key also takes a single scalar (a list of
 * one); bools take true/false, yes/no, on/off in any case; integers are decimal; doubles must
 * be finite; aliases and more than one YAML document are refused. */
#ifndef FLEET_CONFIG_H
#define FLEET_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FL_CFG_BOOL = 0,    /* bool:   true/false (also yes/no, on/off) */
    FL_CFG_INT,         /* int64_t */
    FL_CFG_DOUBLE,      /* double; integers accepted */
    FL_CFG_STRING,      /* char[size] */
    FL_CFG_ENUM,        /* int: index of the value in choices "sgd|momentum" */
    FL_CFG_INT_LIST,    /* fl_cfg_int_list */
    FL_CFG_DOUBLE_LIST, /* fl_cfg_double_list */
} fl_cfg_type;

#define FL_CFG_LIST_MAX 32

typedef struct {
    int     n;
    int64_t v[FL_CFG_LIST_MAX];
} fl_cfg_int_list;

typedef struct {
    int    n;
    double v[FL_CFG_LIST_MAX];
} fl_cfg_double_list;

typedef struct fl_cfg_key {
    const char *path;    /* "optimizer.momentum" */
    fl_cfg_type type;
    size_t      offset;  /* offsetof(struct, field) */
    size_t      size;    /* FL_CFG_STRING: capacity of the char array */
    double      min;     /* numbers and list elements: inclusive range, checked when */
    double      max;     /*   min <= max (set both to 0 for no check) */
    const char *choices; /* FL_CFG_ENUM: "a|b|c" */
    bool        required;
    const char *help;    /* one line, for --help-config and docs */
} fl_cfg_key;

/* Loads path (NULL: none, overrides only), then overrides[0..n) ("a.b=value"), into out.
 * If was_set is not NULL it receives, per schema key, whether the file or an override set it.
 * Returns 0, or FL_ECONFIG / FL_EIO (file cannot be opened or read) with a message naming the
 * key and its line. All arguments are borrowed; thread-safe for distinct out structs. */
int fl_config_load(const char *path, const char *const *overrides, int noverrides,
                   const fl_cfg_key *schema, int nkeys, void *out, bool *was_set);

/* As fl_config_load, and if line is not NULL it receives, per schema key (nkeys ints), the
 * line of the file that set it, 0 where the file did not (overrides leave it alone): what
 * fl_config_origin names, kept by the loader so that nothing reads the file again. Filled as
 * far as loading got, as was_set is. */
int fl_config_load_lines(const char *path, const char *const *overrides, int noverrides,
                         const fl_cfg_key *schema, int nkeys, void *out, bool *was_set,
                         int *line);

/* Where key (a schema path, "strategy.dgc") got its value, for messages about checks that run
 * after loading (combinations of keys): writes "-o TEXT" when an override set it (overrides win
 * over the file) or "path:LINE" when the file did (line: the key's line as
 * fl_config_load_lines gave it, 0 when the file did not set it), into buf (NUL terminated,
 * truncated to cap), and returns 1; returns 0 with buf "" when neither set it. An entry for a
 * section that holds the key ("-o strategy={dgc: true}") counts. path and overrides as given
 * to fl_config_load_lines, which must have accepted them. Reads no file. */
int fl_config_origin(const char *path, int line, const char *const *overrides, int noverrides,
                     const char *key, char *buf, size_t cap);

/* Writes the effective configuration, one "path: value" line per key, in schema order, as YAML
 * that fl_config_load reads back to the same values: numbers in their shortest exact form,
 * enums by name, lists as [a, b], strings plain when safe and double-quoted otherwise. */
void fl_config_print(const fl_cfg_key *schema, int nkeys, const void *obj, FILE *out);

/* Writes the effective configuration as one JSON object of dotted keys into buf (NUL
 * terminated, truncated to cap; buf may be NULL when cap is 0). Returns the length it needed,
 * without the NUL (as snprintf does). Non-finite doubles are written as null. */
size_t fl_config_to_json(const fl_cfg_key *schema, int nkeys, const void *obj, char *buf,
                         size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_CONFIG_H */
