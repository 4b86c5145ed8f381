/* yaml_tree.c - libyaml events into a tree of fl_yaml_node. The tree is built with an explicit
 * stack of open containers and its depth is capped, so hostile input (deep nesting, huge
 * scalars, binary garbage) ends in an error message, never in a stack overflow. */
#include "io/yaml_tree.h"

#include "fleet/status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

const char *fl_yaml_kind_name(fl_yaml_kind kind) {
    switch (kind) {
    case FL_YAML_SCALAR: return "a scalar";
    case FL_YAML_SEQUENCE: return "a sequence";
    case FL_YAML_MAPPING: return "a mapping";
    }
    return "a node";
}

bool fl_yaml_is_null(const fl_yaml_node *n) {
    if (!n)
        return true;
    if (n->kind != FL_YAML_SCALAR || !n->plain)
        return false;
    return n->len == 0 || strcmp(n->text, "~") == 0 || strcmp(n->text, "null") == 0 ||
           strcmp(n->text, "Null") == 0 || strcmp(n->text, "NULL") == 0;
}

/* Frees without recursion: a node's children are moved onto a work list first. */
void fl_yaml_tree_free(fl_yaml_node *root) {
    if (!root)
        return;
    size_t n = 1, cap = 16;
    fl_yaml_node **todo = malloc(cap * sizeof *todo);
    if (!todo) {
        /* Depth is capped at FL_YAML_MAX_DEPTH, so recursion is a safe fallback. */
        for (size_t i = 0; i < root->nitems; i++)
            fl_yaml_tree_free(root->items[i]);
        free(root->items);
        free(root->text);
        free(root);
        return;
    }
    todo[0] = root;
    while (n > 0) {
        fl_yaml_node *node = todo[--n];
        for (size_t i = 0; i < node->nitems; i++) {
            if (n == cap) {
                fl_yaml_node **grown = realloc(todo, 2 * cap * sizeof *todo);
                if (!grown) {
                    fl_yaml_tree_free(node->items[i]); /* bounded recursion, as above */
                    continue;
                }
                todo = grown;
                cap *= 2;
            }
            todo[n++] = node->items[i];
        }
        free(node->items);
        free(node->text);
        free(node);
    }
    free(todo);
}

/* Appends child to container c; a mapping takes key and value in turn and counts a pair once
 * its value has come. */
static int add_child(fl_yaml_node *c, fl_yaml_node *child) {
    if (c->nitems == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        fl_yaml_node **items = realloc(c->items, cap * sizeof *items);
        if (!items)
            return fl_fail(FL_ENOMEM, "out of memory parsing YAML");
        c->items = items;
        c->cap = cap;
    }
    c->items[c->nitems++] = child;
    c->n = c->kind == FL_YAML_MAPPING ? c->nitems / 2 : c->nitems;
    return FL_OK;
}

/* Counts lines up to a byte offset: libyaml gives reader errors as an offset only. */
static size_t line_of_offset(const char *text, size_t len, size_t offset) {
    size_t line = 1;
    for (size_t i = 0; i < offset && i < len; i++)
        line += text[i] == '\n';
    return line;
}

static int parser_error(const yaml_parser_t *p, const char *text, size_t len, const char *origin,
                        bool is_file) {
    const char *problem = p->problem ? p->problem : "unknown error";
    if (p->error == YAML_MEMORY_ERROR)
        return fl_fail(FL_ENOMEM, "%s: out of memory parsing YAML", origin);
    if (p->error == YAML_READER_ERROR) {
        /* Invalid UTF-8 or a control character: libyaml reports the byte offset. */
        if (is_file)
            return fl_fail(FL_ECONFIG, "%s:%zu: not valid YAML text: %s (byte %zu)", origin,
                           line_of_offset(text, len, p->problem_offset), problem,
                           p->problem_offset);
        return fl_fail(FL_ECONFIG, "%s: not valid YAML text: %s (byte %zu)", origin, problem,
                       p->problem_offset);
    }
    size_t line = p->problem_mark.line + 1, col = p->problem_mark.column + 1;
    char ctx[160] = "";
    if (is_file) {
        if (p->context)
            snprintf(ctx, sizeof ctx, " (%s at line %zu)", p->context, p->context_mark.line + 1);
        return fl_fail(FL_ECONFIG, "%s:%zu:%zu: YAML syntax error: %s%s", origin, line, col,
                       problem, ctx);
    }
    /* A one-line value: a column helps, unless libyaml points past the end of the text. */
    if (p->problem_mark.line == 0)
        snprintf(ctx, sizeof ctx, " at column %zu", col);
    return fl_fail(FL_ECONFIG, "%s: YAML syntax error%s: %s%s%s%s", origin, ctx, problem,
                   p->context ? " (" : "", p->context ? p->context : "", p->context ? ")" : "");
}

