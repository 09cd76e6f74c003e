/*
 * gpuhook-hook: the createContainer hooks that work over an image's tree, isolated from the host.
 *
 *   gpuhook-hook ldcache ROOTFS LDCONFIG DIR...        refresh the container's ld cache
 *   gpuhook-hook bypath  ROOTFS NAME TARGET [NAME TARGET]...   /dev/dri/by-path links
 *
 * ROOTFS is the container's root, or @state: the root the runtime wrote into the bundle that
 * the OCI state on stdin names (state_rootfs), for a hook made before anyone knows it (a CDI
 * spec, an NRI plugin).
 *
 * A createContainer hook runs as root, in the container's mount namespace, before pivot_root:
 * its / is the node's.  `ldconfig -r ROOTFS` chroots, but a chroot does not stop procfs magic
 * links (`/proc/1/root`, `/proc/self/fd/N`, ...): the image could steer any path ldconfig
 * opens to a host directory.  So, before anything of the image is looked at:
 *
 *   1. LDCONFIG is opened (the node's binary, an fd: nothing is looked up after the pivot),
 *      and must be a static ELF: a dynamic one (or a script) would load the image's loader.
 *   2. A mount namespace of our own, every mount private (nothing propagates either way).
 *   3. Every procfs mount under ROOTFS is detached (in our namespace only): no magic link is
 *      left to follow.  Checked again; any left: give up.  Every other mount under ROOTFS
 *      (volumes, host bind mounts, gpuhook's MPS directory) is made read-only: only the
 *      rootfs's own files are written (the by-path links: the container's /dev too).  (A rootfs that is not a mount
 *      point is then bound on itself, as pivot_root wants.)
 *   4. pivot_root into ROOTFS and detach the old root: no host path is reachable at all.
 *   5. Capabilities cut to the two that file work needs (DAC_OVERRIDE, FOWNER: no SYS_ADMIN,
 *      so nothing can mount a procfs again; no DAC_READ_SEARCH, so no open_by_handle_at),
 *      no_new_privs, every other fd closed on exec.
 *   6. ldconfig runs (execveat of the fd from 1) in a child, with the hook's own environment,
 *      its fsync(2) and fdatasync(2) answered 0 without reaching the disk (a seccomp filter:
 *      no_sync).  ldconfig syncs its cache before the rename: durability that a container's
 *      writable layer has no use for (the next create writes the cache again, and a crashed
 *      node's containers are created afresh), and on a node's disk it cost 0.3 to 2.8 ms a create
 *      here (more on a busy disk).  The rename still makes the new cache appear whole or not at all.
 *
 * Whatever fails (a bad command line too), the hook says why on stderr and exits 0: the
 * container starts, without the libraries in its ld cache.  runc drops a hook's stderr when
 * it exits 0, so the same outcome also goes to the node log when the hook's environment
 * names it (GPUHOOK_LOG_FILE, the node config's log_file: gpuhook/hook/__init__.py): one JSON
 * line, event "hook", with the container id from the OCI state on stdin (what the runtime
 * wrote), the kind, the outcome (refused: a check or a step of the isolation failed;
 * timeout; failed: ldconfig's exit status) and why.  That file is opened first, before
 * anything of the image is looked at and long before the pivot, as the runtime's front opens
 * the same log: O_APPEND (one write per line), O_NOFOLLOW, O_NONBLOCK (a FIFO never blocks),
 * a regular file only, new ones 0640; close-on-exec (ldconfig never has it).  A hook that
 * did its work writes nothing there.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpuhook-hook.h" /* generated from gpuhook/hook/__init__.py */
#include "../runtime/logline.h" /* log_append: a line whole or not at all */

#ifndef MNT_DETACH
#define MNT_DETACH 2
#endif
#ifndef UMOUNT_NOFOLLOW
#define UMOUNT_NOFOLLOW 8
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC 4
#endif
#ifndef AT_EMPTY_PATH
#define AT_EMPTY_PATH 0x1000
#endif

static const char *what = "gpuhook-hook";
static const char *kind = NULL;  /* KIND_LDCACHE | KIND_BYPATH: the log line's "kind" */

/* -- the node log (GPUHOOK_LOG_FILE) ------------------------------------------------------ */

