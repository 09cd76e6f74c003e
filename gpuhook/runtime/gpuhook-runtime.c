/* gpuhook-runtime: an OCI runtime with runc's command line, a small static gate before Python.
 * Every subcommand that needs nothing from gpuhook execs the real runtime at once (delete too);
 * so does a create/run on a node with no sign of a GPU (after one log line), and an exec into a
 * container with no exec record. The rest goes to Python (gpuhook/runtime/): the node's resident
 * server when one answers, else a fresh interpreter. It parses no TOML: each Python run leaves it
 * a front file of what it decided (config.front_text); with none current, Python decides all.
 * Its tables come from Python (gpuhook-runtime.h, runtime/gen_header.py). Built static
 * (gpuhook/hook/build.sh OUTPUT SOURCE): it runs on any node, whatever its libc. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "gpuhook-runtime.h"
#include "logline.h" /* log_append: a line whole or not at all (logline.append_line's) */

struct config { /* the node config as Python decided it (the front file), or the defaults */
    const char *path, *value[FRONT_NKEYS];
    int slow; /* no current front file of gpuhook's own: Python decides everything */
};
struct invocation {                            /* what the command line says (runtime.parse_args) */
    const char *command, *root, *container_id; /* --root; create/run's and exec's id */
    char *bundle;                              /* create/run: absolute, the current directory when not given */
};

static char *fmt(const char *format, ...) {
    va_list ap;
    char *out;
    va_start(ap, format);
    if (vasprintf(&out, format, ap) < 0) _exit(127);
    va_end(ap);
    return out;
}

static int one_of(const char *word, const char *const *list) {
    while (word && *list && strcmp(word, *list)) list++;
    return word && *list;
}

static int is_executable(const char *path) {
    struct stat st;
    return access(path, X_OK) == 0 && stat(path, &st) == 0 && !S_ISDIR(st.st_mode);
}

static char *cwd(void) {
    char *p = getcwd(NULL, 0);
    return p ? p : fmt("/");
}

#define is_flag(arg) ((arg)[0] == '-' && (arg)[1])

/* flag_value: argv[*i]'s name, no dashes, into buf; its "=value", or the next word if it `takes` one */
static const char *flag_value(int argc, char **argv, int *i, const char *const *takes, char *buf, size_t size) {
    const char *arg = argv[*i] + strspn(argv[*i], "-"), *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    if (n >= size) n = size - 1; /* no flag is that long: it matches none */
    memcpy(buf, arg, n);
    buf[n] = 0;
    if (eq) return eq + 1;
    return one_of(buf, takes) ? (++*i < argc ? argv[*i] : NULL) : NULL;
}

/* parse_args: the subcommand, --root; create/run's bundle and id, exec's id (flag values are never ids) */
static void parse_args(int argc, char **argv, struct invocation *inv) {
    char name[64];
    int i = 1;
    for (; i < argc && is_flag(argv[i]); i++) {
        if (!strcmp(argv[i], "--") && ++i) break; /* past it: the subcommand */
        const char *value = flag_value(argc, argv, &i, GLOBAL_VALUE_FLAGS, name, sizeof name);
        if (!strcmp(name, ROOT_FLAG)) inv->root = value;
    }
    if (i >= argc) return;
    inv->command = argv[i++];
    int editing = one_of(inv->command, EDITING_COMMANDS), exec = !strcmp(inv->command, EXEC_COMMAND);
    if (!editing && !exec) return;
    const char *bundle = NULL;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { /* the id follows, if there is none yet */
            inv->container_id = inv->container_id ? inv->container_id : i + 1 < argc ? argv[i + 1] : NULL;
            break;
        }
        if (!is_flag(argv[i])) {
            if (!inv->container_id) inv->container_id = argv[i];
            if (exec) break; /* the process's own argv follows: never read as flags */
            continue;
        }
        const char *value = flag_value(argc, argv, &i, editing ? CREATE_VALUE_FLAGS : EXEC_VALUE_FLAGS, name, 64);
        if (editing && one_of(name, BUNDLE_FLAGS)) bundle = value;
    }
    if (!editing) return;
    char *dir = bundle && bundle[0] == '/' ? NULL : cwd();
    inv->bundle = !dir ? fmt("%s", bundle) : !bundle || !*bundle ? dir
                  : fmt("%s%s%s", dir, dir[1] ? "/" : "", bundle); /* as os.path.join: "/b" under / */
}

