"""The node log's tail: CreateFollower reads the runtime's log (JSON lines, one per create,
appended by gpuhook-runtime, the NRI plugin and gpuhook-hook) as it grows and hands each record
to its consumers: PodReporter (podevents.py), the metrics (metrics.py), the NRI plugin's state
(sinks.py).

Where it stopped reading is kept in a small file of the node's (`position_file`,
defaults.LOG_POSITION: the file's device and inode and the offset past the last whole line
read), written atomically after each read that got lines. An agent that starts again (a new
pod of the DaemonSet, the node rebooted) goes on from there when the log is the same file and
no shorter: the creates made while no agent ran get their Events and labels too. With no such
file, or another file at the log's path (rotated meanwhile), it starts at the log's end.
"""

from __future__ import annotations

import json
import os
import threading

from ..hook import EVENT as HOOK_EVENT
from ..nri.plugin import NRI_EVENT

# the longest node log line the follower waits to see whole (server.MAX_REPLY_LOG_LINE bounds
# a create's); past it, the line is skipped
MAX_LINE = 1 << 20


class CreateFollower:
    """Tails the runtime's log (JSON lines, appended with O_APPEND by every create) from
    its end at start, and feeds each new "create" record to the consumers. A rotated or
    truncated file is followed from its beginning. A consumer that raises is logged and
    skipped: the follower never stops."""

    def __init__(
        self, path: str, consumers: list, log, poll: float = 0.25, from_start: bool = False, position_file: str = ""
    ):
        self.path = path
        self.consumers = consumers
        self.log = log
        self.poll = poll
        self._ino: tuple[int, int] | None = None
        self._pos = 0  # where the next line starts
        self._skip_line = False  # the line at _pos is the rest of one not to be read
        self._from_start = from_start
        self._said_missing = False
        self.position_file = position_file
        self._saved: tuple | None = None  # what the position file says
        self._said_save = False
        self.thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        self.read_new(first=True)
        self.thread = threading.Thread(target=self._loop, args=(stop,), name="gpuhook-creates", daemon=True)
        self.thread.start()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll):
            self.read_new()
            for c in self.consumers:
                tick = getattr(c, "tick", None)
                if tick:
                    self._call(tick)

    def _call(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # a bug in one consumer must not end the others
            self.log.error("creates.consumer_error", error=f"{type(e).__name__}: {e}")

    def read_new(self, first: bool = False) -> int:
        """Read what was appended since the last call; the number of create records fed. A
        line is read once it has its newline: until then it is read again from its start on
        the next call (a writer that could not finish it may blank it or cut it back,
        logline.undo_short_write). A damaged line is skipped, the rest kept (log.parse_line)."""
        from ..log import parse_line

        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            if not self._said_missing:
                self._said_missing = True
                self.log.info("creates.waiting", file=self.path, why=e.strerror or str(e))
            return 0
        try:
            st = os.fstat(fd)
            if self._ino != (st.st_dev, st.st_ino) or st.st_size < self._pos:
                rotated = self._ino is not None
                self._ino = (st.st_dev, st.st_ino)
                self._pos = st.st_size if first and not self._from_start and not rotated else 0
                resumed = self._resume(st) if first and not self._from_start else None
                if resumed is not None:
                    self._pos = resumed
                    self.log.info("creates.catching_up", file=self.path, offset=resumed, behind=st.st_size - resumed)
                # from the end: within a line still being written, its rest is not to be read
                self._skip_line = self._pos > 0 and os.pread(fd, 1, self._pos - 1) != b"\n"
                if self._said_missing or first:
                    self.log.info("creates.following", file=self.path, offset=self._pos)
                self._said_missing = False
            if st.st_size <= self._pos:
                self._save()
                return 0
            os.lseek(fd, self._pos, os.SEEK_SET)
            data = os.read(fd, min(st.st_size - self._pos, 4 << 20))
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1  # what is read of an unfinished line waits for its end
        if end == 0 and len(data) < MAX_LINE:
            return 0
        if end == 0:  # no newline in so much: the rest of that line is skipped
            self._pos += len(data)
            self._skip_line = True
            return 0
        self._pos += end
        lines = data[:end].split(b"\n")[:-1]
        if self._skip_line:
            lines, self._skip_line = lines[1:], False
        fed = 0
        for raw in lines:
            rec, _damaged = parse_line(raw)
            if rec is not None and rec.get("event") == "create":
                fed += 1
                for c in self.consumers:
                    self._call(c.handle, rec)
            elif rec is not None and rec.get("event") == HOOK_EVENT:
                for c in self.consumers:
                    if hasattr(c, "handle_hook"):
                        self._call(c.handle_hook, rec)
            elif isinstance(rec, dict) and rec.get("event") == NRI_EVENT:  # the NRI plugin's own state
                for c in self.consumers:
                    if hasattr(c, "handle_nri"):
                        self._call(c.handle_nri, rec)
        self._save()  # after the consumers: an agent killed meanwhile reads these lines again
        return fed

    def _resume(self, st: os.stat_result) -> int | None:
        """The offset the position file keeps for this very file (device, inode), when the
        file is at least that long; None otherwise."""
        if not self.position_file:
            return None
        try:
            with open(self.position_file, "rb") as f:
                saved = json.loads(f.read(4096))
            where = (saved["dev"], saved["ino"], saved["offset"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if where[:2] != (st.st_dev, st.st_ino) or not isinstance(where[2], int) or not 0 <= where[2] <= st.st_size:
            return None
        return where[2]

    def _save(self) -> None:
        """The position file, atomically, when what it says changed; a failure said once."""
        if not self.position_file or self._ino is None or self._skip_line:
            return
        now = (*self._ino, self._pos)
        if now == self._saved:
            return
        tmp = f"{self.position_file}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.position_file), exist_ok=True)
            with open(tmp, "w") as f:
                json.dump({"file": self.path, "dev": now[0], "ino": now[1], "offset": now[2]}, f)
            os.replace(tmp, self.position_file)
        except OSError as e:
            if not self._said_save:
                self._said_save = True
                self.log.warning("creates.position_error", file=self.position_file, error=e.strerror or str(e))
            return
        self._saved = now
