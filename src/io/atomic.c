/* atomic.c - crash-safe file replacement: temporary file, fsync, rename, fsync of the
 * directory. A writer killed at any moment leaves at most a stray "*.tmp-PID" file beside the
 * untouched target. */
#include "io/atomic.h"

#include "fleet/status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int fl_atomic_begin(fl_atomic_file *f, const char *path) {
    f->fd = -1;
    if (strlen(path) >= sizeof f->path)
        return fl_fail(FL_EINVAL, "path too long: '%s'", path);
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->tmp, sizeof f->tmp, "%s.tmp-%ld", path, (long)getpid());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0)
        return fl_fail(FL_EIO, "cannot create '%s': %s", f->tmp, strerror(errno));
    return FL_OK;
}

int fl_atomic_write(fl_atomic_file *f, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(f->fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return fl_fail(FL_EIO, "cannot write '%s': %s", f->path,
                           w < 0 ? strerror(errno) : "no progress");
        c += w;
        n -= (size_t)w;
    }
    return FL_OK;
}

void fl_atomic_abort(fl_atomic_file *f) {
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    unlink(f->tmp);
}

/* fsync of the directory holding path, so that a rename in it is durable */
static int sync_dir(const char *path) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return fl_fail(FL_EIO, "cannot open directory '%s': %s", dir, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    /* some file systems cannot fsync a directory; the rename is then as durable as they allow */
    if (rc < 0 && err != EINVAL && err != ENOTSUP)
        return fl_fail(FL_EIO, "cannot fsync directory '%s': %s", dir, strerror(err));
    return FL_OK;
}

int fl_atomic_commit(fl_atomic_file *f) {
    if (fsync(f->fd) < 0) {
        int rc = fl_fail(FL_EIO, "cannot fsync '%s': %s", f->tmp, strerror(errno));
        fl_atomic_abort(f);
        return rc;
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc < 0) {
        rc = fl_fail(FL_EIO, "cannot close '%s': %s", f->tmp, strerror(errno));
        unlink(f->tmp);
        return rc;
    }
    if (rename(f->tmp, f->path) < 0) {
        rc = fl_fail(FL_EIO, "cannot rename '%s' to '%s': %s", f->tmp, f->path, strerror(errno));
        unlink(f->tmp);
        return rc;
    }
    return sync_dir(f->path);
}

int fl_atomic_write_file(const char *path, const void *buf, size_t n) {
    fl_atomic_file f;
    FL_TRY(fl_atomic_begin(&f, path));
    int rc = fl_atomic_write(&f, buf, n);
    if (rc < 0) {
        fl_atomic_abort(&f);
        return rc;
    }
    return fl_atomic_commit(&f);
}
