/* yaml_tree.h - one YAML document as a small tree of mappings, sequences and scalars that keep
 * their line numbers, so that config.c can name the line of every key it refuses.
 * Private to the library; built on libyaml's event API. */
#ifndef FLEET_IO_YAML_TREE_H
#define FLEET_IO_YAML_TREE_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    FL_YAML_SCALAR = 0,
    FL_YAML_SEQUENCE,
    FL_YAML_MAPPING,
} fl_yaml_kind;

/* Nesting deeper than this is refused: configs are a few levels deep, and the limit keeps
 * every walk over the tree's recursion shallow whatever the input. */
#define FL_YAML_MAX_DEPTH 64

typedef struct fl_yaml_node fl_yaml_node;
struct fl_yaml_node {
    fl_yaml_kind   kind;
    int            line;   /* 1-based line where the node starts */
    int            column; /* 1-based */
    char          *text;   /* scalar: its value, NUL terminated (may hold NULs: see len) */
    size_t         len;    /* scalar: bytes in text */
    bool           plain;  /* scalar: unquoted and untagged (only such a scalar can be null) */
    fl_yaml_node **items;  /* sequence: n items; mapping: n pairs, key items[2i] (always a */
    size_t         n;      /*   scalar), value items[2i+1] */
    size_t         nitems; /* filled slots of items (a mapping's key may await its value) */
    size_t         cap;
};

/* Parses text[0..len) (at most one document) into *root, which is NULL for a stream with no
 * document (an empty file, or only comments). origin names the input in messages: when
 * is_file, "origin:line:column: problem"; otherwise "origin: column C: problem". Anchors are
 * ignored and aliases refused (no billion laughs). Returns 0, or FL_ECONFIG / FL_ENOMEM with
 * the message set. The caller owns *root and frees it with fl_yaml_tree_free. */
int fl_yaml_tree_parse(const char *text, size_t len, const char *origin, bool is_file,
                       fl_yaml_node **root);

/* Frees a tree; NULL is a no-op. */
void fl_yaml_tree_free(fl_yaml_node *root);

/* Whether n is YAML's null: NULL, or a plain scalar "", "~", "null", "Null" or "NULL". */
bool fl_yaml_is_null(const fl_yaml_node *n);

/* "a mapping", "a sequence" or "a scalar", for messages. */
const char *fl_yaml_kind_name(fl_yaml_kind kind);

#endif /* FLEET_IO_YAML_TREE_H */
