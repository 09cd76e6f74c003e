/* rss OUT NAME PATH ARGV0 [ARGS...]: run PATH (argv ARGV0 ARGS...), wait for it with wait4(2),
 * append "NAME <peak RSS KiB> <exit status>\n" to OUT, and exit with its status.
 *
 * The peak RSS of a process (ru_maxrss) survives exec and is inherited by a fork's child: a
 * command spawned by a big Python reports at least Python's. This small program is what the
 * benchmark forks from, so the figure is the command's own (and its children's, which
 * wait4 folds in). stdin, stdout and stderr pass through (an OCI hook reads the state). */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 5) {
        fputs("usage: rss OUT NAME PATH ARGV0 [ARGS...]\n", stderr);
        return 2;
    }
    pid_t pid = fork();
    if (pid < 0) return 127;
    if (pid == 0) {
        execv(argv[3], argv + 4);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    if (wait4(pid, &status, 0, &ru) < 0) return 127;
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    char line[512];
    int n = snprintf(line, sizeof line, "%s %ld %d\n", argv[2], ru.ru_maxrss, rc);
    int fd = open(argv[1], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (write(fd, line, (size_t)n) < 0) { /* the figure is lost, the command's status is not */ }
        close(fd);
    }
    return rc;
}
