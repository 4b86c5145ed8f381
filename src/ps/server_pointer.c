/* server_pointer.c - a parameter server's checkpoint pointer, ps.server<s>.latest: the chain a
 * restart loads ("fleet-ps-checkpoint 1", "server s of S", "step N", then "file <name>" per
 * file, oldest first), written atomically after each save and read back line by line, a
 * refusal naming the file and line. */
#include "server.h"

#include "fleet/status.h"
#include "io/atomic.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_write_pointer(ps_server *s, const ps_chain *c) {
    char path[1200], *text = malloc((size_t)PS_CHAIN_MAX * 110 + 256);
    if (!text)
        return fl_fail(FL_ENOMEM, "out of memory");
    size_t len = (size_t)sprintf(text, "fleet-ps-checkpoint 1\nserver %d of %d\nstep %" PRId64
                                 "\n", s->s, s->S, c->step);
    for (int i = 0; i < c->n; i++)
        len += (size_t)sprintf(text + len, "file %s\n", c->files[i]);
    snprintf(path, sizeof path, "%s/ps.server%d.latest", s->cfg.checkpoint_dir, s->s);
    int rc = fl_atomic_write_file(path, text, len);
    free(text);
    return rc;
}

int ps_read_pointer(const char *dir, int me, int *nservers, ps_chain *c, bool *have) {
    char path[1200];
    snprintf(path, sizeof path, "%s/ps.server%d.latest", dir, me);
    *have = false;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT)
            return 0;
        return fl_fail(FL_EIO, "%s: %s", path, strerror(errno));
    }
    memset(c, 0, sizeof *c);
    char line[256];
    int ln = 0, rc = 0, server = -1, servers = -1;
    bool magic = false, have_step = false;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        ln++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n')
            line[--len] = '\0';
        long long x;
        int used = 0;
        if (ln == 1) {
            magic = strcmp(line, "fleet-ps-checkpoint 1") == 0;
            if (!magic)
                rc = fl_fail(FL_EFORMAT, "%s:1: not a parameter-server checkpoint pointer", path);
        } else if (sscanf(line, "server %d of %d%n", &server, &servers, &used) == 2 &&
                   !line[used]) {
            if (server != me || (*nservers > 0 && servers != *nservers))
                rc = fl_fail(FL_EFORMAT, "%s:%d: the checkpoint is server %d of %d's; this is "
                             "server %d of %d", path, ln, server, servers, me, *nservers);
            else if (servers < 1 || servers > FL_PS_MAX_SERVERS || server >= servers)
                rc = fl_fail(FL_EFORMAT, "%s:%d: server %d of %d?", path, ln, server, servers);
            else
                *nservers = servers;
        } else if (sscanf(line, "step %lld%n", &x, &used) == 1 && !line[used] && x >= 0) {
            c->step = x;
            have_step = true;
        } else if (strncmp(line, "file ", 5) == 0 && len > 5 && len - 5 < sizeof c->files[0] &&
                   !strchr(line + 5, '/') && c->n < PS_CHAIN_MAX) {
            memcpy(c->files[c->n++], line + 5, len - 5 + 1);
        } else {
            rc = fl_fail(FL_EFORMAT, "%s:%d: cannot read '%s'", path, ln, line);
        }
    }
    fclose(f);
    if (rc == 0 && (!magic || !have_step || c->n == 0 || server < 0))
        rc = fl_fail(FL_EFORMAT, "%s: incomplete pointer (needs server, step and files)", path);
    *have = rc == 0;
    return rc;
}
