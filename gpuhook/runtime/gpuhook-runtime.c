/*
 * gpuhook-runtime: an OCI runtime with runc's command line (containerd's runc shim calls it
 * through options.BinaryName, CRI-O through runtime_path, dockerd through `runtimes`).
 *
 * This small static front is the fast path. Every subcommand but create/run execs the real
 * runtime at once, and so does create/run on a node with no sign of a GPU at all (after one
 * log line). Python (gpuhook/runtime/__init__.py) starts only when there may be something to
 * inject, for an exec into a container gpuhook injected (its exec record is there: one file
 * check for the others), or when there is no current front file of the node config (this
 * front parses no TOML: each Python run leaves what it decided for it, config.front_text;
 * Python, with tomllib, decides everything until then). A delete of an injected container runs the
 * runtime, then removes the record.
 *
 * It replaced a POSIX sh front that did the same in ~1.5 ms more per call (dash's start, the
 * script's parse, a fork to resolve its own directory).
 *
 * Each list and default here is Python's too, and tests/unit/test_front.py holds them equal
 * (the arrays are parsed from this file): GLOBAL_VALUE_FLAGS, CREATE_VALUE_FLAGS and
 * EXEC_VALUE_FLAGS (gpuhook.runtime), SIGNS (gpuhook.probe.SIGNS), the defaults
 * (gpuhook.defaults), the exec record's key (gpuhook.runtime.execenv.record_path), the bundle's
 * loader and interpreter (gpuhook.install.build) and the interpreter's start (STARTUP).
 * Built static (gpuhook/hook/build.sh OUTPUT SOURCE): it runs on any node, whatever its libc.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* runc's and crun's global flags that take a value (Go's flag package: one dash or two) */
static const char *const GLOBAL_VALUE_FLAGS[] = {"root", "log", "log-format", "criu", "rootless", "cgroup-manager", NULL};
/* create/run flags that take a value */
static const char *const CREATE_VALUE_FLAGS[] = {"bundle", "b", "console-socket", "pid-file", "preserve-fds",
                                                 "pidfd-socket", NULL};
/* exec flags that take a value */
static const char *const EXEC_VALUE_FLAGS[] = {"console-socket", "pidfd-socket", "cwd", "env", "e", "user", "u",
                                               "additional-gids", "g", "process", "p", "apparmor", "process-label",
                                               "pid-file", "cap", "c", "preserve-fds", "cgroup", NULL};
static const char *const NO_FLAGS[] = {NULL};
/* where a GPU can show up, each once; a trailing "*" or "[0-9]*" matches names in that directory */
static const char *const SIGNS[] = {"/dev/nvidiactl", "/dev/nvidia[0-9]*", "/proc/driver/nvidia/gpus/*", "/dev/kfd",
                                    "/sys/class/kfd/kfd/topology/nodes", "/dev/dri/renderD*", "/sys/class/drm/renderD*",
                                    "/dev/accel/accel*", "/sys/class/accel/accel*", "/dev/dxg", NULL};

#define CONFIG_FILE "/etc/gpuhook/config.toml"
#define LOG_FILE "/var/log/gpuhook.log"
#define CACHE_DIR "/run/gpuhook"
#define RECORD_DIR "exec"
#define LOADER "libexec/ld.so"
#define INTERPRETER "libexec/python3"
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
/* the interpreter's start: the site-packages dir is argv[1], the runtime's argv follows */
#define STARTUP "import sys; sys.path.insert(0, sys.argv.pop(1)); import gpuhook.startup" /* defaults.RUNTIME_MAIN */
/* the front file Python leaves beside its config cache (config.front_text) */
#define FRONT_MAGIC "gpuhook-front 1"
#define MAX_FRONT (16 << 10) /* config.MAX_FRONT_BYTES */
/* the resident server (gpuhook/runtime/server.py): its socket in the cache dir, its wire */
#define SOCKET_NAME "runtime.sock"
#define SERVER_MAGIC "gpuhook-runtime 3"
#define MAX_REPLY (1 << 20)
#define MAX_REPLY_FIELDS 4096
#define MAX_REPLY_TEXT (64 << 10) /* the stderr text of an answer */
#define MAX_REPLY_LOG_LINE (256 << 10) /* its log line (Python bounds what a pod can put there) */
#define SERVER_TIMEOUT_S 3 /* then Python starts here, as with no server: a wedged server costs a create 3 s */
/* runc's container id characters (execenv.ID_CHARS); the log line's safe characters */
#define ID_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+,.-"
#define LOG_SAFE_CHARS ID_CHARS ":/@="

