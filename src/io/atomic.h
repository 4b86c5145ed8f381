/* atomic.h - writing a file so that readers see either the old file or the complete new one:
 * write a temporary file in the same directory, fsync it, rename it over the target, fsync the
 * directory (so the rename itself survives a crash). Used for checkpoints, their `latest`
 * pointer and .npy outputs. Private to the library. */
#ifndef FLEET_IO_ATOMIC_H
#define FLEET_IO_ATOMIC_H

#include <stddef.h>

typedef struct {
    int  fd;
    char path[1024];
    char tmp[1100];  /* "<path>.tmp-<pid>" */
} fl_atomic_file;

/* Creates the temporary file. FL_EIO naming the path on failure. */
int  fl_atomic_begin(fl_atomic_file *f, const char *path);
/* Writes all n bytes (retrying short writes). FL_EIO naming the path on failure. */
int  fl_atomic_write(fl_atomic_file *f, const void *p, size_t n);
/* fsync, close, rename onto path, fsync the directory. On failure the temporary file is
 * removed and the target is as it was. */
int  fl_atomic_commit(fl_atomic_file *f);
/* Closes and removes the temporary file (after a failed write). */
void fl_atomic_abort(fl_atomic_file *f);
/* The whole of buf[0..n) as the new content of path. */
int  fl_atomic_write_file(const char *path, const void *buf, size_t n);

#endif /* FLEET_IO_ATOMIC_H */
