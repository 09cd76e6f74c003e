/* logline.h: one node log line, whole or not at all, for the C writers of the node log (the
 * runtime's front, gpuhook-runtime.c, and gpuhook-hook.c), as gpuhook/runtime/logline.py's
 * append_line and undo_short_write write it in Python.  Included by both; needs <errno.h>,
 * <fcntl.h>, <stdio.h>, <string.h>, <sys/stat.h>, <unistd.h>, and SHORT_WRITE (logline.SHORT_WRITE,
 * in the generated header before it). */

/* log_undo: `written` bytes of a line that did not fit (a full disk), the last an O_APPEND fd
 * wrote, overwritten in place by spaces and a newline: a blank line every reader skips.  Not a
 * truncation: another writer (none takes a lock) may have appended a line after ours meanwhile,
 * and an overwrite touches no byte but ours and needs no new space.  Only where the overwrite
 * fails too (a full copy-on-write file system) is the file cut back, while it still ends with
 * our bytes.  0: done; -1: the bytes are still there. */
static int log_undo(int fd, size_t written) {
    off_t end = lseek(fd, 0, SEEK_CUR), start = end - (off_t)written;
    int flags = fcntl(fd, F_GETFL);
    struct stat st;
    char blank[512];
    if (written == 0 || end < 0 || start < 0 || flags < 0 || fcntl(fd, F_SETFL, flags & ~O_APPEND) < 0)
        return -1; /* (pwrite on an O_APPEND file appends, on Linux) */
    memset(blank, ' ', sizeof blank);
    for (off_t at = start; at < end;) {
        size_t k = end - at > (off_t)sizeof blank ? sizeof blank : (size_t)(end - at);
        if (at + (off_t)k == end) blank[k - 1] = '\n';
        ssize_t w = pwrite(fd, blank, k, at);
        if (w <= 0) /* the overwrite failed too */
            return fstat(fd, &st) == 0 && st.st_size == end ? ftruncate(fd, start) : -1;
        at += w;
    }
    return 0;
}

/* log_append: the line's one write(2) to an O_APPEND fd.  0: it is there whole; else -1 and why
 * (errno's text, or SHORT_WRITE's) in why[n], nothing of the line left in the file. */
static int log_append(int fd, const char *line, size_t n, char *why, size_t why_size) {
    ssize_t w = write(fd, line, n);
    if (w == (ssize_t)n) return 0;
    if (w < 0) {
        snprintf(why, why_size, "%s", strerror(errno));
        return -1;
    }
    log_undo(fd, (size_t)w);
    snprintf(why, why_size, SHORT_WRITE, (int)w, (int)n);
    return -1;
}
