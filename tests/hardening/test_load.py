"""Load: 64 containers created at once through gpuhook-runtime on a fake 8-GPU node.

Every one starts with all the node's devices; the state the creates share stays consistent
while they run: the log has one whole JSON object per line (no torn or interleaved lines),
the probe and config caches in GPUHOOK_CACHE_DIR parse whenever they are read."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from conftest import needs_runc, nodes_of
from fakes.front import parse_cache_file

pytestmark = needs_runc

N = 64
GPUS = 8
SHOW = ("echo started; echo accel=$GPUHOOK_ACCELERATOR; echo devices=$GPUHOOK_DEVICES; "
        "for n in /dev/nvidia*; do [ -e $n ] && stat -c 'node %n %t:%T' $n; done; true")


class Reader(threading.Thread):
    """Reads every cache file over and over while the creates run; records what did not parse."""

    def __init__(self, cache_dir: str) -> None:
        super().__init__(daemon=True)
        self.cache_dir = cache_dir
        self.stop = threading.Event()
        self.reads = 0
        self.bad: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            for name in cache_files(self.cache_dir):
                try:
                    with open(os.path.join(self.cache_dir, name), "rb") as f:
                        data = f.read()
                except FileNotFoundError:
                    continue
                try:
                    parse_cache_file(name, data)
                    self.reads += 1
                except ValueError as e:
                    self.bad.append(f"{name}: {e}: {data[:120]!r}")
            self.stop.wait(0.001)


def cache_files(cache_dir: str, hidden: bool = False) -> list[str]:
    """The cache files and exec records under cache_dir (relative paths); the hidden temp
    files of writers only when asked."""
    out = []
    for d, _, files in os.walk(cache_dir):
        out += [os.path.relpath(os.path.join(d, n), cache_dir) for n in files if hidden or not n.startswith(".")]
    return sorted(out)


def test_64_containers_at_once_on_an_8_gpu_node(make_host, runtime):
    root = make_host("nvidia", mknod=True, gpus=GPUS)
    rt = runtime(root)
    bundles = [rt.bundle(f"b{i}", ["sh", "-c", SHOW]) for i in range(N)]
    reader = Reader(rt.env["GPUHOOK_CACHE_DIR"])
    reader.start()
    start = threading.Barrier(N)

    def one(i: int):
        start.wait()
        return rt.run(bundles[i], f"load-{i}", timeout=180)

    try:
        with ThreadPoolExecutor(N) as pool:
            results = list(pool.map(one, range(N)))
    finally:
        reader.stop.set()
        reader.join()
    want = {f"/dev/nvidia{m}": (195, m) for m in range(GPUS)}
    want.update({"/dev/nvidiactl": (195, 255), "/dev/nvidia-uvm": (510, 0), "/dev/nvidia-uvm-tools": (510, 1)})
    for i, r in enumerate(results):
        assert r.returncode == 0, f"load-{i}: {r.stderr}"
        assert "started" in r.stdout and "accel=nvidia" in r.stdout, f"load-{i}: {r.stdout}"
        nodes = nodes_of(r.stdout)
        assert {p: nodes.get(p) for p in want} == want, f"load-{i}: {nodes}"
        devices = next(line for line in r.stdout.splitlines() if line.startswith("devices="))
        assert devices.count("nvidia:GPU-") == GPUS, devices
    assert not reader.bad, f"cache files read torn: {reader.bad[:5]}"
    assert reader.reads > 0
    # the log: exactly one whole JSON line per create, nothing interleaved
    with open(rt.log, "rb") as f:
        data = f.read()
    assert data.endswith(b"\n")
    records = [json.loads(line) for line in data.split(b"\n")[:-1]]
    assert all(isinstance(r, dict) for r in records)
    assert sorted(r["container_id"] for r in records) == sorted(f"load-{i}" for i in range(N))
    assert all(r["decision"] == "injected" and r["vendors"] == ["nvidia"] for r in records), \
        [r for r in records if r["decision"] != "injected"][:3]
    # the caches as the last writer left them, and no temp file of a finished writer
    cache_dir = rt.env["GPUHOOK_CACHE_DIR"]
    left = cache_files(cache_dir, hidden=True)
    assert not [n for n in left if os.path.basename(n).startswith(".")], left
    assert not [n for n in left if n.startswith("exec/")]  # foreground runs: no record outlives them
    for name in left:
        with open(os.path.join(cache_dir, name), "rb") as f:
            parse_cache_file(name, f.read())
    # the ld-cache hook ran in every container's own rootfs
    from gpuhook.probe import ldcache

    for b in bundles:
        with open(os.path.join(b, "rootfs", "etc", "ld.so.cache"), "rb") as f:
            assert "libcuda.so.1" in ldcache.lookup(ldcache.parse(f.read()))