#define LOG_MAX_ID 256
#define STATE_MAX 65536      /* the OCI state's head: "id" and "bundle" come before the pod's annotations */
static int log_fd = -1;
static char log_path[PATH_MAX]; /* its path, for a line that says a line was not written */

/* Before anything else: the log named by our environment, checked as the front checks its
 * own; then taken out of the environment (ldconfig gets the rest). */
static void open_log(void) {
    const char *path = getenv(LOG_ENV);
    if (path && path[0] == '/') {
        int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0640);
        struct stat st;
        if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
            close(fd);
            fd = -1;
        }
        log_fd = fd;
        snprintf(log_path, sizeof log_path, "%s", path); /* for the line that says it was not written */
    }
    unsetenv(LOG_ENV);
}

/* s (at most max bytes of it) as the inside of a JSON string: quotes, backslashes, control
 * and non-ASCII bytes escaped (\u00XX: the line stays valid JSON whatever the bytes). */
static size_t json_escape(char *out, size_t cap, const char *s, size_t max) {
    size_t o = 0;
    for (size_t i = 0; s[i] && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o + 7 >= cap)
            break;
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20 || c >= 0x7f) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = 0;
    return o;
}

/* -- JSON the runtime wrote: the OCI state on stdin, a bundle's config.json --------------- */

static const char *json_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'))
        p++;
    return p;
}

/* The end of the string whose opening quote is at p; NULL when it does not end. */
static const char *json_string_end(const char *p, const char *end) {
    for (p++; p < end; p++) {
        if (*p == '\\')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return NULL;
}

/* The end of the value at p (white space first), nested at most `depth` deep; NULL when it is
 * not one (cut short, or not JSON). */
static const char *json_skip(const char *p, const char *end, int depth) {
    p = json_ws(p, end);
    if (p >= end)
        return NULL;
    if (*p == '"')
        return json_string_end(p, end);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        if (depth <= 0)
            return NULL;
        p = json_ws(p + 1, end);
        if (p < end && *p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {  /* "key": */
                if (p >= end || *p != '"' || !(p = json_string_end(p, end)))
                    return NULL;
                p = json_ws(p, end);
                if (p >= end || *p++ != ':')
                    return NULL;
            }
            if (!(p = json_skip(p, end, depth - 1)))
                return NULL;
            p = json_ws(p, end);
            if (p < end && *p == ',') {
                p = json_ws(p + 1, end);
                continue;
            }
            return p < end && *p == close ? p + 1 : NULL;
        }
    }
    const char *q = p;  /* a number, true, false or null */
    while (q < end && ((*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'z') || *q == '-' || *q == '+' || *q == '.' ||
                       *q == 'E'))
        q++;
    return q > p ? q : NULL;
}

/* The string at keys[0] of the object at p, at keys[1] of that key's object, and so on:
 * copied into out (cap bytes with its NUL; one with an escape in it is not taken).  1, or 0
 * when there is none.  Every other value is skipped whole: a string in a pod's annotations or
 * a process's env ("bundle", "root") is never taken for it. */
static int json_find(const char *p, const char *end, const char *const *keys, int nkeys, char *out, size_t cap) {
    p = json_ws(p, end);
    if (p >= end || *p != '{')
        return 0;
    p = json_ws(p + 1, end);
    while (p < end && *p == '"') {
        const char *key = p + 1, *after = json_string_end(p, end);
        if (!after)
            return 0;
        size_t len = (size_t)(after - 1 - key);
        p = json_ws(after, end);
        if (p >= end || *p++ != ':')
            return 0;
        p = json_ws(p, end);
        if (len == strlen(keys[0]) && memcmp(key, keys[0], len) == 0) {
            if (nkeys > 1)
                return json_find(p, end, keys + 1, nkeys - 1, out, cap);
            if (p >= end || *p != '"' || !(after = json_string_end(p, end)))
                return 0;
            len = (size_t)(after - 1 - (p + 1));
            if (len >= cap || memchr(p + 1, '\\', len))
                return 0;
            memcpy(out, p + 1, len);
            out[len] = 0;
            return 1;
        }
        if (!(p = json_skip(p, end, 64)))
            return 0;
        p = json_ws(p, end);
        if (p >= end || *p != ',')
            return 0;
        p = json_ws(p + 1, end);
    }
    return 0;
}

