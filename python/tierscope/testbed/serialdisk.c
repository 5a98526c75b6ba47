/* A disk of one head, for the processes of one lab host (`disk_read_ms` of a node type).
 *
 * Loaded with LD_PRELOAD into every process the host starts (testbed.host.Host.wrap). A read of
 * a file (pread, preadv) whose bytes are all in the page cache returns at once; a read that
 * misses the cache waits for the disk, which serves one read at a time (an exclusive flock on
 * the host's lock file, shared by all its processes) and holds it for TIERSCOPE_DISK_READ_NS
 * nanoseconds before the read itself. So at a utilisation rho a read that misses waits about
 * S / (1 - rho), as on a disk with one arm, where the kernel's blkio throttle (a token bucket)
 * passes every read under its rate at once.
 *
 * Threads of one process take the arm in turn too (a mutex: they share the process' descriptor).
 *
 * Whether a read misses: the same read with RWF_NOWAIT first (the kernel answers EAGAIN, or
 * fewer bytes, when a page is not cached; it starts reading it, so the device works while the
 * arm's time runs, which is the wait a caller sees). Where the kernel or the file does not support
 * RWF_NOWAIT (EOPNOTSUPP, EINVAL: a pipe, a socket, O_DIRECT), the read passes unchanged.
 *
 * Environment: TIERSCOPE_DISK_READ_NS (service time of one read, ns; missing or 0: no effect),
 * TIERSCOPE_DISK_LOCK (the host's lock file; opened by each process, as a flock held through a
 * descriptor inherited over fork() would be shared with the parent; read-only is enough for
 * flock, so the file is the lab's, readable by the host's users and writable by none of them).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

typedef ssize_t (*preadv2_fn)(int, const struct iovec *, int, off_t, int);

static preadv2_fn real_preadv2;
static long long service_ns = -1;
static const char *lock_path;
static int lock_fd = -1;
static pid_t lock_pid;
/* threads of one process share its descriptor, and a flock does not exclude its own holder */
static pthread_mutex_t arm = PTHREAD_MUTEX_INITIALIZER;

static void init(void) {
    if (service_ns >= 0)
        return;
    real_preadv2 = (preadv2_fn)dlsym(RTLD_NEXT, "preadv2");
    const char *s = getenv("TIERSCOPE_DISK_READ_NS");
    lock_path = getenv("TIERSCOPE_DISK_LOCK");
    long long v = s ? atoll(s) : 0;
    service_ns = (v > 0 && lock_path && real_preadv2) ? v : 0;
}

/* This process' descriptor of the lock file (-1: none, the read is not delayed). */
static int disk_fd(void) {
    pid_t me = getpid();
    if (lock_fd >= 0 && lock_pid == me)
        return lock_fd;
    /* inherited from the parent: its flock is the parent's; open our own */
    int fd = open(lock_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    lock_fd = fd;
    lock_pid = me;
    return fd;
}

static ssize_t read_through(int fd, const struct iovec *iov, int n, off_t off, int flags) {
    init();
    if (service_ns <= 0 || off < 0)
        return real_preadv2 ? real_preadv2(fd, iov, n, off, flags) : (errno = ENOSYS, -1);
    size_t want = 0;
    for (int i = 0; i < n; i++)
        want += iov[i].iov_len;
    int saved = errno;
    ssize_t got = real_preadv2(fd, iov, n, off, flags | RWF_NOWAIT);
    if (got >= 0 && ((size_t)got == want || got == 0)) {
        /* all cached (or end of file: 0 bytes, nothing to wait for) */
        errno = saved;
        return got;
    }
    if (got < 0 && errno != EAGAIN)
        /* not a file the kernel can answer without waiting: not ours to delay */
        return real_preadv2(fd, iov, n, off, flags);
    pthread_mutex_lock(&arm);
    int d = disk_fd();
    if (d < 0) {
        pthread_mutex_unlock(&arm);
        return real_preadv2(fd, iov, n, off, flags);
    }
    while (flock(d, LOCK_EX) < 0 && errno == EINTR) {
    }
    struct timespec t = {service_ns / 1000000000LL, service_ns % 1000000000LL};
    while (nanosleep(&t, &t) < 0 && errno == EINTR) {
    }
    errno = saved;
    ssize_t r = real_preadv2(fd, iov, n, off, flags);
    int e = errno;
    flock(d, LOCK_UN);
    pthread_mutex_unlock(&arm);
    errno = e;
    return r;
}

ssize_t pread(int fd, void *buf, size_t count, off_t off) {
    struct iovec v = {buf, count};
    return read_through(fd, &v, 1, off, 0);
}

ssize_t pread64(int fd, void *buf, size_t count, off_t off) {
    struct iovec v = {buf, count};
    return read_through(fd, &v, 1, off, 0);
}

ssize_t preadv(int fd, const struct iovec *iov, int n, off_t off) { return read_through(fd, iov, n, off, 0); }

ssize_t preadv64(int fd, const struct iovec *iov, int n, off_t off) { return read_through(fd, iov, n, off, 0); }
