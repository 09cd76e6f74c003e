"""The agent goes on reading the node log where the last agent stopped (follow.CreateFollower's
position file): the creates made while no agent ran (its pod deleted, a rolling update) get
their Events too, none twice; another file at the log's path, a shorter one, or a position
file that cannot be read: the log's end, as with no file."""

from __future__ import annotations

import json
import os

from conftest import create_line as create
from gpuhook import log
from gpuhook.agent import follow


class Seen:
    def __init__(self):
        self.pods: list[str] = []

    def handle(self, rec):
        self.pods.append(rec["pod_name"])


def append(path, *pods):
    with open(path, "a") as f:
        for p in pods:
            f.write(json.dumps(create(pod=p)) + "\n")


def agent(path, position, seen=None):
    f = follow.CreateFollower(str(path), [seen or Seen()], log.get(), position_file=str(position))
    f.read_new(first=True)
    return f


def test_a_new_agent_reads_what_was_written_while_none_ran_and_nothing_twice(tmp_path, logs):
    path, position = tmp_path / "gpuhook.log", tmp_path / "state" / "position.json"
    append(path, "before-any-agent")
    first = Seen()
    f = agent(path, position, first)
    assert first.pods == [] and json.loads(position.read_text())["offset"] == path.stat().st_size
    append(path, "a")
    f.read_new()
    assert first.pods == ["a"]
    append(path, "while-away-1", "while-away-2")  # the agent's pod is gone
    second = Seen()
    agent(path, position, second)
    assert second.pods == ["while-away-1", "while-away-2"]
    assert [x["behind"] > 0 for x in logs() if x["event"] == "creates.catching_up"] == [True]
    third = Seen()
    agent(path, position, third)  # nothing new: nothing read again
    assert third.pods == []


def test_without_the_position_file_a_new_agent_starts_at_the_end(tmp_path, logs):
    path, position = tmp_path / "gpuhook.log", tmp_path / "position.json"
    append(path, "old")
    agent(path, position)
    append(path, "while-away")
    seen = Seen()
    f = follow.CreateFollower(str(path), [seen], log.get())  # no position file (--log-position '')
    f.read_new(first=True)
    assert seen.pods == []


def test_another_or_shorter_file_or_a_damaged_position_starts_at_the_end(tmp_path, logs):
    path, position = tmp_path / "gpuhook.log", tmp_path / "position.json"
    append(path, "a", "b")
    agent(path, position)
    saved = position.read_text()
    os.rename(path, tmp_path / "gpuhook.log.1")  # rotated while no agent ran
    append(path, "new-file")
    seen = Seen()
    agent(path, position, seen)
    assert seen.pods == []
    path.write_text(json.dumps(create(pod="short")) + "\n")  # cut back below the kept offset
    position.write_text(json.dumps({**json.loads(position.read_text()), "offset": 10**6}))
    seen = Seen()
    agent(path, position, seen)
    assert seen.pods == []
    for bad in ("{", "[]", json.dumps({"dev": 1}), saved.replace('"offset": ', '"offset": "x'), ""):
        position.write_text(bad)
        append(path, "more")
        seen = Seen()
        agent(path, position, seen)
        assert seen.pods == [], bad


def test_a_position_that_cannot_be_written_is_said_once_and_the_agent_goes_on(tmp_path, logs):
    path = tmp_path / "gpuhook.log"
    (tmp_path / "file").write_text("")
    seen = Seen()
    f = agent(path, tmp_path / "file" / "position.json", seen)  # under a file: ENOTDIR
    for p in ("a", "b"):
        append(path, p)
        f.read_new()
    assert seen.pods == ["a", "b"]
    assert [x["event"] for x in logs()].count("creates.position_error") == 1