/* find_runtime: a path, or a name on PATH (config.find_runtime); NULL when not found */
static char *find_runtime(const char *name) {
    if (strchr(name, '/')) return is_executable(name) ? fmt("%s", name) : NULL;
    const char *path = getenv("PATH");
    char *dirs = fmt("%s", path && *path ? path : SEARCH_PATH);
    for (char *d = dirs, *next; d; d = next) {
        if ((next = strchr(d, ':'))) *next++ = 0;
        char *p = fmt("%s/%s", *d ? d : ".", name);
        if (is_executable(p)) return p;
        free(p);
    }
    return NULL;
}

static int same_content(int a, int b) { /* two open files of one size hold the same bytes */
    char x[65536], y[sizeof x];
    for (ssize_t n = 1; n;)
        if ((n = read(a, x, sizeof x)) < 0 || (n > 0 && read(b, y, (size_t)n) != n) || memcmp(x, y, (size_t)n)) return 0;
    return 1;
}
/* is_front: the runtime is this wrapper (config.is_front: its name, this file, or a copy of it) */
static int is_front(const char *rt) {
    const char *base = strrchr(rt, '/');
    struct stat a, b;
    if (!strcmp(base ? base + 1 : rt, FRONT_NAME)) return 1;
    if (stat(rt, &a) || stat("/proc/self/exe", &b)) return 0;
    if (a.st_dev == b.st_dev && a.st_ino == b.st_ino) return 1;
    if (!S_ISREG(a.st_mode) || a.st_size != b.st_size) return 0;
    int fa = open(rt, O_RDONLY | O_CLOEXEC | O_NONBLOCK), fb = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    int same = fa >= 0 && fb >= 0 && same_content(fa, fb);
    close(fa), close(fb);
    return same;
}

/* real_runtime: the config's ("": none), else the first of DEFAULT_RUNTIMES found; NULL when
 * there is none, after one line when `say`. One that is this wrapper: one line and exit here,
 * whoever asks (Python would be started again by the call it makes: config.is_front) */
static char *real_runtime(const char *configured, const char *config_path, int say) {
    char *rt = *configured ? find_runtime(configured) : NULL;
    for (const char *const *d = DEFAULT_RUNTIMES; !*configured && !rt && *d; d++) rt = find_runtime(*d);
    if (rt && is_front(rt)) {
        fprintf(stderr, PREFIX RUNTIME_IS_FRONT "\n", rt, config_path);
        _exit(NO_RUNTIME_STATUS);
    }
    if (!rt && say) fprintf(stderr, PREFIX NO_RUNTIME "\n", *configured ? configured : DEFAULT_RUNTIMES_TEXT, config_path);
    return rt;
}

static const char *cache_dir(void) {
    const char *env = getenv(CACHE_DIR_ENV);
    return env && *env ? env : CACHE_DIR;
}

/* open_checked: `name` under the open directory `dir` (closed here), never through a link, only
 * when gpuhook's own: a directory (want_dir) or a regular file, of this user, not writable by
 * group or others (execenv._open_level). -1 otherwise. */
static int open_checked(int dir, const char *name, int want_dir) {
    int fd = dir == -1 ? -1 : openat(dir, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (want_dir ? O_DIRECTORY : 0));
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) || st.st_uid != geteuid() || (st.st_mode & WRITABLE_BY_OTHERS) ||
                    (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)))) {
        close(fd);
        fd = -1;
    }
    if (dir >= 0) close(dir);
    return fd;
}

/* escape: "%" and "/" as config.front_file has them: one file name for a path */
static char *escape(const char *path) {
    char *out = malloc(strlen(path) * 3 + 1), *o = out;
    if (!out) _exit(127);
    for (const char *p = path; *p; p++) o = *p == '/' ? stpcpy(o, ESCAPED_SLASH) : *p == '%' ? stpcpy(o, ESCAPED_PERCENT) : (*o++ = *p, o);
    *o = 0;
    return out;
}

/* read_config: no config file: the defaults (Python's too). Else the front file (config.front_file)
 * when gpuhook's own, every field once, naming this file as it is now (dev, inode, size, mtime,
 * ctime: one stat). Anything else: slow, Python decides. */