/* The OCI state on stdin (the runtime writes it, then closes the pipe): its first STATE_MAX
 * bytes, read once, waiting at most 100 ms in all (poll: woken as soon as the runtime writes
 * or closes, never a sleep between tries). */
static char state[STATE_MAX + 1];
static size_t state_len;
static int state_read;

static void read_state(void) {
    if (state_read)
        return;
    state_read = 1;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (state_len < STATE_MAX) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = 100 - ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000);
        struct pollfd in = {0, POLLIN, 0};
        int ready = left > 0 ? poll(&in, 1, (int)left) : 0;
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            break;
        ssize_t r = read(0, state + state_len, STATE_MAX - state_len);
        if (r > 0)
            state_len += (size_t)r;
        else if (r == 0 || (errno != EINTR && errno != EAGAIN))
            break;
    }
}

/* The state's top-level "id": 0 when there is none. */
static int state_id(char *id, size_t cap) {
    static const char *const keys[] = {"id"};
    read_state();
    return json_find(state, state + state_len, keys, 1, id, cap);
}

/* One line in the node log: {"time","event":"hook","kind","container_id","outcome","error"}. */
static void log_outcome(const char *outcome, const char *msg) {
    if (log_fd < 0)
        return;
    char id[LOG_MAX_ID + 1], eid[LOG_MAX_ID * 6 + 8], emsg[LOG_MAX_ERROR * 6 + 8], ekind[64];
    int have_id = state_id(id, sizeof id);
    if (have_id)
        json_escape(eid, sizeof eid, id, LOG_MAX_ID);
    json_escape(emsg, sizeof emsg, msg, LOG_MAX_ERROR);
    json_escape(ekind, sizeof ekind, kind ? kind : "unknown", 16);
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    char line[sizeof eid + sizeof emsg + sizeof ekind + 256];
    int len = snprintf(line, sizeof line,
                       "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"event\":\"" LOG_EVENT "\",\"kind\":\"%s\","
                       "\"container_id\":%s%s%s,\"outcome\":\"%s\",\"error\":\"%s\"}\n",
                       tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                       now.tv_nsec / 1000000, ekind, have_id ? "\"" : "", have_id ? eid : "null",
                       have_id ? "\"" : "", outcome, emsg);
    char why[256];
    if (len > 0 && (size_t)len < sizeof line && log_append(log_fd, line, (size_t)len, why, sizeof why) < 0)
        fprintf(stderr, "gpuhook: %s: " CANNOT_WRITE_LOG "\n", what, log_path, why);
}

/* Say why (stderr, and the node log), and let the container start. */
static int say(const char *outcome, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int say(const char *outcome, const char *fmt, ...) {
    char msg[LOG_MAX_ERROR + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpuhook: %s: %s\n", what, msg);
    log_outcome(outcome, msg);
    return 0;
}

/* A step that could not be done or a check that failed: said, and the container starts. */
static int skip(const char *why, int err) {
    if (err)
        return say("refused", "%s: %s; skipped", why, strerror(err));
    return say("refused", "%s; skipped", why);
}

/* ROOTFS_FROM_STATE (gpuhook/hook/__init__.py) as the hook's ROOTFS: the container's root as
 * the runtime wrote it, where no one else can know it before the create (a CDI spec, an NRI
 * plugin): the state's "bundle", that bundle's config.json "root": {"path"}, under the bundle
 * when relative.  Both are the runtime manager's files; nothing of the image is read.  NULL,
 * after saying why, when there is none. */
static const char *state_rootfs(void) {
    static const char *const bundle_key[] = {"bundle"}, *const path_keys[] = {"root", "path"};
    static char bundle[PATH_MAX], path[PATH_MAX], conf[PATH_MAX + 16], rootfs[2 * PATH_MAX + 2];
    read_state();
    if (!json_find(state, state + state_len, bundle_key, 1, bundle, sizeof bundle) || bundle[0] != '/')
        return skip("the OCI state on stdin names no bundle", 0), NULL;
    snprintf(conf, sizeof conf, "%s/config.json", bundle);
    int fd = open(conf, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        int err = fd < 0 ? errno : EINVAL;
        if (fd >= 0)
            close(fd);
        return skip(conf, err), NULL;
    }
    /* mapped, not read: no bound on its size (the runtime manager wrote it whole, before the create) */
    char *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return skip(conf, errno), NULL;
    int found = json_find(map, map + st.st_size, path_keys, 2, path, sizeof path);
    munmap(map, (size_t)st.st_size);
    if (!found || !path[0])
        return skip("the bundle's config.json names no root path", 0), NULL;
    if (path[0] == '/')
        snprintf(rootfs, sizeof rootfs, "%s", path);
    else
        snprintf(rootfs, sizeof rootfs, "%s/%s", bundle, path);
    return rootfs;
}

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape(char *s) {
    char *o = s;
    while (*s) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
            *o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 4;
        } else {
            *o++ = *s++;
        }
    }
    *o = 0;
}