/* the node config, as Python decided it (the front file), or the defaults where there is none */
struct config {
    const char *path;
    char *runtime, *host_root, *log_file, *fail_mode;
    int errors; /* the file has errors: creates go to Python, whose log line says why */
    int slow;   /* no current front file of gpuhook's own: Python decides everything */
};

/* what the command line says (gpuhook.runtime.parse_args, the same rules) */
struct invocation {
    const char *command, *root, *container_id;
    char *bundle; /* create/run: absolute, the current directory when not given */
};

extern char **environ;

static char *xstrdup(const char *s) {
    char *p = strdup(s);
    if (!p) _exit(127);
    return p;
}

static char *join(const char *first, ...) {
    va_list ap;
    size_t n = 0;
    va_start(ap, first);
    for (const char *s = first; s; s = va_arg(ap, const char *)) n += strlen(s);
    va_end(ap);
    char *out = malloc(n + 1), *p = out;
    if (!out) _exit(127);
    va_start(ap, first);
    for (const char *s = first; s; s = va_arg(ap, const char *)) p = stpcpy(p, s);
    va_end(ap);
    return out;
}

static int one_of(const char *word, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(word, *list)) return 1;
    return 0;
}

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_executable(const char *path) { return access(path, X_OK) == 0 && !is_dir(path); }

static char *cwd(void) {
    char *p = getcwd(NULL, 0);
    return p ? p : xstrdup("/");
}

/* flag_name: a flag's name without its dashes, and its "=value" when it has one */
static const char *flag_name(const char *arg, char *buf, size_t size, const char **value) {
    while (*arg == '-') arg++;
    const char *eq = strchr(arg, '=');
    *value = eq ? eq + 1 : NULL;
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    if (n >= size) n = size - 1; /* no flag is that long: it matches none */
    memcpy(buf, arg, n);
    buf[n] = 0;
    return buf;
}

static int is_flag(const char *arg) { return arg[0] == '-' && arg[1]; }

/* parse_args: the subcommand and the global --root; create/run's bundle and container id,
 * exec's and delete's container id. A flag's value is never taken for the subcommand. */
static void parse_args(int argc, char **argv, struct invocation *inv) {
    char name[64];
    const char *value;
    int i = 1;
    while (i < argc) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--")) {
            i++;
            break;
        }
        if (!is_flag(arg)) break;
        flag_name(arg, name, sizeof name, &value);
        if (one_of(name, GLOBAL_VALUE_FLAGS) && !value) value = ++i < argc ? argv[i] : NULL;
        if (!strcmp(name, "root")) inv->root = value;
        i++;
    }
    if (i >= argc) return;
    inv->command = argv[i++];
    int editing = !strcmp(inv->command, "create") || !strcmp(inv->command, "run");
    int exec = !strcmp(inv->command, "exec");
    const char *const *flags = editing                            ? CREATE_VALUE_FLAGS
                               : exec                             ? EXEC_VALUE_FLAGS
                               : !strcmp(inv->command, "delete") ? NO_FLAGS
                                                                  : NULL;
    if (!flags) return;
    const char *bundle = NULL;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--")) {
            if (i + 1 < argc && !inv->container_id) inv->container_id = argv[i + 1];
            break;
        }
        if (!is_flag(arg)) {
            if (!inv->container_id) inv->container_id = arg;
            if (exec) break; /* the process's own argv follows: never read as flags */
            continue;
        }
        flag_name(arg, name, sizeof name, &value);
        if (one_of(name, flags) && !value) value = ++i < argc ? argv[i] : NULL;
        if (editing && (!strcmp(name, "bundle") || !strcmp(name, "b"))) bundle = value;
    }
    if (editing) {
        if (!bundle || !*bundle) inv->bundle = cwd();
        else if (bundle[0] != '/') {
            char *dir = cwd();
            inv->bundle = join(dir, dir[1] ? "/" : "", bundle, NULL); /* as os.path.join: "/b" under / */
        }
        else inv->bundle = xstrdup(bundle);
    }
}