static void read_config(struct config *c) {
    static char text[MAX_FRONT + 1]; /* the values point into it: they live as long as the process */
    const char *env = getenv(CONFIG_ENV), *got[FRONT_NKEYS] = {0};
    struct stat st;
    c->path = env && *env ? env : CONFIG_FILE;
    memcpy(c->value, FRONT_DEFAULTS, sizeof c->value);
    if (stat(c->path, &st)) return (void)(c->slow = errno != ENOENT); /* not to be read: Python says why */
    c->slow = 1; /* a path not as Python keys it (config.load: abspath) names a front file it never writes */
    if (!S_ISREG(st.st_mode)) return;
    char *name = fmt("%s%s%s", FRONT_FILE_PREFIX, escape(c->path), FRONT_FILE_SUFFIX);
    int fd = open_checked(open_checked(AT_FDCWD, cache_dir(), 1), name, 0);
    size_t len = 0;
    for (ssize_t r; fd >= 0 && len <= MAX_FRONT && (r = read(fd, text + len, MAX_FRONT + 1 - len)) != 0;)
        len = r > 0 ? len + (size_t)r : errno == EINTR ? len : MAX_FRONT + 1;
    if (fd >= 0) close(fd);
    if (!len || len > MAX_FRONT || text[len - 1] || strcmp(text, FRONT_MAGIC)) return;
    for (char *f = text + strlen(text) + 1, *next, *v; f < text + len; f = next) {
        next = f + strlen(f) + 1;
        if (!(v = strchr(f, '='))) return;
        *v++ = 0;
        for (int k = 0; k < FRONT_NKEYS; k++)
            if (!strcmp(f, FRONT_KEY_NAMES[k]) && got[k]) return; /* twice: not Python's */
            else if (!strcmp(f, FRONT_KEY_NAMES[k])) got[k] = v;
    }
    for (int k = 0; k < FRONT_NKEYS; k++)
        if (!got[k]) return; /* not whole */
    char *want = fmt("%llu:%llu:%lld:%lld:%lld", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                     (long long)st.st_size, (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
                     (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec);
    if (strcmp(got[FRONT_CONFIG], want)) return; /* another file's, or this one changed since */
    memcpy(c->value, got, sizeof got);
    c->slow = 0;
}

/* has_record: an exec record (execenv.record_path: <cache>/RECORD_DIR/<runtime root, "/" as "%2F">/
 * <id>), each level checked. The root: --root (relative: to $PWD when that is the current directory,
 * as execenv._pwd), or /run/<runtime>. A root Python keys none by (a "%", "//") has a key it never makes. */
static int has_record(const char *root, const char *rt, const char *id) {
    const char *base = strrchr(rt, '/'), *p = getenv("PWD");
    struct stat st, here;
    int pwd = p && p[0] == '/' && !stat(p, &st) && !stat(".", &here) && st.st_dev == here.st_dev && st.st_ino == here.st_ino;
    char *rroot = !root || !*root ? fmt("%s/%s", DEFAULT_ROOT_DIR, base ? base + 1 : rt) : root[0] == '/' ? fmt("%s", root)
                                                                         : fmt("%s/%s", pwd ? p : cwd(), root);
    if (!id || !*id || !strcmp(id, ".") || !strcmp(id, "..") || id[strspn(id, ID_CHARS)]) return 0;
    int fd = open_checked(open_checked(open_checked(AT_FDCWD, cache_dir(), 1), RECORD_DIR, 1), escape(rroot), 1);
    int there = fd >= 0 && !fstatat(fd, id, &st, AT_SYMLINK_NOFOLLOW) && S_ISREG(st.st_mode);
    if (fd >= 0) close(fd);
    return there;
}

/* gpu_present: is there any sign of a GPU under the host root (probe.SIGNS)? */
static int gpu_present(const char *root) {
    for (const struct sign *s = SIGNS; s->dir; s++) { /* "/" + "/dev" is "//dev": the same directory */
        char *dir = fmt("%s%s", root, s->dir), *p = fmt("%s/%s", dir, s->name);
        struct stat st;
        if (s->kind == SIGN_EXACT && lstat(p, &st) == 0) return 1;
        DIR *d = s->kind == SIGN_EXACT ? NULL : opendir(dir);
        size_t plen = strlen(s->name);
        for (struct dirent *e; d && (e = readdir(d));)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !strncmp(e->d_name, s->name, plen) &&
                (s->kind == SIGN_ANY || (e->d_name[plen] >= '0' && e->d_name[plen] <= '9')))
                return 1;
        if (d) closedir(d);
        free(dir);
        free(p);
    }
    return 0;
}

/* append_log: one write with O_APPEND (logline.append_node_log), no link, no FIFO wait; a new
 * file 0640; a line that is not there whole is said on stderr (this process writes one) */
static void append_log(const char *file, const char *line, size_t n) {
    char why[256];
    int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, LOG_MODE);
    if (fd < 0) snprintf(why, sizeof why, "%s", strerror(errno));
    if (fd < 0 || log_append(fd, line, n, why, sizeof why) < 0) {
        fprintf(stderr, PREFIX CANNOT_WRITE_LOG "\n", file, why);
        fflush(stderr);
    }
    if (fd >= 0) close(fd);
}