static int under(const char *path, const char *root, size_t rlen) {
    return strncmp(path, root, rlen) == 0 && (path[rlen] == 0 || path[rlen] == '/');
}

/* Detach the procfs mounts under root (detach = 1), or count them (detach = 0); *is_mount
 * says whether root itself is a mount point.  -1 with errno when mountinfo cannot be read. */
/* The per-mount flags of a mountinfo options field ("rw,nosuid,nodev,relatime"), for a remount
 * that keeps them and adds MS_RDONLY. */
static unsigned long mount_flags(char *opts) {
    unsigned long flags = 0;
    char *save = NULL;
    for (char *o = strtok_r(opts, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
        if (strcmp(o, "nosuid") == 0) flags |= MS_NOSUID;
        else if (strcmp(o, "nodev") == 0) flags |= MS_NODEV;
        else if (strcmp(o, "noexec") == 0) flags |= MS_NOEXEC;
        else if (strcmp(o, "noatime") == 0) flags |= MS_NOATIME;
        else if (strcmp(o, "nodiratime") == 0) flags |= MS_NODIRATIME;
        else if (strcmp(o, "relatime") == 0) flags |= MS_RELATIME;
        else if (strcmp(o, "strictatime") == 0) flags |= MS_STRICTATIME;
    }
    return flags;
}

enum { COUNT, DETACH, READ_ONLY };

/* COUNT or DETACH the procfs mounts under root; or make every other mount under root
 * READ_ONLY (in our namespace), but root itself and `writable`: what the hook writes is the
 * rootfs's own (its cache, its links), never a volume, a host bind mount or gpuhook's MPS
 * directory that happen to be mounted in the container.  *is_mount says whether root itself
 * is a mount point.  -1 with errno when mountinfo cannot be read or a remount fails. */
static int proc_mounts(const char *root, int mode, int *is_mount, const char *writable) {
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -1;
    size_t rlen = strlen(root), cap = 0;
    char *line = NULL;
    int n = 0;
    *is_mount = 0;
    while (getline(&line, &cap, f) > 0) {
        /* id parent maj:min root MOUNTPOINT options [optional...] - FSTYPE source superopts */
        char *save = NULL, *mp = NULL, *opts = NULL, *tok;
        int field = 0, dash = 0;
        for (tok = strtok_r(line, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save), field++) {
            if (field == 4) {
                mp = tok;
                unescape(mp);
                if (strcmp(mp, root) == 0)
                    *is_mount = 1;
            } else if (field == 5) {
                opts = tok;
            } else if (dash) {
                int proc = strcmp(tok, "proc") == 0;
                if (mp && proc && under(mp, root, rlen)) {
                    n++;
                    if (mode == DETACH)
                        umount2(mp, MNT_DETACH | UMOUNT_NOFOLLOW);  /* EINVAL: gone with its parent */
                } else if (mode == READ_ONLY && mp && opts && !proc && under(mp, root, rlen) && strcmp(mp, root) != 0 &&
                           !(writable && strcmp(mp, writable) == 0) && strncmp(opts, "ro", 2) != 0) {
                    if (mount(NULL, mp, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | mount_flags(opts), NULL) < 0 &&
                        errno != ENOENT && errno != EINVAL) {  /* hidden under another mount: unreachable */
                        n = -1;
                        break;
                    }
                }
                break;
            } else if (field > 5 && strcmp(tok, "-") == 0)
                dash = 1;
        }
    }
    free(line);
    fclose(f);
    return n;
}

/* No PT_INTERP among the program headers of an ELF of one class (Ehdr/Phdr its types). */
#define NO_INTERP(Ehdr, Phdr)                                                                        \
    do {                                                                                             \
        Ehdr eh;                                                                                     \
        if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh || eh.e_phentsize != sizeof(Phdr) ||  \
            eh.e_phnum == 0)                                                                         \
            return 0;                                                                                \
        for (unsigned i = 0; i < eh.e_phnum; i++) {                                                  \
            Phdr ph;                                                                                 \
            if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (off_t)i * (off_t)sizeof ph)) !=      \
                (ssize_t)sizeof ph)                                                                  \
                return 0;                                                                            \
            if (ph.p_type == PT_INTERP)                                                              \
                return 0;                                                                            \
        }                                                                                            \
        return 1;                                                                                    \
    } while (0)

