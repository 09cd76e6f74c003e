"""Shared fixtures: fake GPU hosts, busybox bundles, the installed gpuhook-runtime."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from gpuhook import bundle, fakehost  # noqa: E402

FIXTURES = os.path.join(REPO, "tests", "fixtures")


def is_root() -> bool:
    return os.geteuid() == 0


def wrapper_path() -> str | None:
    """The gpuhook-runtime that `pip install .` put next to this interpreter (make test)."""
    p = os.path.join(os.path.dirname(sys.executable), "gpuhook-runtime")
    return p if os.path.exists(p) else shutil.which("gpuhook-runtime")


# `make test` as root sets GPUHOOK_REQUIRE_E2E=1: there a missing tool fails the end-to-end
# tests instead of skipping them, so CI cannot pass without running them.
REQUIRE_E2E = os.environ.get("GPUHOOK_REQUIRE_E2E") == "1"


def requires(ok: bool, reason: str):
    """skipif for end-to-end tests, except where they are required."""
    return pytest.mark.skipif(not ok and not REQUIRE_E2E, reason=reason)


needs_runc = requires(
    bool(is_root() and shutil.which("runc") and bundle.find_busybox() and wrapper_path()),
    "needs root, runc, busybox-static and an installed gpuhook-runtime (make test sets them up)")


@pytest.fixture
def make_host(tmp_path):
    """make_host("nvidia", mknod=True) -> path of a fake host root."""
    def make(scenario: str, mknod: bool | None = None, name: str | None = None, **kw) -> str:
        root = str(tmp_path / (name or f"host-{scenario.replace('+', '-')}"))
        if kw:
            fh = fakehost.FakeHost(root, mknod=is_root() if mknod is None else mknod)
            getattr(fakehost, scenario)(fh, **kw)
        else:
            fakehost.build(root, scenario, mknod=mknod)
        return root
    return make


class Runtime:
    """Runs containers through gpuhook-runtime with a node config of the test's own."""

    def __init__(self, tmp_path, host_root: str, **config):
        self.tmp = tmp_path
        self.state = str(tmp_path / "runc-state")
        self.log = str(tmp_path / "gpuhook.log")
        self.config = str(tmp_path / "gpuhook.toml")
        lines = [f'host_root = "{host_root}"', f'log_file = "{self.log}"']
        lines += [f'{k} = "{v}"' for k, v in config.items()]
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.env = dict(os.environ, GPUHOOK_CONFIG=self.config, GPUHOOK_CACHE_DIR=str(tmp_path / "cache"))
        self.ids: list[str] = []

    def bundle(self, name: str, args: list[str], **kw) -> str:
        b = str(self.tmp / name)
        bundle.make_bundle(b, args, **kw)
        return b

    def run(self, bundle_dir: str, cid: str, binary: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
        binary = binary or wrapper_path()
        self.ids.append(cid)
        return subprocess.run([binary, "--root", self.state, "--log", str(self.tmp / f"{cid}.runc.log"),
                               "--log-format", "json", "run", "--bundle", bundle_dir, cid],
                              env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def log_records(self) -> list[dict]:
        import json

        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [json.loads(line) for line in f if line.strip()]

    def cleanup(self) -> None:
        for cid in self.ids:
            subprocess.run(["runc", "--root", self.state, "delete", "--force", cid], capture_output=True)


@pytest.fixture
def runtime(tmp_path):
    made = []

    def make(host_root: str, **config) -> Runtime:
        rt = Runtime(tmp_path, host_root, **config)
        made.append(rt)
        return rt
    yield make
    for rt in made:
        rt.cleanup()
