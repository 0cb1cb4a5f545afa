/*
 * io_fault.c: an LD_PRELOAD shim that makes writes and syncs of a SQLite database fail with EIO when a
 * test tells it to. Used by crates/herald/tests/io_errors.rs, which compiles it with `cc` into a
 * temporary directory (cc -shared -fPIC -O2 -o libio_fault.so io_fault.c -ldl) and starts Herald with
 * LD_PRELOAD pointing at it; see docs/reliability.md for why a shim (and not a VFS or FUSE).
 *
 * Control: HERALD_IO_FAULT names a control file. While it does not exist, every call passes straight
 * through. While it exists, it holds one line
 *
 *     OP TARGET SKIP COUNT [ERRNO]
 *
 *   OP      write (write, pwrite, pwrite64, writev, pwritev), sync (fsync, fdatasync) or any;
 *   TARGET  wal (a file whose name ends in "-wal"), db (one that ends in ".db") or any (either);
 *   SKIP    how many matching calls to let through first (0: the next one fails);
 *   COUNT   how many matching calls to fail then (0: every one, for as long as the file exists);
 *   ERRNO   the error the failed calls report: EIO (the default) or EROFS (what every write on a
 *           filesystem the kernel remounted read-only after an error reports: `errors=remount-ro`).
 *
 * Calls are counted from the moment the control file was (re)written: a new file, or a new
 * modification time, starts the count again. Every failed call appends a line ("OP PATH") to the
 * control file's name plus ".fired", so that the test knows the fault hit.
 *
 * The shim fails the call as the kernel reports an error (-1, errno EIO or EROFS) without doing it: it
 * models the error the database sees, not what a failing disk does to the data (after a real failed
 * fsync Linux may drop the dirty pages; here they stay).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum op { OP_WRITE, OP_SYNC };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* The control file as last seen (its identity and time), and the matching calls counted since. */
static ino_t seen_ino;
static struct timespec seen_mtime;
static long matched;

static int ends_with(const char *text, const char *suffix) {
    size_t n = strlen(text), m = strlen(suffix);
    return n >= m && strcmp(text + n - m, suffix) == 0;
}

/* The errno this call on `fd` is to fail with (0: it passes); records the failure. Keeps errno as it was
 * when it passes. */
static int should_fail(int fd, enum op op) {
    int saved = errno;
    const char *control = getenv("HERALD_IO_FAULT");
    struct stat st, cst;
    if (control == NULL || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || stat(control, &cst) != 0) {
        errno = saved;
        return 0;
    }
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, path, sizeof path - 1);
    if (len <= 0) {
        errno = saved;
        return 0;
    }
    path[len] = '\0';
    int is_wal = ends_with(path, "-wal"), is_db = ends_with(path, ".db");
    if (!is_wal && !is_db) {
        errno = saved;
        return 0;
    }

    char want_op[16] = "", want_target[16] = "", want_errno[16] = "EIO";
    long skip = 0, count = 0;
    FILE *file = fopen(control, "r");
    if (file == NULL) {
        errno = saved;
        return 0;
    }
    int fields = fscanf(file, "%15s %15s %ld %ld %15s", want_op, want_target, &skip, &count, want_errno);
    fclose(file);
    if (fields != 4 && fields != 5) {
        errno = saved;
        return 0;
    }
    int op_matches = strcmp(want_op, "any") == 0 || (op == OP_WRITE && strcmp(want_op, "write") == 0) ||
                     (op == OP_SYNC && strcmp(want_op, "sync") == 0);
    int target_matches = strcmp(want_target, "any") == 0 || (is_wal && strcmp(want_target, "wal") == 0) ||
                         (is_db && strcmp(want_target, "db") == 0);
    if (!op_matches || !target_matches) {
        errno = saved;
        return 0;
    }

    pthread_mutex_lock(&lock);
    if (cst.st_ino != seen_ino || cst.st_mtim.tv_sec != seen_mtime.tv_sec ||
        cst.st_mtim.tv_nsec != seen_mtime.tv_nsec) {
        seen_ino = cst.st_ino;
        seen_mtime = cst.st_mtim;
        matched = 0;
    }
    long nth = matched++;
    pthread_mutex_unlock(&lock);
    int fail = nth >= skip && (count == 0 || nth < skip + count);
    if (fail) {
        char fired[4200];
        snprintf(fired, sizeof fired, "%s.fired", control);
        FILE *log = fopen(fired, "a");
        if (log != NULL) {
            fprintf(log, "%s %s\n", op == OP_WRITE ? "write" : "sync", path);
            fclose(log);
        }
    }
    errno = saved;
    if (!fail) {
        return 0;
    }
    return strcmp(want_errno, "EROFS") == 0 ? EROFS : EIO;
}

#define REAL(name, type) ((type)dlsym(RTLD_NEXT, name))

ssize_t write(int fd, const void *buf, size_t n) {
    int error = should_fail(fd, OP_WRITE);
    if (error) {
        errno = error;
        return -1;
    }
    return REAL("write", ssize_t (*)(int, const void *, size_t))(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t offset) {
    int error = should_fail(fd, OP_WRITE);
    if (error) {
        errno = error;
        return -1;
    }
    return REAL("pwrite", ssize_t (*)(int, const void *, size_t, off_t))(fd, buf, n, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t offset) {
    int error = should_fail(fd, OP_WRITE);
    if (error) {
        errno = error;
        return -1;
    }
    return REAL("pwrite64", ssize_t (*)(int, const void *, size_t, off64_t))(fd, buf, n, offset);
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
    int error = should_fail(fd, OP_WRITE);
    if (error) {
        errno = error;
        return -1;
    }
    return REAL("writev", ssize_t (*)(int, const struct iovec *, int))(fd, iov, count);
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t offset) {
    int error = should_fail(fd, OP_WRITE);
    if (error) {
        errno = error;
        return -1;
    }
    return REAL("pwritev", ssize_t (*)(int, const struct iovec *, int, off_t))(fd, iov, count, offset);
}

int fsync(int fd) {
    int error = should_fail(fd, OP_SYNC);
    if (error) {
        errno = error;
        return -1;
    }
    return REAL("fsync", int (*)(int))(fd);
}

int fdatasync(int fd) {
    int error = should_fail(fd, OP_SYNC);
    if (error) {
        errno = error;
        return -1;
    }
    return REAL("fdatasync", int (*)(int))(fd);
}