/* A static ELF executable: no PT_INTERP (a dynamic one would load the image's loader and libc
 * after the pivot), and no script (its interpreter would be the image's). */
static int static_elf(int fd) {
    unsigned char ident[EI_NIDENT];
    if (pread(fd, ident, sizeof ident, 0) != (ssize_t)sizeof ident || memcmp(ident, ELFMAG, SELFMAG) != 0)
        return 0;
    if (ident[EI_CLASS] == ELFCLASS64)
        NO_INTERP(Elf64_Ehdr, Elf64_Phdr);
    if (ident[EI_CLASS] == ELFCLASS32)
        NO_INTERP(Elf32_Ehdr, Elf32_Phdr);
    return 0;
}

/* Keep only what file work needs: reading and writing the image's files, whoever owns them.
 * Not CAP_DAC_READ_SEARCH: with it, open_by_handle_at() opens any inode of a file system by
 * its handle, the host's files too where the rootfs shares their file system (DAC_OVERRIDE
 * reads and searches as well).  Not CAP_SYS_ADMIN (mount), SYS_CHROOT, SYS_PTRACE... */
static int drop_caps(void) {
    const int keep[] = {CAP_DAC_OVERRIDE, CAP_FOWNER};
    unsigned long long mask = 0;
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        mask |= 1ULL << keep[i];
    for (int c = 0; c <= 63; c++) {
        if (mask & (1ULL << c))
            continue;
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno == EINVAL)
            break;  /* past the kernel's last capability */
    }
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capget, &hdr, data) < 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        unsigned m = (unsigned)(mask >> (32 * i));
        data[i].effective &= m;
        data[i].permitted &= m;
        data[i].inheritable = 0;
    }
    if (syscall(SYS_capset, &hdr, data) < 0)
        return -1;
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

