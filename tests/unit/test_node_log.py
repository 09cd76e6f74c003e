"""The node log on a full disk (issue 36 item 5): a line is written whole or not at all, a line
that cannot be written is counted and said once, and the readers (`gpuhook log`, the agent's
CreateFollower) skip a damaged line and keep every whole one.

The front's and gpuhook-hook's own writes: tests/unit/test_front.py and
tests/hardening/test_hook_isolation.py (their full_disk tests)."""

from __future__ import annotations

import json
import os

from conftest import gpuhook
from gpuhook import fastjson, log
from gpuhook.agent import follow
from gpuhook.nri import plugin as nri
from gpuhook import logline
from gpuhook.runtime.logline import PREFIX, write_log


def create(n: int, extra: str = "") -> bytes:
    """A create's line, as create.log_line writes it (a long `extra` makes it long)."""
    rec = {"time": logline.utc_now(), "event": "create", "container_id": f"c{n}", "decision": "no-gpu"}
    if extra:
        rec["error"] = extra
    return logline.line_bytes(fastjson.dumps(rec))


def ids(records: list[dict]) -> list[str]:
    return [r["container_id"] for r in records if r.get("event") == "create"]


def followed(path: str) -> list[str]:
    """What the agent feeds its consumers of the whole file."""
    seen: list[dict] = []

    class Consumer:
        def handle(self, rec):
            seen.append(rec)

    follow.CreateFollower(path, [Consumer()], log.get(), from_start=True).read_new(first=True)
    return ids(seen)


def whole_or_blank(path: str) -> None:
    """Every line of the file is one JSON object or blank, the last one ended."""
    with open(path, "rb") as f:
        data = f.read()
    assert data.endswith(b"\n"), data[-80:]
    for line in data.split(b"\n")[:-1]:
        assert not line.strip() or isinstance(json.loads(line), dict), line[:120]


def test_a_line_that_does_not_fit_leaves_nothing_for_the_next_to_join(full_disk, monkeypatch, capsys):
    """The wrapper's write (write_log, append_line's) on a full disk: of a line that does not fit
    nothing is left (its bytes that did fit are undone), it is said once on stderr and counted;
    once there is room the next line is whole, and every reader has every whole line."""
    monkeypatch.setattr(logline, "LOST", 0, raising=False)
    path = os.path.join(full_disk.path, "gpuhook.log")
    for n in range(3):
        write_log((path, create(n)))
    full_disk.pad(path, slack=40)
    full_disk.fill()
    before = os.path.getsize(path)
    write_log((path, create(3, "x" * 300)))  # 40 bytes of it fit
    write_log((path, create(4, "y" * 300)))  # nothing of it fits
    whole_or_blank(path)
    assert os.path.getsize(path) == before + 40  # the 40 bytes: a blank line now
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "cannot write the node log" in said[0], said
    why = logline.SHORT_WRITE % (40, len(create(3, "x" * 300)))
    assert said == [PREFIX + logline.CANNOT_WRITE_LOG % (path, why)]
    assert logline.LOST == 2
    full_disk.free()
    write_log((path, create(5)))
    assert capsys.readouterr().err == ""
    whole_or_blank(path)
    records, skipped = log.tail_records(path, 100)
    assert ids(records) == ["c0", "c1", "c2", "c5"] and skipped == 0
    assert followed(path) == ["c0", "c1", "c2", "c5"]
    r = gpuhook("log", "--file", path, "--json", timeout=30)
    assert r.returncode == 0 and [json.loads(x)["container_id"] for x in r.stdout.splitlines()] == ["c0", "c1", "c2", "c5"]


def test_a_line_that_cannot_be_written_is_said_once_by_the_nri_plugin(tmp_path, monkeypatch):
    """The long-lived NRI plugin says its promised "cannot write the node log" (once: a full
    disk is not one line per create in its own log) and counts every line."""
    monkeypatch.setattr(logline, "LOST", 0, raising=False)

    class Config:
        log_file = str(tmp_path / "no-such-dir" / "gpuhook.log")

    said: list[str] = []
    plugin = nri.Plugin(log=said.append)
    for n in range(3):
        plugin.unlogged.append((Config(), {"container_id": f"c{n}", "decision": "no-gpu"}, 1.0))
        plugin.write_log()
    assert len(said) == 1 and "cannot write the node log" in said[0], said
    assert said == [logline.CANNOT_WRITE_LOG % (Config.log_file, "No such file or directory")]
    assert logline.LOST == 3


# -- the readers: a damaged line skipped, the rest kept ------------------------------------------

def damaged_log(path: str) -> None:
    """c0, then c1 cut short with c2 appended to it (what a full disk left before), garbage,
    a line nested too deep for a parser, c3."""
    with open(path, "wb") as f:
        f.write(create(0))
        f.write(create(1)[:37])  # half of c1: no newline
        f.write(create(2))
        f.write(b"garbage\n")
        f.write(b"[" * 200000 + b"\n")
        f.write(create(3))


def test_gpuhook_log_skips_a_damaged_line_and_keeps_the_rest(tmp_path):
    path = str(tmp_path / "gpuhook.log")
    damaged_log(path)
    records, skipped = log.tail_records(path, 100)
    assert ids(records) == ["c0", "c2", "c3"] and skipped == 3  # half c1, garbage, the deep one
    r = gpuhook("log", "--file", path, "--json", timeout=30)
    assert r.returncode == 0 and [json.loads(x)["container_id"] for x in r.stdout.splitlines()] == ["c0", "c2", "c3"]


def test_the_agent_skips_a_damaged_line_and_keeps_the_rest(tmp_path):
    path = str(tmp_path / "gpuhook.log")
    damaged_log(path)
    assert followed(path) == ["c0", "c2", "c3"]


def test_the_agent_reads_a_line_only_when_it_is_whole(tmp_path):
    """The agent may read a line's first bytes before its writer finds it did not fit and
    blanks them (or cuts them off): what it read of an unfinished line is read again, so that
    the next line is never joined to bytes no longer there."""
    path = tmp_path / "gpuhook.log"
    path.write_bytes(create(0))
    seen: list[str] = []

    class Consumer:
        def handle(self, rec):
            seen.append(rec["container_id"])

    f = follow.CreateFollower(str(path), [Consumer()], log.get(), from_start=True)
    assert f.read_new(first=True) == 1
    for undo in ("blank", "cut"):
        start = path.stat().st_size
        with open(path, "ab") as out:
            out.write(create(9)[:50])  # a line being written
        assert f.read_new() == 0
        if undo == "blank":  # logline.undo_short_write
            with open(path, "r+b") as out:
                out.seek(start)
                out.write(b" " * 49 + b"\n")
        else:  # its fallback, on a full copy-on-write file system
            os.truncate(path, start)
        with open(path, "ab") as out:
            out.write(create(1 if undo == "blank" else 2))
        assert f.read_new() == 1
    assert seen == ["c0", "c1", "c2"]


def test_the_agent_started_mid_line_skips_its_rest(tmp_path):
    """From the end at its start: a line being written there is not half read."""
    path = tmp_path / "gpuhook.log"
    path.write_bytes(create(0) + create(1)[:30])
    seen: list[str] = []

    class Consumer:
        def handle(self, rec):
            seen.append(rec["container_id"])

    f = follow.CreateFollower(str(path), [Consumer()], log.get())
    assert f.read_new(first=True) == 0
    with open(path, "ab") as out:
        out.write(create(1)[30:] + create(2))
    assert f.read_new() == 1 and seen == ["c2"]
