"""The agent's shape (issue 35 item 6): the loop and its sinks, the node log's tail, the pod
Events, the API client, each a module of its own that can be read and tested alone, none over
MAX_LINES lines."""

from __future__ import annotations

import os

from conftest import REPO

AGENT = os.path.join(REPO, "gpuhook", "agent")
MAX_LINES = 300


def test_no_agent_module_is_over_300_lines():
    sizes = {}
    for name in sorted(os.listdir(AGENT)):
        if name.endswith(".py"):
            with open(os.path.join(AGENT, name), "rb") as f:
                sizes[name] = sum(1 for _ in f)
    assert {"core.py", "podevents.py", "follow.py", "kube.py", "kubeclient.py"} <= set(sizes)  # the walk saw them
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