/* Steps 2-5: after this, / is the rootfs, with no procfs and no way back to the host. */
static int isolate(const char *rootfs, const char *writable_sub) {
    /* mountinfo names mount points by their real path: the path to the rootfs is the host's
     * (the bundle's), so resolving it follows nothing of the image. */
    char root[PATH_MAX];
    int is_mount;
    if (!realpath(rootfs, root))
        return skip(rootfs, errno), -1;
    if (strcmp(root, "/") == 0)
        return skip("the container root is the host's /", 0), -1;
#ifdef GPUHOOK_TEST_WITHOUT_ISOLATION
    /* Never in a build that ships: tests/hardening/test_hook_isolation.py builds this to show that its
     * hostile images do reach the host through a chroot alone (what `ldconfig -r` does). */
    if (chroot(root) < 0 || chdir("/") < 0)
        return skip("chroot", errno), -1;
    return 0;
#endif
    if (unshare(CLONE_NEWNS) < 0)
        return skip("a mount namespace of its own", errno), -1;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return skip("making the mounts private", errno), -1;
    if (proc_mounts(root, DETACH, &is_mount, NULL) < 0)
        return skip("reading /proc/self/mountinfo", errno), -1;
    int left = proc_mounts(root, COUNT, &is_mount, NULL);
    if (left < 0)
        return skip("reading /proc/self/mountinfo", errno), -1;
    if (left > 0)
        return skip("a procfs mount in the container root could not be detached", 0), -1;
    char writable[PATH_MAX + 16];
    if (writable_sub)
        snprintf(writable, sizeof writable, "%s%s", root, writable_sub);
    if (proc_mounts(root, READ_ONLY, &is_mount, writable_sub ? writable : NULL) < 0)
        return skip("making the container's other mounts read-only", errno), -1;
    /* pivot_root wants a mount point; runc makes the rootfs one, a bare directory is bound
     * on itself here (after the detach: the copy has no procfs either) */
    if (!is_mount && mount(root, root, NULL, MS_BIND | MS_REC, NULL) < 0)
        return skip("binding the container root", errno), -1;
    if (chdir(root) < 0)
        return skip("entering the container root", errno), -1;
    if (syscall(SYS_pivot_root, ".", ".") < 0)
        return skip("pivot_root", errno), -1;
    if (umount2(".", MNT_DETACH) < 0)
        return skip("detaching the host's root", errno), -1;
    if (chdir("/") < 0)
        return skip("chdir /", errno), -1;
    if (drop_caps() < 0)
        return skip("dropping capabilities", errno), -1;
    if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) < 0) {
        for (int fd = 3; fd < 4096; fd++)
            fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    return 0;
}

extern char **environ;

#if defined(__x86_64__)
#define SYNC_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SYNC_ARCH AUDIT_ARCH_AARCH64
#endif

/* Step 6's filter: fsync and fdatasync return 0 and do nothing; every other call (and any
 * call of another ABI) goes through.  Needs no_new_privs (drop_caps).  A kernel without
 * seccomp, or an architecture not named above: ldconfig syncs, as it always did. */
static void no_sync(void) {
#ifdef SYNC_ARCH
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYNC_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fsync, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fdatasync, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 0),  /* errno 0: the call returns 0 */
    };
    struct sock_fprog prog = {(unsigned short)(sizeof code / sizeof code[0]), code};
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
#endif
}

static volatile sig_atomic_t alarmed;
static void on_alarm(int sig) {
    (void)sig;
    alarmed = 1;
}

static int ldcache(int argc, char **argv) {
    /* argv: ROOTFS LDCONFIG DIR... */
    const char *rootfs = argv[0], *ldconfig = argv[1];
    int fd = open(ldconfig, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return skip(ldconfig, errno);
    if (!static_elf(fd))
        return skip("the node's ldconfig is not a static ELF executable (it would load the image's libraries)", 0);
    if (isolate(rootfs, NULL) < 0)
        return 0;
    /* ldconfig [-v] DIR...: over /, which is now the container's root. */
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args)
        return skip("out of memory", ENOMEM);
    args[0] = "ldconfig";
    for (int i = 2; i < argc; i++)
        args[i - 1] = argv[i];
    pid_t parent = getpid(), pid = fork();
    if (pid < 0)
        return skip("fork", errno);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);  /* whatever kills us, ldconfig goes too */
        if (getppid() != parent)           /* ... and it died before the prctl */
            _exit(1);
        no_sync();
        syscall(SYS_execveat, fd, "", args, environ, AT_EMPTY_PATH);
        fprintf(stderr, "gpuhook: %s: exec %s: %s\n", what, ldconfig, strerror(errno));
        _exit(127);
    }
    /* Our own deadline, before runc's hook timeout (hook.TIMEOUT): a slow ldconfig (a huge or
     * hostile ld.so.conf, a cold disk) is given up on, and the container starts. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;  /* no SA_RESTART: waitpid returns EINTR */
    sigaction(SIGALRM, &sa, NULL);
    alarm(LDCONFIG_DEADLINE);
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            return skip("waitpid", errno);
        if (alarmed) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            return say("timeout", "ldconfig in %s took over %d s: stopped; driver libraries need LD_LIBRARY_PATH",
                       rootfs, LDCONFIG_DEADLINE);
        }
    }
    alarm(0);
    if (WIFSIGNALED(status))
        return say("failed", "ldconfig in %s failed (signal %d); driver libraries need LD_LIBRARY_PATH", rootfs,
                   WTERMSIG(status));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return say("failed", "ldconfig in %s failed (exit status %d); driver libraries need LD_LIBRARY_PATH", rootfs,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}