/* log_no_gpu: the create's log line (NO_GPU_LINE: Python's for a create with no GPU), ms its duration */
static void log_no_gpu(const char *file, const struct invocation *inv, double ms) {
    const char *id = inv->container_id ? inv->container_id : "", *bundle = inv->bundle, *safe = ID_CHARS ":/@=";
    int odd = id[strspn(id, safe)] || bundle[strspn(bundle, safe)]; /* not to be written as it is: "?" */
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    char *stamp = fmt(TIME_FORMAT, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                      (int)(now.tv_nsec / 1000000)); /* logline.utc_now's */
    char *line = fmt(NO_GPU_LINE, stamp, odd ? "\"?\"" : inv->container_id ? fmt("\"%s\"", id) : "null",
                     odd ? "?" : bundle, ms);
    if (*file) append_log(file, line, strlen(line));
}

/* exec_runtime: returns only when the runtime could not be run (errno says why) */
static void exec_runtime(const char *rt, char **argv) {
    argv[0] = (char *)rt;
    execv(rt, argv);
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* io: one send (out) or read, waiting until the deadline (of the whole exchange); -1: error, late */
static ssize_t io(int fd, int out, char *buf, size_t n, long long deadline) {
    for (long long left;;) {
        ssize_t r = out ? send(fd, buf, n, MSG_NOSIGNAL) : read(fd, buf, n); /* a closed socket: no SIGPIPE */
        if (r >= 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) return r;
        struct pollfd p = {.fd = fd, .events = out ? POLLOUT : POLLIN};
        if ((left = deadline - now_ns()) <= 0 || (poll(&p, 1, (int)((left + 999999) / 1000000)) < 0 && errno != EINTR))
            return -1;
    }
}

/* reply_log: an answer's stderr text, log file and line (both "", or an absolute path and one
 * whole line, its one newline at its end): written when all are well-formed */
static int reply_log(const char *text, const char *file, const char *line) {
    size_t n = strlen(line);
    if (strlen(text) > MAX_REPLY_TEXT || (*file ? file[0] != '/' || strlen(file) >= PATH_MAX || n == 0 ||
                                                      n > MAX_REPLY_LOG_LINE || strchr(line, '\n') != line + n - 1
                                                : n != 0))
        return 0;
    if (*file) append_log(file, line, n);
    fputs(text, stderr);
    fflush(stderr);
    return 1;
}

/* ask_server: the call through the resident server (server.py), which runs what Python would:
 * exec the argv it answers ("exec", text, log file, log line, argv) or exit as it says ("exit",
 * status, text, log file, log line). Anything else ("fallback", "stale", a timeout): returns
 * (its socket is close-on-exec: Python's start closes it). */
static void ask_server(char **argv) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    char *req, *reply, *field[MAX_REPLY_FIELDS + 1], *status;
    if (snprintf(addr.sun_path, sizeof addr.sun_path, "%s/%s", cache_dir(), SOCKET_NAME) >= (int)sizeof addr.sun_path) return;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), k = 0;
    long long deadline = now_ns() + SERVER_TIMEOUT_S * 1000000000LL; /* past it, the server does nothing */
    struct ucred cred;
    socklen_t len = sizeof cred;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    if (fd < 0 || (connect(fd, (struct sockaddr *)&addr, sizeof addr) &&
                   (errno != EINPROGRESS || poll(&p, 1, SERVER_TIMEOUT_S * 1000) != 1)) ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) || (cred.uid != 0 && cred.uid != geteuid()))
        return;
    size_t size = 0, got = 0;
    FILE *m = open_memstream(&req, &size); /* NUL-ended fields; who this is, the server asks the kernel */
    mode_t mask = umask(0);
    umask(mask);
    const char *one[REQUEST_NFIELDS] = {[REQUEST_MAGIC] = SERVER_MAGIC, [REQUEST_UMASK] = fmt("%d", (int)mask),
                                        [REQUEST_DEADLINE_NS] = fmt("%lld", deadline), [REQUEST_CWD] = cwd()};
    char **list[REQUEST_NFIELDS] = {[REQUEST_ENV] = environ, [REQUEST_ARGV] = argv + 1}; /* its length first */
    for (int f = 0, n = 0; f < REQUEST_NFIELDS; f++, n = 0) {
        if (!list[f] != !REQUEST_IS_LIST[f] || (!list[f] && !one[f])) return; /* a field this front has not */
        while (list[f] && list[f][n]) n++;
        if (list[f]) fprintf(m, "%d%c", n, 0);
        for (int i = 0; i < (list[f] ? n : 1); i++) fprintf(m, "%s%c", list[f] ? list[f][i] : one[f], 0);
    }
    if (fclose(m)) _exit(127);
    for (ssize_t w, off = 0; off < (ssize_t)size; off += w)
        if ((w = io(fd, 1, req + off, size - (size_t)off, deadline)) <= 0) return;
    shutdown(fd, SHUT_WR);
    if (!(reply = malloc(MAX_REPLY + 1))) _exit(127);
    for (ssize_t r; (r = io(fd, 0, reply + got, MAX_REPLY - got, deadline)) != 0; got += (size_t)r)
        if (r < 0 || got + (size_t)r >= MAX_REPLY) return; /* the deadline passed, or too big to trust */
    if (!got || reply[got - 1]) return;                       /* not whole */
    for (char *s = reply; s < reply + got; s += strlen(s) + 1)
        if (k == MAX_REPLY_FIELDS) return;
        else field[k++] = s;
    field[k] = NULL, status = field[REPLY_EXIT_STATUS]; /* field[0]: the kind, then its fields by name */
    if (k > REPLY_EXEC_ARGV && !strcmp(field[0], REPLY_EXEC) && strchr(field[REPLY_EXEC_ARGV], '/') &&
        reply_log(field[REPLY_EXEC_SAID], field[REPLY_EXEC_LOG_FILE], field[REPLY_EXEC_LOG_LINE]))
        exec_runtime(field[REPLY_EXEC_ARGV], field + REPLY_EXEC_ARGV); /* the socket is close-on-exec, as every fd here */
    size_t n = k == REPLY_EXIT_NFIELDS && !strcmp(field[0], REPLY_EXIT) ? strlen(status) : 0; /* "0" to "255", no sign, no 0 first */
    if (n >= 1 && n <= 3 && !status[strspn(status, "0123456789")] && (n == 1 || status[0] != '0') && atoi(status) <= 255 &&
        reply_log(field[REPLY_EXIT_SAID], field[REPLY_EXIT_LOG_FILE], field[REPLY_EXIT_LOG_LINE]))
        _exit(atoi(status));
}