/* "origin:line" for a file, "origin" otherwise; for messages about a node. */
static int node_fail(const char *origin, bool is_file, size_t line, const char *what) {
    if (is_file)
        return fl_fail(FL_ECONFIG, "%s:%zu: %s", origin, line, what);
    return fl_fail(FL_ECONFIG, "%s: %s", origin, what);
}

int fl_yaml_tree_parse(const char *text, size_t len, const char *origin, bool is_file,
                       fl_yaml_node **root) {
    int rc = FL_OK;
    yaml_parser_t parser;
    yaml_event_t event;
    bool have_event = false;
    fl_yaml_node *stack[FL_YAML_MAX_DEPTH]; /* open containers, innermost last */
    int depth = 0, documents = 0;
    fl_yaml_node *top = NULL;
    bool done = false;

    *root = NULL;
    if (!yaml_parser_initialize(&parser))
        return fl_fail(FL_ENOMEM, "%s: out of memory starting the YAML parser", origin);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);

    while (!done) {
        if (!yaml_parser_parse(&parser, &event)) {
            rc = parser_error(&parser, text, len, origin, is_file);
            goto fail;
        }
        have_event = true;
        size_t line = event.start_mark.line + 1;
        fl_yaml_node *node = NULL;
        switch (event.type) {
        case YAML_STREAM_END_EVENT: done = true; break;
        case YAML_DOCUMENT_START_EVENT:
            if (++documents > 1) {
                rc = node_fail(origin, is_file, line,
                               "a second YAML document ('---'); a config is one document");
                goto fail;
            }
            break;
        case YAML_ALIAS_EVENT:
            rc = node_fail(origin, is_file, line, "YAML aliases (*name) are not supported");
            goto fail;
        case YAML_SCALAR_EVENT:
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            if (event.type != YAML_SCALAR_EVENT && depth == FL_YAML_MAX_DEPTH) {
                char what[96];
                snprintf(what, sizeof what, "nesting deeper than %d levels", FL_YAML_MAX_DEPTH);
                rc = node_fail(origin, is_file, line, what);
                goto fail;
            }
            node = calloc(1, sizeof *node);
            if (!node) {
                rc = fl_fail(FL_ENOMEM, "%s: out of memory parsing YAML", origin);
                goto fail;
            }
            node->line = (int)(line > INT32_MAX ? INT32_MAX : line);
            node->column =
                (int)(event.start_mark.column + 1 > INT32_MAX ? INT32_MAX
                                                              : event.start_mark.column + 1);
            if (event.type == YAML_SCALAR_EVENT) {
                node->kind = FL_YAML_SCALAR;
                node->len = event.data.scalar.length;
                node->plain = event.data.scalar.plain_implicit;
                node->text = malloc(node->len + 1);
                if (!node->text) {
                    free(node);
                    rc = fl_fail(FL_ENOMEM, "%s: out of memory parsing YAML", origin);
                    goto fail;
                }
                memcpy(node->text, event.data.scalar.value, node->len);
                node->text[node->len] = '\0';
            } else {
                node->kind =
                    event.type == YAML_MAPPING_START_EVENT ? FL_YAML_MAPPING : FL_YAML_SEQUENCE;
            }
            if (depth == 0) {
                top = node;
            } else {
                fl_yaml_node *parent = stack[depth - 1];
                bool is_key = parent->kind == FL_YAML_MAPPING && parent->nitems % 2 == 0;
                if (is_key && node->kind != FL_YAML_SCALAR) {
                    fl_yaml_tree_free(node);
                    rc = node_fail(origin, is_file, line, "a mapping key must be a scalar");
                    goto fail;
                }
                rc = add_child(parent, node);
                if (rc < 0) {
                    fl_yaml_tree_free(node);
                    goto fail;
                }
            }
            if (node->kind != FL_YAML_SCALAR)
                stack[depth++] = node;
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: depth--; break;
        default: break;
        }
        yaml_event_delete(&event);
        have_event = false;
    }
    yaml_parser_delete(&parser);
    *root = top;
    return FL_OK;

fail:
    if (have_event)
        yaml_event_delete(&event);
    yaml_parser_delete(&parser);
    fl_yaml_tree_free(top);
    return rc;
}