/* A by-path link name (pci-0000:03:00.0-card) or target (../card1, ../renderD128): one
 * path component of the characters sysfs gives, never "." or "..". */
static int good_name(const char *s, int target) {
    if (target) {
        if (strncmp(s, "../", 3) != 0)
            return 0;
        s += 3;
    }
    if (!*s || strcmp(s, ".") == 0 || strcmp(s, "..") == 0 || strlen(s) > 200)
        return 0;
    for (; *s; s++)
        if (!(*s >= 'a' && *s <= 'z') && !(*s >= 'A' && *s <= 'Z') && !(*s >= '0' && *s <= '9') && !strchr(":.-_", *s))
            return 0;
    return 1;
}

static int opendir_at(int dirfd, const char *name) {
    return openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

static int bypath(int argc, char **argv) {
    /* argv: ROOTFS NAME TARGET [NAME TARGET]... */
    if (argc % 2 == 0)
        return say("refused", "bypath takes NAME TARGET pairs; skipped");
    for (int i = 1; i < argc; i += 2)
        if (!good_name(argv[i], 0) || !good_name(argv[i + 1], 1))
            return say("refused", "bad by-path link %.200s -> %.200s; skipped", argv[i], argv[i + 1]);
    if (isolate(argv[0], "/dev") < 0)  /* the links go in the container's /dev (runc's tmpfs) */
        return 0;
    int dev = opendir_at(AT_FDCWD, "/dev");
    if (dev < 0)
        return skip("/dev is not a directory; /dev/dri/by-path links not made", errno);
    int dri = opendir_at(dev, "dri");
    if (dri < 0)
        return skip("/dev/dri is not a directory; /dev/dri/by-path links not made", errno);
    if (mkdirat(dri, "by-path", 0755) < 0 && errno != EEXIST)
        return skip("mkdir /dev/dri/by-path", errno);
    int bp = opendir_at(dri, "by-path");
    if (bp < 0)
        return skip("/dev/dri/by-path is not a directory; links not made", errno);
    for (int i = 1; i < argc; i += 2) {
        struct stat st;
        if (fstatat(bp, argv[i], &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISLNK(st.st_mode))
            continue;  /* something else is there: leave it */
        char tmp[256];
        snprintf(tmp, sizeof tmp, ".%s.gpuhook-%d", argv[i], (int)getpid());
        unlinkat(bp, tmp, 0);
        if (symlinkat(argv[i + 1], bp, tmp) < 0 || renameat(bp, tmp, bp, argv[i]) < 0) {
            skip(argv[i], errno);
            unlinkat(bp, tmp, 0);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    open_log();  /* first: before anything of the image is looked at */
    if (argc >= 2) {
        what = strcmp(argv[1], KIND_LDCACHE) == 0 ? "gpuhook-" KIND_LDCACHE : "gpuhook-" KIND_BYPATH;
        kind = strcmp(argv[1], KIND_LDCACHE) == 0 ? KIND_LDCACHE : strcmp(argv[1], KIND_BYPATH) == 0 ? KIND_BYPATH : NULL;
    }
    if (argc >= 3 && kind && strcmp(argv[2], ROOTFS_FROM_STATE) == 0 && !(argv[2] = (char *)state_rootfs()))
        return 0;
    if (argc >= 5 && strcmp(argv[1], KIND_LDCACHE) == 0 && argv[2][0] == '/')
        return ldcache(argc - 2, argv + 2);
    if (argc >= 3 && strcmp(argv[1], KIND_BYPATH) == 0 && argv[2][0] == '/')
        return bypath(argc - 2, argv + 2);
    /* a hook of gpuhook's own that is wrong: said, and the container starts all the same */
    what = "gpuhook-hook";
    return say("refused", "usage: gpuhook-hook " KIND_LDCACHE " /ROOTFS|" ROOTFS_FROM_STATE " /LDCONFIG DIR... | "
               KIND_BYPATH " /ROOTFS|" ROOTFS_FROM_STATE " NAME TARGET...; skipped");
}