/* find_runtime: the real runtime, a path or a name on PATH (NULL: not found) */
static char *find_runtime(const char *name) {
    if (strchr(name, '/')) return is_executable(name) ? xstrdup(name) : NULL;
    const char *path = getenv("PATH");
    char *dirs = xstrdup(path && *path ? path : DEFAULT_PATH);
    for (char *d = dirs, *next; d; d = next) {
        next = strchr(d, ':');
        if (next) *next++ = 0;
        char *p = join(*d ? d : ".", "/", name, NULL);
        if (is_executable(p)) return p;
        free(p);
    }
    return NULL;
}

/* pwd: the current directory as Python's execenv._pwd names it ($PWD when it is this one) */
static char *pwd(void) {
    const char *p = getenv("PWD");
    struct stat a, b;
    if (p && p[0] == '/' && stat(p, &a) == 0 && stat(".", &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return xstrdup(p);
    return cwd();
}

/* runtime_root: --root (relative to the current directory), or /run/<runtime's name> */
static char *runtime_root(const char *root, const char *rt) {
    if (!root || !*root) {
        const char *base = strrchr(rt, '/');
        return join("/run/", base ? base + 1 : rt, NULL);
    }
    return root[0] == '/' ? xstrdup(root) : join(pwd(), "/", root, NULL);
}

/* is_clean_abspath: absolute, no "", "." or ".." component (so no "//", no trailing "/"), not "/" */
static int is_clean_abspath(const char *p) {
    if (p[0] != '/' || !p[1]) return 0;
    for (const char *c = p + 1;;) {
        size_t n = strcspn(c, "/");
        if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) return 0;
        if (!c[n]) return 1;
        c += n + 1;
    }
}

static const char *cache_dir(void) {
    const char *env = getenv("GPUHOOK_CACHE_DIR");
    return env && *env ? env : CACHE_DIR;
}

/* open_checked: `name` under the directory `dir` (AT_FDCWD: a path), never through a link at
 * it, and only when it is plainly gpuhook's own: a directory (want_dir) or a regular file, of
 * this user, not writable by group or others. -1 otherwise. */
static int open_checked(int dir, const char *name, int want_dir) {
    int fd = openat(dir, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (want_dir ? O_DIRECTORY : 0));
    struct stat st;
    if (fd < 0) return -1;
    if (fstat(fd, &st) || st.st_uid != geteuid() || (st.st_mode & 022) ||
        (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* escape: "%" as "%25" and "/" as "%2F", one file name for a path */
static char *escape(const char *path) {
    char *out = malloc(strlen(path) * 3 + 1), *o = out;
    if (!out) _exit(127);
    for (const char *p = path; *p; p++) o = *p == '/' ? stpcpy(o, "%2F") : *p == '%' ? stpcpy(o, "%25") : (*o++ = *p, o);
    *o = 0;
    return out;
}

/* read_config: no config file means the defaults (Python's too). Otherwise the front file
 * (<cache dir>/config-<path escaped>.front, config.front_file) says what Python decided; it is
 * used only when it names this file's identity as it is now (dev, inode, size, mtime, ctime:
 * one stat) and is gpuhook's own. Anything else: slow, Python decides. */
static void read_config(struct config *c) {
    static char text[MAX_FRONT + 1]; /* the values point into it: they live as long as the process */
    const char *env = getenv("GPUHOOK_CONFIG");
    c->path = env && *env ? env : CONFIG_FILE;
    struct stat st;
    if (stat(c->path, &st)) {
        if (errno != ENOENT) c->slow = 1; /* there but not to be read: Python says why */
        return;
    }
    c->slow = 1;
    if (!S_ISREG(st.st_mode) || !is_clean_abspath(c->path)) return;
    char *name = escape(c->path), *file = join("config-", name, ".front", NULL);
    int dir = open_checked(AT_FDCWD, cache_dir(), 1), fd = dir < 0 ? -1 : open_checked(dir, file, 0);
    free(name);
    free(file);
    if (dir >= 0) close(dir);
    if (fd < 0) return;
    size_t len = 0;
    for (ssize_t r; len <= MAX_FRONT && (r = read(fd, text + len, MAX_FRONT + 1 - len)) != 0;) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) len = MAX_FRONT + 1;
        else len += (size_t)r;
    }
    close(fd);
    if (!len || len > MAX_FRONT || text[len - 1] || strcmp(text, FRONT_MAGIC)) return;
    char want[128];
    snprintf(want, sizeof want, "%llu:%llu:%lld:%lld:%lld", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino, (long long)st.st_size,
             (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
             (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec);
    struct config got = {.path = c->path};
    char *identity = NULL, *errors = NULL;
    for (char *f = text + strlen(text) + 1, *next; f < text + len; f = next) {
        next = f + strlen(f) + 1;
        char *v = strchr(f, '=');
        if (!v) return;
        *v++ = 0;
        char **slot = !strcmp(f, "config")      ? &identity
                      : !strcmp(f, "errors")    ? &errors
                      /* config.FRONT_KEYS: */
                      : !strcmp(f, "runtime")   ? &got.runtime
                      : !strcmp(f, "host_root") ? &got.host_root
                      : !strcmp(f, "log_file")  ? &got.log_file
                      : !strcmp(f, "fail_mode") ? &got.fail_mode
                                                : NULL;
        if (slot && *slot) return; /* twice: not Python's */
        if (slot) *slot = v;
    }
    if (!identity || strcmp(identity, want) || !errors || !got.runtime || !got.host_root || !got.log_file ||
        !got.fail_mode)
        return; /* another file's (changed since), or not whole */
    got.errors = strcmp(errors, "0") != 0;
    *c = got;
}

/* record_dir: the directory of the container's exec record (execenv.record_path: the env
 * gpuhook added at create), <cache dir>/exec/<runtime root, "/" as "%2F">, each level opened
 * without following a link and checked (open_checked, execenv._open_level); -1 when the key is
 * not a clean one or a level is not gpuhook's own. The record itself is the id in it. */
static int record_dir(const char *rroot, const char *id) {
    if (!is_clean_abspath(rroot) || strchr(rroot, '%')) return -1;
    if (!id || !*id || !strcmp(id, ".") || !strcmp(id, "..") || id[strspn(id, ID_CHARS)]) return -1;
    char *key = escape(rroot);
    int cache = open_checked(AT_FDCWD, cache_dir(), 1);
    int exec_dir = cache < 0 ? -1 : open_checked(cache, RECORD_DIR, 1);
    int dir = exec_dir < 0 ? -1 : open_checked(exec_dir, key, 1);
    if (cache >= 0) close(cache);
    if (exec_dir >= 0) close(exec_dir);
    free(key);
    return dir;
}

/* gpu_present: is there any sign of a GPU under the host root (gpuhook.probe.SIGNS)? */
static int gpu_present(const char *host_root) {
    size_t n = strlen(host_root);
    char *root = xstrdup(host_root);
    while (n && root[n - 1] == '/') root[--n] = 0;
    for (const char *const *s = SIGNS; *s; s++) {
        const char *sign = *s;
        size_t len = strlen(sign);
        if (sign[len - 1] != '*') {
            char *p = join(root, sign, NULL);
            int there = exists(p);
            free(p);
            if (there) return 1;
            continue;
        }
        const char *slash = strrchr(sign, '/');
        char *parent = join(root, "", NULL);
        parent = realloc(parent, n + (size_t)(slash - sign) + 1);
        if (!parent) _exit(127);
        memcpy(parent + n, sign, (size_t)(slash - sign));
        parent[n + (size_t)(slash - sign)] = 0;
        int digit = len > 6 && !strcmp(sign + len - 6, "[0-9]*");
        size_t plen = len - (size_t)(slash + 1 - sign) - (digit ? 6 : 1);
        DIR *d = opendir(parent);
        free(parent);
        if (!d) continue;
        for (struct dirent *e; (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            if (!strncmp(e->d_name, slash + 1, plen) && (!digit || (e->d_name[plen] >= '0' && e->d_name[plen] <= '9'))) {
                closedir(d);
                return 1;
            }
        }
        closedir(d);
    }
    return 0;
}

/* append_log: one whole line, one write with O_APPEND as Python's runtime.append_line; never
 * through a link, never blocking on a FIFO; a new file is 0640 */
static void append_log(const char *file, const char *line, size_t n) {
    int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0640);
    if (fd >= 0) {
        if (write(fd, line, n) < 0) { /* a full disk: the container starts all the same */
        }
        close(fd);
    }
}

/* log_no_gpu: the create's log line (decision no-gpu) */
static void log_no_gpu(const struct config *c, const struct invocation *inv) {
    const char *file = c->log_file ? c->log_file : LOG_FILE;
    if (!*file) return;
    const char *id = inv->container_id ? inv->container_id : "", *bundle = inv->bundle, *q = "\"";
    if (id[strspn(id, LOG_SAFE_CHARS)] || bundle[strspn(bundle, LOG_SAFE_CHARS)]) id = bundle = "?";
    else if (!inv->container_id) id = "null", q = ""; /* no id: null, as Python's line has it */
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    char *line;
    int n = asprintf(&line,
                     "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"event\":\"create\",\"container_id\":%s%s%s,"
                     "\"bundle\":\"%s\",\"decision\":\"no-gpu\",\"vendors\":[],\"nodes\":[],\"mounts\":[],\"hooks\":0}\n",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     now.tv_nsec / 1000000, q, id, q, bundle);
    if (n < 0) return;
    append_log(file, line, (size_t)n);
    free(line);
}

static void exec_runtime(const char *rt, char **argv) {
    argv[0] = (char *)rt;
    execv(rt, argv);
    fprintf(stderr, "gpuhook-runtime: cannot run the real OCI runtime %s: %s\n", rt, strerror(errno));
    _exit(127);
}

/* here: the directory this binary is in, every link resolved (/opt/gpuhook/bin is a link
 * into the version now installed, and every path below must be in that one version,
 * whatever an upgrade switches meanwhile: gpuhook/install/files.py, VERSIONS) */
static char *here(const char *argv0) {
    char *exe = realpath("/proc/self/exe", NULL);
    if (!exe) exe = realpath(argv0, NULL);
    if (!exe) return xstrdup(".");
    char *slash = strrchr(exe, '/');
    if (slash == exe) slash[1] = 0;
    else *slash = 0;
    return exe;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }
static int python_dir(const struct dirent *e) { return !strncmp(e->d_name, "python3", 7); }

/* site_packages: <here>/../lib/python3.../<kind> holding gpuhook, the first in name order */
static char *site_packages(const char *dir, const char *kind) {
    char *lib = join(dir, "/../lib", NULL);
    struct dirent **names;
    int n = scandir(lib, &names, python_dir, by_name);
    char *found = NULL;
    for (int i = 0; i < n; i++) {
        char *sp = join(lib, "/", names[i]->d_name, "/", kind, NULL);
        char *pkg = join(sp, "/gpuhook", NULL);
        if (!found && is_dir(pkg)) found = sp;
        else free(sp);
        free(pkg);
        free(names[i]);
    }
    if (n >= 0) free(names);
    free(lib);
    return found;
}

/* a growing buffer of NUL-terminated fields (the server's wire) */
struct fields {
    char *data;
    size_t len, cap;
};

static void add_field(struct fields *f, const char *s) {
    size_t n = strlen(s) + 1;
    if (f->len + n > f->cap) {
        f->cap = (f->len + n) * 2;
        if (!(f->data = realloc(f->data, f->cap))) _exit(127);
    }
    memcpy(f->data + f->len, s, n);
    f->len += n;
}

static void add_number(struct fields *f, long n) {
    char buf[24];
    snprintf(buf, sizeof buf, "%ld", n);
    add_field(f, buf);
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* wait_for: fd ready for `events` before the deadline (CLOCK_MONOTONIC ns)? */
static int wait_for(int fd, short events, long long deadline) {
    for (;;) {
        long long left = deadline - now_ns();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)((left + 999999) / 1000000));
        if (n > 0) return 1;
        if (n < 0 && errno != EINTR) return 0;
    }
}

static void act_on_reply(char **fields, int k);

/* ask_server: a create, run or exec through the node's resident server (server.py): it runs
 * what Python would, then this process execs the argv it answers (or exits as it says).
 * Returns when there is no answer to act on (no server, another version, a timeout, any
 * doubt): the caller starts Python, as on a node without a server. */
static void ask_server(int argc, char **argv) {
    const char *cache = cache_dir();
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t n = strlen(cache);
    if (n + sizeof("/" SOCKET_NAME) > sizeof addr.sun_path) return;
    memcpy(addr.sun_path, cache, n);
    memcpy(addr.sun_path + n, "/" SOCKET_NAME, sizeof("/" SOCKET_NAME));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return;
    long long deadline = now_ns() + SERVER_TIMEOUT_S * 1000000000LL; /* for all of it, not per read */
    struct ucred cred;
    socklen_t len = sizeof cred;
    if ((connect(fd, (struct sockaddr *)&addr, sizeof addr) && !(errno == EINPROGRESS && wait_for(fd, POLLOUT, deadline))) ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) || (cred.uid != 0 && cred.uid != geteuid())) {
        close(fd);
        return;
    }
    struct fields req = {0};
    char buf[64];
    add_field(&req, SERVER_MAGIC); /* who this is, the server asks the kernel (SO_PEERPIDFD) */
    mode_t mask = umask(0);
    umask(mask);
    add_number(&req, (long)mask);
    snprintf(buf, sizeof buf, "%lld", deadline);
    add_field(&req, buf); /* past it the server does nothing: this front has started Python */
    char *here_cwd = cwd();
    add_field(&req, here_cwd);
    long n_env = 0;
    for (char **e = environ; *e; e++) n_env++;
    add_number(&req, n_env);
    for (char **e = environ; *e; e++) add_field(&req, *e);
    add_number(&req, argc - 1);
    for (int i = 1; i < argc; i++) add_field(&req, argv[i]);
    for (size_t off = 0; off < req.len;) {
        ssize_t w = send(fd, req.data + off, req.len - off, MSG_NOSIGNAL); /* a closed socket: no SIGPIPE */
        if (w < 0 && (errno == EINTR || ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_for(fd, POLLOUT, deadline))))
            continue;
        if (w <= 0) {
            close(fd);
            return;
        }
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    char *reply = malloc(MAX_REPLY + 1);
    size_t got = 0;
    if (!reply) _exit(127);
    for (;;) {
        ssize_t r = read(fd, reply + got, MAX_REPLY - got);
        if (r < 0 && (errno == EINTR || ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_for(fd, POLLIN, deadline))))
            continue;
        if (r < 0 || (r > 0 && got + (size_t)r >= MAX_REPLY)) { /* the deadline passed, or too big to trust */
            close(fd);
            return;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!got || reply[got - 1]) return; /* not whole */
    char *fields[MAX_REPLY_FIELDS + 1];
    int k = 0;
    for (char *p = reply; p < reply + got; p += strlen(p) + 1) {
        if (k == MAX_REPLY_FIELDS) return;
        fields[k++] = p;
    }
    fields[k] = NULL;
    act_on_reply(fields, k);
}

/* reply_status: an exit status as the server writes it ("0" to "255", no sign, no leading
 * zero, nothing after), else -1 */
static int reply_status(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 3 || s[strspn(s, "0123456789")] || (n > 1 && s[0] == '0')) return -1;
    int v = atoi(s);
    return v <= 255 ? v : -1;
}

/* reply_log_ok: the log file and line of an answer: both empty, or an absolute path and one
 * whole line (its one newline at its end) */
static int reply_log_ok(const char *file, const char *line) {
    size_t n = strlen(line);
    if (!*file) return !*line;
    return file[0] == '/' && strlen(file) < PATH_MAX && n > 0 && n <= MAX_REPLY_LOG_LINE &&
           strchr(line, '\n') == line + n - 1;
}

/* act_on_reply: the server's answer, every field checked: "exec", text, log file, log line,
 * argv (at least the runtime, a path); "exit", status, text, log file, log line. Anything
 * else, "fallback" and "stale" included, returns: no answer, Python starts. */
static void act_on_reply(char **fields, int k) {
    if (k >= 5 && !strcmp(fields[0], "exec") && strlen(fields[1]) <= MAX_REPLY_TEXT &&
        reply_log_ok(fields[2], fields[3]) && strchr(fields[4], '/')) {
        if (*fields[2]) append_log(fields[2], fields[3], strlen(fields[3]));
        if (*fields[1]) fputs(fields[1], stderr);
        char **args = fields + 4;
        execv(args[0], args);
        fprintf(stderr, "gpuhook-runtime: cannot run the real OCI runtime %s: %s\n", args[0], strerror(errno));
        _exit(127);
    }
    int status;
    if (k == 5 && !strcmp(fields[0], "exit") && (status = reply_status(fields[1])) >= 0 &&
        strlen(fields[2]) <= MAX_REPLY_TEXT && reply_log_ok(fields[3], fields[4])) {
        if (*fields[3]) append_log(fields[3], fields[4], strlen(fields[4]));
        if (*fields[2]) fputs(fields[2], stderr);
        fflush(stderr);
        _exit(status);
    }
}

/* exec_python: Python edits config.json, then execs the runtime itself. -I: no environment,
 * no user site, and not the current directory (the bundle) on sys.path. In the host bundle
 * (install/build.py) its own loader runs its interpreter. Returns only when no exec worked. */
static void exec_python(int argc, char **argv, const char *dir) {
    char **args = calloc((size_t)argc + 10, sizeof *args);
    if (!args) _exit(127);
    const char *py_env = getenv("GPUHOOK_PYTHON");
    char *sp;
    if (!(py_env && *py_env)) {
        char *loader = join(dir, "/../" LOADER, NULL), *interpreter = join(dir, "/../" INTERPRETER, NULL);
        if (is_executable(loader) && is_executable(interpreter) && (sp = site_packages(dir, "site-packages"))) {
            const char *head[] = {loader, "--library-path", join(dir, "/../lib", NULL), interpreter, "-I", "-S", "-c",
                                  STARTUP, sp};
            int k = 0;
            for (size_t j = 0; j < sizeof head / sizeof *head; j++) args[k++] = (char *)head[j];
            for (int j = 1; j < argc; j++) args[k++] = argv[j];
            execv(loader, args);
        }
    }
    char *py = NULL;
    if (py_env && *py_env) py = xstrdup(py_env);
    const char *near[] = {"/python3", "/python", NULL};
    for (int j = 0; !py && near[j]; j++) {
        char *p = join(dir, near[j], NULL);
        if (is_executable(p)) py = p;
        else free(p);
    }
    const char *system[] = {"/usr/local/bin/python3", "/usr/bin/python3", NULL};
    for (int j = 0; !py && system[j]; j++)
        if (is_executable(system[j])) py = xstrdup(system[j]);
    if (!py) {
        fprintf(stderr, "gpuhook-runtime: no Python to inject GPUs with (set GPUHOOK_PYTHON)\n");
        return;
    }
    int k = 0;
    args[k++] = py;
    args[k++] = "-I";
    if ((sp = site_packages(dir, "site-packages")) || (sp = site_packages(dir, "dist-packages"))) {
        args[k++] = "-S";
        args[k++] = "-c";
        args[k++] = STARTUP;
        args[k++] = sp;
    } else {
        args[k++] = "-m";
        args[k++] = "gpuhook.runtime";
    }
    for (int j = 1; j < argc; j++) args[k++] = argv[j];
    execv(py, args);
    fprintf(stderr, "gpuhook-runtime: cannot run Python (%s): %s\n", py, strerror(errno));
}

/* forget_if_gone: the exec record goes once the runtime has no state for the container
 * (runc and crun: <root>/<id>; execenv.state_exists) */
static void forget_if_gone(const char *rroot, const char *id, int dir) {
    char *state = join(rroot, "/", id, NULL);
    if (!exists(state)) unlinkat(dir, id, 0);
    free(state);
}

/* the real runtime: the config's (a path or a name on PATH), else runc, else crun */
static char *real_runtime(const char *configured) {
    char *rt = configured ? find_runtime(configured) : NULL;
    if (!configured && !(rt = find_runtime("runc"))) rt = find_runtime("crun");
    return rt;
}

/* same_content: two open files of one size hold the same bytes */
static int same_content(int a, int b) {
    char x[65536], y[sizeof x];
    for (;;) {
        ssize_t n = read(a, x, sizeof x), m = n > 0 ? read(b, y, (size_t)n) : 0;
        if (n < 0 || m != n || memcmp(x, y, (size_t)n)) return 0;
        if (n == 0) return 1;
    }
}

/* is_front: the runtime is gpuhook-runtime itself (config.is_front: its name, this very file,
 * or a copy of it): exec'ing it would exec itself for ever */
static int is_front(const char *rt) {
    const char *base = strrchr(rt, '/');
    if (!strcmp(base ? base + 1 : rt, "gpuhook-runtime")) return 1;
    struct stat a, b; /* two stats on every call; the files are opened only for a same-size copy */
    if (stat(rt, &a) || stat("/proc/self/exe", &b)) return 0;
    if (a.st_dev == b.st_dev && a.st_ino == b.st_ino) return 1;
    if (!S_ISREG(a.st_mode) || a.st_size != b.st_size) return 0;
    int fa = open(rt, O_RDONLY | O_CLOEXEC | O_NONBLOCK), fb = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    int same = fa >= 0 && fb >= 0 && same_content(fa, fb);
    if (fa >= 0) close(fa);
    if (fb >= 0) close(fb);
    return same;
}

int main(int argc, char **argv) {
    struct config c = {0};
    struct invocation inv = {0};
    read_config(&c);
    if (c.runtime && !*c.runtime) c.runtime = NULL; /* "": unset, as Python reads it */
    parse_args(argc, argv, &inv);
    if (!c.slow) {
        char *rt = real_runtime(c.runtime);
        if (!rt) {
            fprintf(stderr, "gpuhook-runtime: no real OCI runtime: %s not found (set `runtime` in %s)\n",
                    c.runtime ? c.runtime : "runc or crun", c.path);
            return 127;
        }
        if (is_front(rt)) {
            fprintf(stderr, "gpuhook-runtime: the real OCI runtime %s is gpuhook-runtime itself (set `runtime` in %s)\n",
                    rt, c.path);
            return 127;
        }
        const char *cmd = inv.command ? inv.command : "";
        if (!strcmp(cmd, "create") || !strcmp(cmd, "run")) {
            if (!c.errors && !gpu_present(c.host_root ? c.host_root : "/")) {
                /* No GPU at all: config.json stays as it is. An exec record of an earlier
                 * container of this id (not of a running one) goes; one log line; the runtime. */
                char *rroot = runtime_root(inv.root, rt);
                int dir = record_dir(rroot, inv.container_id);
                struct stat st;
                if (dir >= 0 && !fstatat(dir, inv.container_id, &st, AT_SYMLINK_NOFOLLOW))
                    forget_if_gone(rroot, inv.container_id, dir);
                log_no_gpu(&c, &inv);
                exec_runtime(rt, argv);
            }
        } else if (!strcmp(cmd, "exec") || !strcmp(cmd, "delete")) {
            /* exec: Python only when gpuhook injected this container (its record is there).
             * delete: the record goes once the runtime has no state for the container. */
            char *rroot = runtime_root(inv.root, rt);
            int dir = record_dir(rroot, inv.container_id);
            struct stat st;
            if (dir < 0 || fstatat(dir, inv.container_id, &st, AT_SYMLINK_NOFOLLOW) ||
                (!strcmp(cmd, "exec") && !S_ISREG(st.st_mode)))
                exec_runtime(rt, argv);
            if (!strcmp(cmd, "delete")) {
                /* SIGCHLD may come ignored (then waitpid has no status to give): default while
                 * the front waits, the caller's own again in the runtime */
                struct sigaction dfl = {.sa_handler = SIG_DFL}, caller;
                sigaction(SIGCHLD, &dfl, &caller);
                pid_t pid = fork();
                if (pid == 0) {
                    sigaction(SIGCHLD, &caller, NULL);
                    exec_runtime(rt, argv);
                }
                if (pid < 0) exec_runtime(rt, argv);
                int status, w;
                while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
                }
                if (w < 0) return 127; /* no status: never a success */
                forget_if_gone(rroot, inv.container_id, dir);
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
        } else {
            exec_runtime(rt, argv);
        }
    }
    /* There may be GPUs, an exec into a container gpuhook injected, a create under a config
     * with errors, or no current front file: Python decides everything, the node's resident one when
     * it runs (server.py), else a fresh one. */
    const char *cmd = inv.command ? inv.command : "";
    char *dir = here(argv[0]); /* resolved once: Python's paths name one version */
    if (!strcmp(cmd, "create") || !strcmp(cmd, "run") || !strcmp(cmd, "exec")) ask_server(argc, argv);
    exec_python(argc, argv, dir);
    if (c.fail_mode && !strcmp(c.fail_mode, "closed")) return 1;
    char *rt = real_runtime(c.runtime);
    if (!rt || is_front(rt)) {
        fprintf(stderr, "gpuhook-runtime: no real OCI runtime: %s not found\n", c.runtime ? c.runtime : "runc or crun");
        return 127;
    }
    exec_runtime(rt, argv);
    return 127;
}