/* here: this binary's directory, every link resolved (bin/ is a link to the version installed:
 * every path below is in that one version, whatever an upgrade switches: install/files.py) */
static char *here(const char *argv0) {
    char *exe = realpath("/proc/self/exe", NULL), *slash;
    if (!exe && !(exe = realpath(argv0, NULL))) return fmt(".");
    slash = strrchr(exe, '/');
    slash[slash == exe] = 0;
    return exe;
}

static int python_dir(const struct dirent *e) { return !strncmp(e->d_name, PYTHON_DIRS, strlen(PYTHON_DIRS)); }

/* site_packages: <dir>/../lib/python3.../<kind> holding gpuhook, the first in name order (C locale) */
static char *site_packages(const char *dir, const char *kind) {
    char *lib = fmt("%s/../" LIB, dir), *found = NULL;
    struct dirent **names;
    struct stat st;
    for (int i = 0, n = scandir(lib, &names, python_dir, alphasort); i < n && !found; i++)
        if (!stat(fmt("%s/%s/%s/gpuhook", lib, names[i]->d_name, kind), &st) && S_ISDIR(st.st_mode))
            found = fmt("%s/%s/%s", lib, names[i]->d_name, kind);
    return found;
}

/* append: the NULL-ended strings after k into args, the next k */
static int append(char **args, int k, ...) {
    va_list ap;
    va_start(ap, k);
    for (char *a; (a = va_arg(ap, char *));) args[k++] = a;
    va_end(ap);
    return k;
}

