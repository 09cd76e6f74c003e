#!/usr/bin/env python3
"""Benchmark gpuhook-runtime against plain runc, in one run (root; runc and busybox-static).

Each figure is the median over N pairs (8N for the exec rows), each pair run in a fresh random
order after a short pause, of the milliseconds the wrapper adds over runc alone:

  pass-through   `state <unknown id>` through gpuhook-runtime vs runc             budget  3 ms
  cpu create     create+start+delete of busybox `true` on a CPU-only node         budget 15 ms
  8-GPU create   the same on a fake 8-GPU NVIDIA node: the wrapper and its hook
                 vs runc alone given the same devices and mounts, no hooks         budget 35 ms
  exec plain     `exec --process FILE` (as containerd's shim calls it) of `true` into a
                 running container gpuhook did not inject, on the GPU node           budget  1 ms
  exec injected  the same into a container gpuhook injected (the wrapper adds the
                 recorded GPUHOOK_* env to the process file) vs runc into it        budget 20 ms

The work happens on a tmpfs of its own, as on a real node, where containerd keeps its
bundles (and so config.json) under /run, a tmpfs; /run/gpuhook's caches are there too.

Usage: tests/perf/bench.py [--pairs N] [--json FILE] [--case NAME]...
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from gpuhook.testing import bundle, fakehost  # noqa: E402

BUDGETS = {"pass-through": 3.0, "cpu create": 15.0, "8-GPU create": 35.0, "exec plain": 1.0,
           "exec injected": 20.0}


EXEC_PAIRS_FACTOR = 8
PAUSE_S = 0.02


def wrapper_path() -> str:
    p = os.path.join(os.path.dirname(sys.executable), "gpuhook-runtime")
    return p if os.path.exists(p) else shutil.which("gpuhook-runtime")


def timed(cmds: list[list[str]], env: dict, check_first: bool = False) -> float:
    # stderr goes to a file: a pipe would stay open in the container until it exits
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        for i, c in enumerate(cmds):
            r = subprocess.run(c, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
            if check_first and i == 0 and r.returncode != 0:
                err.seek(0)
                raise SystemExit(f"{' '.join(c[:6])}... failed: {err.read().decode(errors='replace').strip()}")
        return (time.perf_counter() - t) * 1000


def lifecycle(binary: str, state: str, bundle_dir: str, cid: str) -> list[list[str]]:
    return [[binary, "--root", state, "create", "--bundle", bundle_dir, cid],
            [binary, "--root", state, "start", cid],
            [binary, "--root", state, "delete", "--force", cid]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=25)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--case", action="append", choices=sorted(BUDGETS), help="only this case (repeatable)")
    args = ap.parse_args()
    runc = shutil.which("runc")
    wrapper = wrapper_path()
    if os.geteuid() != 0 or not runc or not wrapper or not bundle.find_busybox():
        print("bench: needs root, runc, busybox-static and an installed gpuhook-runtime", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="gpuhook-bench-")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g,mode=0700", "gpuhook-bench", tmp]).returncode == 0
    if not mounted:
        print("bench: could not mount a tmpfs; measuring on", tmp, file=sys.stderr)
    try:
        state = os.path.join(tmp, "state")
        b = os.path.join(tmp, "bundle")
        bundle.make_bundle(b, ["true"])
        with open(os.path.join(b, "config.json"), "rb") as f:
            original = f.read()
        cpu_root = os.path.join(tmp, "cpu-host")
        fakehost.build(cpu_root, "cpu")
        gpu_root = os.path.join(tmp, "gpu-host")
        fakehost.build(gpu_root, "nvidia", mknod=True)
        env = dict(os.environ, GPUHOOK_CACHE_DIR=os.path.join(tmp, "cache"))
        configs = {}
        for name, root in (("cpu", cpu_root), ("gpu", gpu_root)):
            configs[name] = os.path.join(tmp, f"{name}.toml")
            with open(configs[name], "w") as f:
                f.write(f'runtime = "{runc}"\nhost_root = "{root}"\nlog_file = "{tmp}/gpuhook.log"\n')

        # runc's side of the 8-GPU figure: the spec gpuhook makes, minus gpuhook's hooks
        subprocess.run([sys.executable, "-m", "gpuhook", "precreate", "--root", gpu_root],
                       input=original, stdout=open(os.path.join(tmp, "gpu.json"), "wb"), check=True,
                       env=env, cwd=os.path.dirname(os.path.dirname(HERE)))
        with open(os.path.join(tmp, "gpu.json")) as f:
            gpu_spec = json.load(f)
        gpu_spec["root"]["path"] = "rootfs"
        gpu_spec.pop("hooks", None)
        gpu_plain = json.dumps(gpu_spec).encode()

        def set_spec(data: bytes) -> None:
            with open(os.path.join(b, "config.json"), "wb") as f:
                f.write(data)

        # running containers to exec into: one started by runc alone, one through the wrapper
        # on the GPU node (injected: it has an exec record)
        gpu_env = dict(env, GPUHOOK_CONFIG=configs["gpu"])
        for cid, binary in (("xplain", runc), ("xgpu", wrapper)):
            xb = os.path.join(tmp, f"bundle-{cid}")
            bundle.make_bundle(xb, ["sleep", "100000"])
            for step in (["create", "--bundle", xb, cid], ["start", cid]):
                subprocess.run([binary, "--root", state, *step], env=gpu_env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, check=True)
        def process_json(args: list[str]) -> bytes:
            return json.dumps({"terminal": False, "user": {"uid": 0, "gid": 0}, "args": args,
                               "env": ["PATH=/usr/bin:/bin"], "cwd": "/"}).encode()
        process = process_json(["true"])

        # the wrapper's exec into the injected one does add the env (else this measures nothing)
        p = os.path.join(tmp, "runc-process")
        with open(p, "wb") as f:
            f.write(process_json(["sh", "-c", "echo $GPUHOOK_ACCELERATOR"]))
        seen = subprocess.run([wrapper, "--root", state, "exec", "--process", p, "xgpu"], env=gpu_env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if seen.stdout.strip() != "nvidia":
            raise SystemExit(f"bench: exec into the injected container does not see GPUHOOK_ACCELERATOR: "
                             f"{seen.stdout!r} {seen.stderr!r}")

        def exec_cmds(binary: str, cid: str) -> list[list[str]]:
            p = os.path.join(tmp, "runc-process")  # fresh for each run: the wrapper rewrites it
            with open(p, "wb") as f:
                f.write(process)
            return [[binary, "--root", state, "exec", "--process", p, cid]]

        results = {}
        cases = {
            "pass-through": (lambda: (None, [[runc, "--root", state, "state", "nope"]]),
                             lambda: (None, [[wrapper, "--root", state, "state", "nope"]]), "cpu"),
            "cpu create": (lambda: (original, lifecycle(runc, state, b, "c")),
                           lambda: (original, lifecycle(wrapper, state, b, "c")), "cpu"),
            "8-GPU create": (lambda: (gpu_plain, lifecycle(runc, state, b, "g")),
                             lambda: (original, lifecycle(wrapper, state, b, "g")), "gpu"),
            "exec plain": (lambda: (None, exec_cmds(runc, "xplain")),
                           lambda: (None, exec_cmds(wrapper, "xplain")), "gpu"),
            "exec injected": (lambda: (None, exec_cmds(runc, "xgpu")),
                              lambda: (None, exec_cmds(wrapper, "xgpu")), "gpu"),
        }
        for name, (base, wrapped, cfg) in cases.items():
            if args.case and name not in args.case:
                continue
            e = dict(env, GPUHOOK_CONFIG=configs[cfg])
            pairs = []
            # the exec figures are a millisecond out of ~15: eight times the pairs (they are quick)
            n = args.pairs * (EXEC_PAIRS_FACTOR if name.startswith("exec") else 1)
            for i in range(n + 2):  # two warm-up pairs
                times = [0.0, 0.0]
                # each side once per round, in a fresh random order, after a short pause: a strict
                # alternation lets one side absorb the other's asynchronous teardown
                for side in random.sample((0, 1), 2):
                    data, cmds = (base, wrapped)[side]()
                    if data is not None:
                        set_spec(data)
                    time.sleep(PAUSE_S)
                    times[side] = timed(cmds, e, check_first=data is not None or name.startswith("exec"))
                if i >= 2:
                    pairs.append(times)
            added = statistics.median(w - r for r, w in pairs)
            results[name] = {"runc_ms": round(statistics.median(r for r, _ in pairs), 2),
                             "wrapper_ms": round(statistics.median(w for _, w in pairs), 2),
                             "added_ms": round(added, 2), "budget_ms": BUDGETS[name], "pairs": len(pairs)}
        print(f"{'case':<14} {'runc ms':>9} {'gpuhook ms':>11} {'added ms':>9} {'budget':>7}")
        ok = True
        for name, r in results.items():
            within = r["added_ms"] <= r["budget_ms"]
            ok &= within
            print(f"{name:<14} {r['runc_ms']:>9.2f} {r['wrapper_ms']:>11.2f} {r['added_ms']:>9.2f} "
                  f"{r['budget_ms']:>7.1f}  {'ok' if within else 'OVER'}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
        return 0 if ok else 1
    finally:
        subprocess.run(["runc", "--root", os.path.join(tmp, "state"), "delete", "--force", "c"], capture_output=True)
        subprocess.run(["runc", "--root", os.path.join(tmp, "state"), "delete", "--force", "g"], capture_output=True)
        for cid in ("xplain", "xgpu"):
            subprocess.run(["runc", "--root", os.path.join(tmp, "state"), "delete", "--force", cid], capture_output=True)
        if mounted:
            subprocess.run(["umount", "-l", tmp])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
