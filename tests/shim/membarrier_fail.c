/*
 * An LD_PRELOAD shim that makes membarrier(2) fail, for the keyed map's
 * stress test (tests/keyed_canary.rs) and CI (.ci/run).
 *
 * The keyed map's readers pin with a plain store and a compiler fence when
 * the process has registered for private expedited barriers; the writer's
 * MEMBARRIER_CMD_PRIVATE_EXPEDITED stands in for the readers' fences (see
 * src/reclaim/). This shim lets the registration succeed and then makes the
 * barriers fail, as a seccomp filter installed later, a kernel out of memory
 * or a nohz_full machine (EINVAL for MEMBARRIER_CMD_GLOBAL) would, so that the
 * path that handles such a failure is exercised on any machine.
 *
 * The crate calls membarrier through glibc's `syscall` (`libc::syscall`), so
 * that is the symbol interposed here; every other system call is forwarded
 * to the next definition (glibc's) with six `long` arguments, which is how
 * the x86-64 and AArch64 calling conventions pass them.
 *
 * MEMBARRIER_SHIM selects the behaviour:
 *
 *   after-register:EPERM   QUERY and REGISTER_PRIVATE_EXPEDITED pass, and so
 *   after-register:ENOMEM  does the first PRIVATE_EXPEDITED after a successful
 *   after-register:EINVAL  registration (the crate's probe); every other
 *                          membarrier command fails with -1 and that errno,
 *                          expedited and global alike.
 *   register:ENOSYS        every membarrier command fails with ENOSYS, so the
 *                          registration fails and the crate uses fences.
 *
 * Unset or empty, every call passes. Any other value is refused at load time
 * (the process exits with status 2), so that a typo cannot make a CI run pass
 * without the failure it meant to inject.
 *
 * At exit the shim prints one line to stderr:
 *
 *   membarrier shim (MODE): failed N of M membarrier calls
 *
 * N > 0 shows that the failure path was really taken.
 *
 * Build: cc -shared -fPIC -O2 -o libmembarrier_fail.so membarrier_fail.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_membarrier
#error "this platform has no membarrier system call"
#endif

#define CMD_QUERY 0L
#define CMD_GLOBAL 1L
#define CMD_PRIVATE_EXPEDITED 8L
#define CMD_REGISTER_PRIVATE_EXPEDITED 16L

enum mode {
    PASS,           /* MEMBARRIER_SHIM unset or empty */
    AFTER_REGISTER, /* after-register:ERRNO */
    REGISTER,       /* register:ENOSYS */
};

typedef long (*syscall_fn)(long, ...);

static syscall_fn real_syscall;
static enum mode shim_mode = PASS;
static int shim_errno;
static char shim_name[64] = "off";

/* Set once a registration has succeeded. */
static atomic_int registered;
/* Cleared by the one expedited barrier let through after registration. */
static atomic_int probe_left = 1;
static atomic_ulong calls;
static atomic_ulong failed;

static void die(const char *message, const char *value) {
    fprintf(stderr, "membarrier shim: %s%s\n", message, value ? value : "");
    _exit(2);
}

static syscall_fn next_syscall(void) {
    syscall_fn next = __atomic_load_n(&real_syscall, __ATOMIC_ACQUIRE);
    if (next == NULL) {
        next = (syscall_fn)dlsym(RTLD_NEXT, "syscall");
        if (next == NULL) {
            die("dlsym(RTLD_NEXT, \"syscall\") found nothing", NULL);
        }
        __atomic_store_n(&real_syscall, next, __ATOMIC_RELEASE);
    }
    return next;
}

__attribute__((constructor)) static void shim_init(void) {
    next_syscall();
    const char *value = getenv("MEMBARRIER_SHIM");
    if (value == NULL || value[0] == '\0') {
        return;
    }
    if (strlen(value) >= sizeof shim_name) {
        die("MEMBARRIER_SHIM is too long: ", value);
    }
    strcpy(shim_name, value);
    if (strcmp(value, "after-register:EPERM") == 0) {
        shim_mode = AFTER_REGISTER;
        shim_errno = EPERM;
    } else if (strcmp(value, "after-register:ENOMEM") == 0) {
        shim_mode = AFTER_REGISTER;
        shim_errno = ENOMEM;
    } else if (strcmp(value, "after-register:EINVAL") == 0) {
        shim_mode = AFTER_REGISTER;
        shim_errno = EINVAL;
    } else if (strcmp(value, "register:ENOSYS") == 0) {
        shim_mode = REGISTER;
        shim_errno = ENOSYS;
    } else {
        die("unknown MEMBARRIER_SHIM value (after-register:EPERM, "
            "after-register:ENOMEM, after-register:EINVAL or register:ENOSYS): ",
            value);
    }
}

__attribute__((destructor)) static void shim_report(void) {
    if (shim_mode == PASS) {
        return;
    }
    char line[160];
    int len = snprintf(line, sizeof line,
                       "membarrier shim (%s): failed %lu of %lu membarrier calls\n", shim_name,
                       atomic_load(&failed), atomic_load(&calls));
    if (len > 0) {
        /* write(2), not stdio: stderr may already be closed or flushed. */
        ssize_t ignored = write(STDERR_FILENO, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
        (void)ignored;
    }
}

static long fail(void) {
    atomic_fetch_add(&failed, 1);
    errno = shim_errno;
    return -1;
}

/* Whether this membarrier command is to fail, in the current mode. */
static int should_fail(long cmd) {
    switch (shim_mode) {
    case PASS:
        return 0;
    case REGISTER:
        return 1;
    case AFTER_REGISTER:
        if (cmd == CMD_QUERY || cmd == CMD_REGISTER_PRIVATE_EXPEDITED) {
            return 0;
        }
        if (!atomic_load(&registered)) {
            /* Before registration the kernel answers for itself. */
            return 0;
        }
        if (cmd == CMD_PRIVATE_EXPEDITED && atomic_exchange(&probe_left, 0)) {
            /* The crate's probe, right after it registered. */
            return 0;
        }
        return 1;
    }
    return 0;
}

long syscall(long number, ...) {
    va_list args;
    va_start(args, number);
    long a1 = va_arg(args, long);
    long a2 = va_arg(args, long);
    long a3 = va_arg(args, long);
    long a4 = va_arg(args, long);
    long a5 = va_arg(args, long);
    long a6 = va_arg(args, long);
    va_end(args);

    if (number != SYS_membarrier) {
        return next_syscall()(number, a1, a2, a3, a4, a5, a6);
    }
    atomic_fetch_add(&calls, 1);
    if (should_fail(a1)) {
        return fail();
    }
    long result = next_syscall()(number, a1, a2, a3, a4, a5, a6);
    if (result == 0 && a1 == CMD_REGISTER_PRIVATE_EXPEDITED) {
        atomic_store(&registered, 1);
    }
    return result;
}