/* exec_python: Python decides and execs the runtime itself (-I: no environment, no user site, not
 * the bundle on sys.path); the host bundle's loader runs its interpreter. Returns if none ran. */
static void exec_python(int argc, char **argv, const char *dir) {
    char **args = calloc((size_t)argc + 10, sizeof *args), *py = getenv(PYTHON_ENV), *p, *loader, *interpreter;
    char *sp = site_packages(dir, SITE_PACKAGES);
    int k = 0;
    if (!args) _exit(127);
    if ((!py || !*py) && sp && is_executable(loader = fmt("%s/../%s", dir, LOADER)) &&
        is_executable(interpreter = fmt("%s/../%s", dir, INTERPRETER)))
        k = append(args, k, py = loader, LIBRARY_PATH_FLAG, fmt("%s/../" LIB, dir), interpreter, NULL);
    else {
        for (const char *const *n = PYTHONS; (!py || !*py) && *n; n++) /* a name: beside the front */
            if (is_executable(p = **n == '/' ? fmt("%s", *n) : fmt("%s/%s", dir, *n))) py = p;
        if (!py || !*py) {
            fprintf(stderr, PREFIX "no Python to inject GPUs with (set " PYTHON_ENV ")\n");
            return;
        }
        args[k++] = py;
    }
    if (sp || (sp = site_packages(dir, DIST_PACKAGES))) k = append(args, k, RUNTIME_FLAGS, RUNTIME_MAIN, sp, NULL);
    else k = append(args, k, MODULE_FLAGS, RUNTIME_MODULE, NULL); /* no site-packages dir: as sys.path has it */
    for (int j = 1; j < argc; j++) args[k++] = argv[j];
    execv(py, args);
    fprintf(stderr, PREFIX "cannot run Python (%s): %s\n", py, strerror(errno));
}

int main(int argc, char **argv) {
    long long started = now_ns();
    struct config c = {0};
    struct invocation inv = {0};
    read_config(&c);
    parse_args(argc, argv, &inv);
    if (!c.slow) {
        /* No real runtime, or one that cannot be run: Python says why, on stderr and in the
         * caller's --log in runc's format (logline.runtime_error), as it does for its own calls */
        char *rt = real_runtime(c.value[FRONT_RUNTIME], c.path, 0);
        /* No GPU at all: config.json stays as it is, one log line, the runtime (a config with
         * errors goes to Python, whose log line says why). An exec goes to Python only into a
         * container gpuhook injected. Everything else: the runtime. */
        int editing = one_of(inv.command, EDITING_COMMANDS);
        if (rt && (editing ? !strcmp(c.value[FRONT_ERRORS], FRONT_NO_ERRORS) && !gpu_present(c.value[FRONT_HOST_ROOT])
                           : !inv.command || strcmp(inv.command, EXEC_COMMAND) || !has_record(inv.root, rt, inv.container_id))) {
            if (editing) log_no_gpu(c.value[FRONT_LOG_FILE], &inv, (double)(now_ns() - started) / 1e6);
            exec_runtime(rt, argv);
        }
    }
    /* There may be GPUs, an exec into a container gpuhook injected, a create under a config
     * with errors, or no current front file: Python decides everything, the node's resident
     * one when it answers (server.py), else a fresh one. */
    char *dir = here(argv[0]); /* resolved once: Python's paths name one version */
    if (one_of(inv.command, SERVED_COMMANDS)) ask_server(argv);
    exec_python(argc, argv, dir);
    if (!strcmp(c.value[FRONT_FAIL_MODE], FAIL_CLOSED)) return 1; /* slow: the defaults' */
    char *rt = real_runtime(c.value[FRONT_RUNTIME], c.path, 1);
    if (rt) {
        exec_runtime(rt, argv);
        fprintf(stderr, PREFIX CANNOT_RUN "\n", rt, strerror(errno));
    }
    return NO_RUNTIME_STATUS;
}
