#!/usr/bin/env python3
"""Benchmark gpuhook-runtime, plain runc and (when given) NVIDIA's nvidia-container-runtime in
CDI mode, in one run, on the same fake hosts (root; runc, busybox-static, gcc).

gpuhook is measured as installed on nodes: the host bundle gpuhook/install/build.py builds
(its C front, its own interpreter run by its own loader), with the node's resident runtime
server running (`gpuhook runtime-server`, systemd/gpuhook-runtime.socket); the "no server"
rows show the same creates with no server (the front starts the bundle's Python). The peer: `--peer-dir DIR`
(or PEER_DIR) holding its bin.tar.xz or bin/ (../shared/peer/nvidia-container-toolkit/
README.md), configured in CDI mode with the spec its own generator writes for each fake
host (`nvidia-ctk cdi generate --mode=nvml`, over the NVML stub nvml-stub.c built into the
host) and its default hooks. Before anything is timed, a container started through each
runtime on each GPU host must show the GPU nodes and libcuda in its ld cache.

Each round runs every runtime once, in a fresh random order, each after a short pause (a
fixed alternation lets one side absorb the other's asynchronous teardown); a figure is the
median over rounds of the difference to runc (or to /bin/true for the "alone" rows) in
the same round; the rows with a budget of a millisecond or so (FINE) get four times the
rounds. Rows (budgets from issues 10 and 14, checked at the end):

  pass-through         `state <unknown id>`                                        <= 1 ms
  cpu create           `create` alone on a CPU-only node                            <= 1.5 ms
  cpu create alone     the same with `/bin/true` as the real runtime: the front's own cost
  cpu lifecycle        create+start+delete of busybox `true` on a CPU-only node
  8-GPU alone          the wrapper's create with `/bin/true` as the real runtime    <= 11 ms (total)
  ..., no server       the same two rows with no runtime server (a fresh interpreter per create)
  8-GPU lifecycle      create+start+delete on 8 GPUs, the wrapper and its hooks vs
                       runc given the same devices and mounts (gpuhook's), no hook  <= 15 ms
  16-GPU lifecycle     the same on 16 GPUs
  ld3000 lifecycle     8 GPUs, a host ld.so.cache of 3,000 entries (warm probe cache)
  cold probe 5/3000    8-GPU alone with the probe cache off, host ld cache of the
                       driver's libraries only, or 3,000 entries                    3000 - 5 <= 2 ms
  MI300X lifecycle     AMD MI300X, 8 GPUs x 8 partitions (CPX): 64 devices (no peer: NVIDIA only)
  exec plain           `exec --process FILE` into a container gpuhook did not inject <= 1 ms
  exec injected        the same into one it injected (the recorded env added)
  16 at once           16 lifecycles started together on 8 GPUs: wall, as a ratio
                       to runc given the same devices                               <= 1.35x
  NRI 8-GPU create+start  CRI create+start on containerd 2.1 (the sid root) of a gpu-optional
                       pod through `gpuhook nri` vs a runc pod on a containerd with no
                       plugin, and the plugin's RSS after serving (bench_nri.py)    <= 3 ms
  DRA 1-GPU claim create+start  `gpuhook dra`'s NodePrepareResources for a claim of one GPU,
                       then CRI create+start with the CDI ids it answered, vs a runc pod
                       with no devices, on the same containerd (bench_dra.py)      <= 3 ms

Then: peak RSS of each wrapper (alone) and of each createContainer hook, measured by
tests/perf/rss.c (fork/exec/wait4 from a small process: a child of this Python would
inherit its high-water mark); where gpuhook's create time goes (`-X importtime` of a
create, and the in-process stages the runtime logs with GPUHOOK_STAGES set).

The work happens on a tmpfs of its own, as on a real node (containerd's bundles are under
/run). Usage: tests/perf/bench.py [--rounds N] [--peer-dir DIR] [--json FILE] [--case NAME]...
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
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [REPO, os.path.dirname(HERE)]  # gpuhook, and the fakes the tests share

from fakes import bundle, fakehost, runtime_server  # noqa: E402

PAUSE_S = 0.02
# the rows whose budget is a millisecond or so out of runc's ~5 to 30 (and its spread of a few):
# four times the rounds (they are quick)
FINE = ("pass-through", "cpu create", "exec plain", "exec injected", "NRI 8-GPU create+start",
        "DRA 1-GPU claim create+start")
FINE_FACTOR = 4
NRI_ROW = "NRI 8-GPU create+start"  # bench_nri.py
DRA_ROW = "DRA 1-GPU claim create+start"  # bench_dra.py
BURST = 16
BURST_ROUNDS = 5
PAD_ENTRIES = 3000
DRIVER = "550.54.14"

# (row, what is compared, budget, how): "added" rows compare the median per-round difference
BUDGETS = {
    "pass-through": (1.0, "added"),
    "cpu create": (1.5, "added"),
    "8-GPU alone": (11.0, "total"),
    "8-GPU lifecycle": (15.0, "added"),
    "exec plain": (1.0, "added"),
    "exec injected": (20.0, "added"),
    "cold probe 3000-5": (2.0, "added"),
    "16 at once": (1.35, "ratio"),
    "wrapper peak RSS MiB": (10.0, "value"),
    "NRI 8-GPU create+start": (3.0, "added"),
    # the NRI row's promise for the claim: what gpuhook adds to a runc pod's container start
    "DRA 1-GPU claim create+start": (3.0, "added"),
}
CASES = ("pass-through", "cpu create", "cpu create alone", "cpu lifecycle", "8-GPU alone", "8-GPU alone, no server", "8-GPU lifecycle",
         "8-GPU lifecycle, no server", "16-GPU lifecycle",
         "ld3000 lifecycle", "cold probe", "MI300X lifecycle", "exec plain", "exec injected", "16 at once",
         "NRI 8-GPU create+start", "DRA 1-GPU claim create+start")


def run_quiet(cmd: list[str], env: dict, err) -> int:
    # stderr to a file: a pipe would stay open in the container until it exits
    return subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err).returncode


def timed(cmds: list[list[str]], env: dict, n_timed: int, check: bool) -> float:
    """Run cmds in order; the ms the first n_timed took."""
    with tempfile.TemporaryFile() as err:
        ms = 0.0
        for i, c in enumerate(cmds):
            t = time.perf_counter()
            rc = run_quiet(c, env, err)
            if i < n_timed:
                ms += (time.perf_counter() - t) * 1000
            if check and i == 0 and rc != 0:
                err.seek(0)
                raise SystemExit(f"bench: {' '.join(c[:6])}... failed: {err.read().decode(errors='replace').strip()}")
        return ms


def lifecycle(binary: str, state: str, bundle_dir: str, cid: str) -> list[list[str]]:
    return [[binary, "--root", state, "create", "--bundle", bundle_dir, cid],
            [binary, "--root", state, "start", cid],
            [binary, "--root", state, "delete", "--force", cid]]


def build_tool(tmp: str, src: str, name: str, *flags: str) -> str:
    out = os.path.join(tmp, name)
    subprocess.run(["gcc", "-O2", *flags, "-o", out, src], check=True)
    return out


def pad_ld_cache(root: str, n: int) -> int:
    """n more libraries in the host's ld.so.cache (real ELF, distinct sonames); its entry count."""
    fh = fakehost.FakeHost(root, mknod=True)
    pad = "/usr/lib/bench-pad"
    os.makedirs(fh.p(pad), exist_ok=True)
    src = fh.p(pad + "/t.c")
    with open(src, "w") as f:
        f.write("int bench_pad(void) { return 0; }\n")
    tmpl = fh.p(pad + "/t.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libbenchpad0000.so.1", "-o", tmpl, src], check=True)
    data = open(tmpl, "rb").read()
    os.unlink(src)
    os.unlink(tmpl)
    for i in range(n):
        name = f"libbenchpad{i:04d}"
        with open(fh.p(f"{pad}/{name}.so.1"), "wb") as f:
            f.write(data.replace(b"libbenchpad0000", name.encode()))
    fh.ldconfig([fakehost.HOST_LIBDIR, pad])
    return ld_entries(root)


def ld_entries(root: str) -> int:
    ldc = shutil.which("ldconfig") or "/sbin/ldconfig"
    out = subprocess.run([ldc, "-p", "-C", os.path.join(root, "etc/ld.so.cache")], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out.split() and out.split()[0].isdigit() else -1


class Peer:
    """NVIDIA's runtime in CDI mode: its binaries, and a CDI spec per fake host."""

    def __init__(self, peer_dir: str, tmp: str):
        self.tmp = os.path.join(tmp, "peer")
        os.makedirs(self.tmp)
        bindir = os.path.join(peer_dir, "bin")
        if not os.path.isdir(bindir):
            subprocess.run(["tar", "-xJf", os.path.join(peer_dir, "bin.tar.xz"), "-C", self.tmp], check=True)
            bindir = os.path.join(self.tmp, "bin")
        self.bin = bindir
        self.runtime = os.path.join(bindir, "nvidia-container-runtime")
        self.stub = os.path.join(peer_dir, "nvml-stub.c")
        self.version = subprocess.run([self.runtime, "--version"], capture_output=True, text=True).stdout.split("\n")[0]

    def host(self, name: str, root: str, gpus: int) -> str:
        """Its NVML stub into the host, its spec for it; the spec directory."""
        lib = os.path.join(root, fakehost.HOST_LIBDIR.lstrip("/"), f"libnvidia-ml.so.{DRIVER}")
        subprocess.run(["gcc", "-shared", "-fPIC", f"-DNGPU={gpus}", f'-DDRIVER="{DRIVER}"',
                        "-Wl,-soname,libnvidia-ml.so.1", "-o", lib, self.stub], check=True)
        cdi = os.path.join(self.tmp, f"cdi-{name}")
        os.makedirs(cdi)
        r = subprocess.run([os.path.join(self.bin, "nvidia-ctk"), "cdi", "generate", "--mode=nvml",
                            f"--driver-root={root}", f"--nvidia-cdi-hook-path={self.bin}/nvidia-cdi-hook",
                            f"--output={cdi}/nvidia.yaml"], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"bench: nvidia-ctk cdi generate failed for {name}: {r.stderr.strip()[-500:]}")
        return cdi

    def config(self, name: str, cdi: str | None, runtime: str) -> str:
        path = os.path.join(self.tmp, f"{name}.toml")
        with open(path, "w") as f:
            f.write(f'[nvidia-container-runtime]\nmode = "cdi"\nruntimes = ["{runtime}"]\nlog-level = "info"\n'
                    f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{cdi or os.path.join(self.tmp, "none")}"]\n'
                    'default-kind = "nvidia.com/gpu"\nannotation-prefixes = ["cdi.k8s.io/"]\n')
        return path


def with_env(spec_bytes: bytes, extra: list[str]) -> bytes:
    spec = json.loads(spec_bytes)
    spec["process"]["env"] = spec["process"]["env"] + extra
    return json.dumps(spec).encode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--peer-dir", default=os.environ.get("PEER_DIR") or None)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--case", action="append", choices=CASES, help="only this case (repeatable)")
    args = ap.parse_args()
    runc = shutil.which("runc")
    if os.geteuid() != 0 or not runc or not bundle.find_busybox() or not shutil.which("gcc"):
        print("bench: needs root, runc, busybox-static and gcc", file=sys.stderr)
        return 2
    want = set(args.case or CASES)
    tmp = tempfile.mkdtemp(prefix="gpuhook-bench-")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g,mode=0700", "gpuhook-bench", tmp]).returncode == 0
    if not mounted:
        print("bench: could not mount a tmpfs; measuring on", tmp, file=sys.stderr)
    state = os.path.join(tmp, "state")
    started_ids: list[str] = []
    servers: list[subprocess.Popen] = []
    try:
        rc = bench(args, want, tmp, state, runc, started_ids, servers) if want - {NRI_ROW, DRA_ROW} else 0
        if NRI_ROW in want:
            rc = nri(args, tmp) or rc
        if DRA_ROW in want:
            rc = dra(args, tmp) or rc
        return rc
    finally:
        for srv in servers:
            srv.terminate()
            srv.wait(timeout=10)
        for cid in started_ids:
            subprocess.run([runc, "--root", state, "delete", "--force", cid], capture_output=True)
        if mounted:
            subprocess.run(["umount", "-l", tmp])
        shutil.rmtree(tmp, ignore_errors=True)


def nri(args, tmp: str) -> int:
    """The NRI row (bench_nri.py): printed, added to --json, its budget checked."""
    from bench_nri import nri_row

    row, mem = nri_row(args.rounds * FINE_FACTOR, tmp)
    rows = {NRI_ROW: row}
    ok = within(NRI_ROW, rows)
    budget = BUDGETS[NRI_ROW][0]
    print(f"\n{NRI_ROW} on containerd 2.1 (sid), {row['rounds']} rounds: runc pod, no plugin {row['ms']['runc']:.2f} ms; "
          f"gpu-optional pod through gpuhook's plugin {row['ms']['gpuhook']:.2f} ({row['added']['gpuhook']:+.2f}, "
          f"budget {budget:g} ms: {'ok' if ok else 'OVER'}); runc pod beside the plugin {row['ms']['other']:.2f} "
          f"({row['added']['other']:+.2f}); runc pod given the plugin's devices and mounts by CRI, no plugin "
          f"{row['ms']['same']:.2f} ({row['added']['same']:+.2f}); gpu-optional pod through a plugin with no ld-cache hook "
          f"{row['ms']['no hook']:.2f} ({row['added']['no hook']:+.2f}); the same with a hook that does nothing "
          f"{row['ms']['noop hook']:.2f} ({row['added']['noop hook']:+.2f})")
    print(f"  the NRI plugin after serving, MiB: resident {mem['rss']}, peak {mem['hwm']}; "
          f"its own time per create (its log lines' duration_ms, median): {mem['plugin_ms']} ms")
    _add_to_json(args.json, NRI_ROW, row, "nri_plugin_mib", mem)
    return 0 if ok else 1


def _add_to_json(path: str | None, name: str, row: dict, key: str, extra: dict) -> None:
    """One row measured on its own (NRI, DRA) put into --json's file beside what is there."""
    if not path:
        return
    data = json.load(open(path)) if os.path.exists(path) else {"rows": {}}
    data["rows"][name] = row
    data[key] = extra
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def dra(args, tmp: str) -> int:
    """The DRA row (bench_dra.py): printed, added to --json, its budget checked."""
    from bench_dra import dra_row

    row, mem = dra_row(args.rounds * FINE_FACTOR, tmp)
    rows = {DRA_ROW: row}
    ok = within(DRA_ROW, rows)
    ms, added, prep = row["ms"], row["added"], mem["prepare_ms"]

    def side(k: str) -> str:
        return f"{ms[k]:.2f} ({added[k]:+.2f}, {ms[k] / ms['runc']:.2f}x)"

    print(f"\n{DRA_ROW} on containerd 2.1 (sid), {row['rounds']} rounds: runc pod, no devices {ms['runc']:.2f} ms; "
          f"a gpuhook.dev claim of one GPU, NodePrepareResources then CDI {side('gpuhook')} (budget "
          f"{BUDGETS[DRA_ROW][0]:g} ms: {'ok' if ok else 'OVER'}), of which the prepare call {prep['gpuhook']:.2f}; "
          f"the same through specs with no hooks {side('no hook')}; runc given the same device and mounts by CRI, no "
          f"CDI {side('same')}; a `none` claim {side('none')}, of which the prepare call {prep['none']:.2f}")
    print(f"  gpuhook dra after serving, MiB: resident {mem['rss']}, peak {mem['hwm']}")
    _add_to_json(args.json, DRA_ROW, row, "dra_driver", mem)
    return 0 if ok else 1


def bench(args, want: set[str], tmp: str, state: str, runc: str, started_ids: list[str],
          servers: list[subprocess.Popen]) -> int:
    t_setup = time.monotonic()
    from gpuhook.install import build

    # gpuhook as installed on nodes: the host bundle
    opt = os.path.join(tmp, "opt-gpuhook")
    build.build(opt)
    wrapper = os.path.join(opt, "bin", "gpuhook-runtime")
    rss = build_tool(tmp, os.path.join(HERE, "rss.c"), "rss")
    peer = Peer(args.peer_dir, tmp) if args.peer_dir else None

    # the fake hosts
    hosts = {"cpu": ("cpu", None), "gpu8": ("nvidia", 8), "gpu16": ("nvidia", 16), "ld3000": ("nvidia", 8),
             "mi300": ("mi300", None)}
    roots = {}
    for name, (kind, gpus) in hosts.items():
        roots[name] = root = os.path.join(tmp, f"host-{name}")
        fh = fakehost.FakeHost(root, mknod=True)
        if kind == "nvidia":
            fakehost.nvidia(fh, gpus=gpus)
        elif kind == "mi300":
            fakehost.amd_mi300(fh, gpus=8, partitions=8)
        else:
            fakehost.cpu_only(fh)
    entries = {"gpu8": ld_entries(roots["gpu8"]), "ld3000": pad_ld_cache(roots["ld3000"], PAD_ENTRIES)}

    b = os.path.join(tmp, "bundle")
    bundle.make_bundle(b, ["true"])
    with open(os.path.join(b, "config.json"), "rb") as f:
        original = f.read()
    nvidia_req = with_env(original, ["NVIDIA_VISIBLE_DEVICES=all"])  # the peer's request (CDI mode: all)
    cache = os.path.join(tmp, "cache")
    env = dict(os.environ, GPUHOOK_CACHE_DIR=cache)
    log = os.path.join(tmp, "gpuhook.log")

    def gh_config(name: str, root: str, runtime: str = runc, ttl: float | None = None) -> str:
        path = os.path.join(tmp, f"gpuhook-{name}.toml")
        with open(path, "w") as f:
            f.write(f'runtime = "{runtime}"\nhost_root = "{root}"\nlog_file = "{log}"\n')
            if ttl is not None:
                f.write(f"probe_cache_ttl = {ttl}\n")
        return path

    # the node's resident runtime server (gpuhook runtime-server; systemd/gpuhook-runtime.socket),
    # as installed nodes run it: one per node config here, since a server serves only the creates
    # whose GPUHOOK_CONFIG and GPUHOOK_CACHE_DIR are its own (server.OWN_ENV); ghe(cfg) is the env
    # of a create served by cfg's. The "no server" rows use a cache dir with no socket in it.
    server_log = open(os.path.join(tmp, "runtime-server.log"), "w")
    served: dict[str, tuple[dict, subprocess.Popen]] = {}

    def ghe(cfg: str) -> dict:
        if cfg not in served:
            e = dict(env, GPUHOOK_CONFIG=cfg, GPUHOOK_CACHE_DIR=f"{cache}-{os.path.basename(cfg)[:-5]}")
            try:
                srv = runtime_server.start([os.path.join(opt, "bin", "gpuhook"), "runtime-server"], e,
                                           stdout=server_log, stderr=server_log)
            except RuntimeError as err:
                raise SystemExit(f"bench: {err}{open(server_log.name).read()[-300:]}") from None
            servers.append(srv)
            served[cfg] = (e, srv)
        return served[cfg][0]

    no_server = dict(env, GPUHOOK_CACHE_DIR=cache + "-no-server")

    gh = {name: gh_config(name, root) for name, root in roots.items()}
    gh_alone = gh_config("gpu8-alone", roots["gpu8"], "/bin/true")
    gh_cpu_alone = gh_config("cpu-alone", roots["cpu"], "/bin/true")
    gh_cold = {n: gh_config(f"{n}-cold", roots[n], "/bin/true", ttl=0) for n in ("gpu8", "ld3000")}

    # runc's side of each GPU figure: the spec gpuhook makes there, minus gpuhook's hooks
    plain = {}
    for name in ("gpu8", "gpu16", "ld3000", "mi300"):
        r = subprocess.run([sys.executable, "-m", "gpuhook", "precreate", "--root", roots[name]], input=original,
                           capture_output=True, env=env, cwd=REPO, check=True)
        spec = json.loads(r.stdout)
        spec["root"]["path"] = "rootfs"
        spec.pop("hooks", None)
        plain[name] = json.dumps(spec).encode()

    peer_cfg = {}
    if peer:
        for name in ("gpu8", "gpu16", "ld3000"):
            cdi = peer.host(name, roots[name], hosts[name][1])
            peer_cfg[name] = peer.config(name, cdi, runc)
            if name == "gpu8":
                peer_cfg["gpu8-alone"] = peer.config("gpu8-alone", cdi, "/bin/true")
        peer_cfg["cpu"] = peer.config("cpu", None, runc)

    def set_spec(data: bytes, path: str = os.path.join(b, "config.json")) -> None:
        with open(path, "wb") as f:
            f.write(data)

    # -- each runtime really injects, inside a container, before anything is timed ---------
    check_argv = ["sh", "-c", "n=0; for d in /dev/nvidia[0-9]* /dev/dri/renderD*; do [ -c $d ] && n=$((n+1)); "
                  "done; echo nodes=$n; grep -q libcuda.so /etc/ld.so.cache 2>/dev/null && echo ldcache=libcuda"]
    checks = [("gpuhook", wrapper, gh[n], None, n) for n in ("gpu8", "gpu16", "ld3000", "mi300")]
    if peer:
        checks += [("peer", peer.runtime, None, peer_cfg[n], n) for n in ("gpu8", "gpu16", "ld3000")]
    for who, binary, ghc, pc, host in checks:
        check = os.path.join(tmp, f"bundle-check-{who}-{host}")  # a fresh rootfs: its own ld cache
        bundle.make_bundle(check, check_argv)
        with open(os.path.join(check, "config.json"), "rb") as f:
            check_spec = f.read()
        set_spec(with_env(check_spec, ["NVIDIA_VISIBLE_DEVICES=all"]) if who == "peer" else check_spec,
                 os.path.join(check, "config.json"))
        e = dict(ghe(ghc) if ghc else dict(env, GPUHOOK_CONFIG=""), NVIDIA_CTK_CONFIG_FILE_PATH=pc or "")
        out = os.path.join(tmp, "check.out")
        cid = f"check-{who}-{host}"
        with open(out, "wb") as o, tempfile.TemporaryFile() as err:  # files: the container keeps them open
            rc = subprocess.run([binary, "--root", state, "create", "--bundle", check, cid], env=e,
                                stdin=subprocess.DEVNULL, stdout=o, stderr=err).returncode
            err.seek(0)
            if rc != 0:
                raise SystemExit(f"bench: {who} create on {host} failed: {err.read().decode(errors='replace')[-400:]}")
        started_ids.append(cid)
        subprocess.run([runc, "--root", state, "start", cid], check=True)
        for _ in range(500):
            st = subprocess.run([runc, "--root", state, "state", cid], capture_output=True, text=True).stdout
            if '"stopped"' in st:
                break
            time.sleep(0.01)
        subprocess.run([runc, "--root", state, "delete", "--force", cid], capture_output=True)
        text = open(out).read()
        gpus = hosts[host][1] or 64
        nodes = int(text.split("nodes=")[1].split()[0]) if "nodes=" in text else 0
        if nodes < gpus or (hosts[host][0] == "nvidia" and "ldcache=libcuda" not in text):
            raise SystemExit(f"bench: {who} did not inject on {host}: the container saw {text.strip()!r}")
        print(f"check: {who} on {host}: {nodes} GPU nodes" + (", libcuda in the ld cache" if "libcuda" in text else ""))

    # containers to exec into: one started by runc alone, one through gpuhook (injected)
    gpu_env = ghe(gh["gpu8"])
    for cid, binary in (("xplain", runc), ("xgpu", wrapper)):
        xb = os.path.join(tmp, f"bundle-{cid}")
        bundle.make_bundle(xb, ["sleep", "100000"])
        for step in (["create", "--bundle", xb, cid], ["start", cid]):
            subprocess.run([binary, "--root", state, *step], env=gpu_env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, check=True)
        started_ids.append(cid)

    def process_json(argv: list[str]) -> bytes:
        return json.dumps({"terminal": False, "user": {"uid": 0, "gid": 0}, "args": argv,
                           "env": ["PATH=/usr/bin:/bin"], "cwd": "/"}).encode()

    pfile = os.path.join(tmp, "process.json")
    set_spec(process_json(["sh", "-c", "echo $GPUHOOK_ACCELERATOR"]), pfile)
    seen = subprocess.run([wrapper, "--root", state, "exec", "--process", pfile, "xgpu"], env=gpu_env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if seen.stdout.strip() != "nvidia":
        raise SystemExit(f"bench: exec into the injected container does not see GPUHOOK_ACCELERATOR: {seen!r}")
    print(f"setup: {time.monotonic() - t_setup:.1f} s (bundle, hosts: ld caches of {entries['gpu8']} and "
          f"{entries['ld3000']} entries{', the peer ' + peer.version if peer else ''})\n")

    # -- the rows -----------------------------------------------------------------------
    # each side: (spec to put in place or None, commands, how many of them are timed, env)
    def side(spec, cmds, n, e):
        return lambda: (spec, cmds, n, e)

    def pe(cfg):
        return dict(env, NVIDIA_CTK_CONFIG_FILE_PATH=cfg)

    def exec_cmds(binary: str, cid: str) -> list[list[str]]:
        return [[binary, "--root", state, "exec", "--process", pfile, cid]]

    proc_true = process_json(["true"])
    rows: dict[str, dict] = {}
    P = peer.runtime if peer else None
    true = shutil.which("true") or "/bin/true"

    def define():
        d = {}
        d["pass-through"] = {"runc": side(None, [[runc, "--root", state, "state", "nope"]], 1, env),
                             "gpuhook": side(None, [[wrapper, "--root", state, "state", "nope"]], 1, ghe(gh["cpu"]))}
        if P:
            d["pass-through"]["peer"] = side(None, [[P, "--root", state, "state", "nope"]], 1, pe(peer_cfg["cpu"]))
        d["cpu create"] = {"runc": side(original, lifecycle(runc, state, b, "c"), 1, env),
                           "gpuhook": side(original, lifecycle(wrapper, state, b, "c"), 1, ghe(gh["cpu"]))}
        d["cpu create alone"] = {  # the front's own cost, without runc's spread
            "true": side(original, [[true]], 1, env),
            "gpuhook": side(original, [[wrapper, "create", "--bundle", b, "a"]], 1, ghe(gh_cpu_alone))}
        d["cpu lifecycle"] = {"runc": side(original, lifecycle(runc, state, b, "c"), 3, env),
                              "gpuhook": side(original, lifecycle(wrapper, state, b, "c"), 3, ghe(gh["cpu"]))}
        if P:
            d["cpu create"]["peer"] = side(original, lifecycle(P, state, b, "c"), 1, pe(peer_cfg["cpu"]))
            d["cpu lifecycle"]["peer"] = side(original, lifecycle(P, state, b, "c"), 3, pe(peer_cfg["cpu"]))
        alone = [["CMD", "create", "--bundle", b, "a"]]
        d["8-GPU alone"] = {"true": side(original, [[true]], 1, env),
                            "gpuhook": side(original, [[wrapper, *alone[0][1:]]], 1, ghe(gh_alone))}
        if P:
            d["8-GPU alone"]["peer"] = side(nvidia_req, [[P, *alone[0][1:]]], 1, pe(peer_cfg["gpu8-alone"]))
        d["8-GPU alone, no server"] = {
            "true": side(original, [[true]], 1, env),
            "gpuhook": side(original, [[wrapper, *alone[0][1:]]], 1, dict(no_server, GPUHOOK_CONFIG=gh_alone))}
        d["8-GPU lifecycle, no server"] = {
            "runc": side(plain["gpu8"], lifecycle(runc, state, b, "g"), 3, env),
            "gpuhook": side(original, lifecycle(wrapper, state, b, "g"), 3, dict(no_server, GPUHOOK_CONFIG=gh["gpu8"]))}
        for row, host in (("8-GPU lifecycle", "gpu8"), ("16-GPU lifecycle", "gpu16"), ("ld3000 lifecycle", "ld3000"),
                          ("MI300X lifecycle", "mi300")):
            d[row] = {"runc": side(plain[host], lifecycle(runc, state, b, "g"), 3, env),
                      "gpuhook": side(original, lifecycle(wrapper, state, b, "g"), 3, ghe(gh[host]))}
            if P and host in peer_cfg:
                d[row]["peer"] = side(nvidia_req, lifecycle(P, state, b, "g"), 3, pe(peer_cfg[host]))
        d["cold probe"] = {"true": side(original, [[true]], 1, env),
                           "gpuhook 5": side(original, [[wrapper, *alone[0][1:]]], 1, ghe(gh_cold["gpu8"])),
                           "gpuhook 3000": side(original, [[wrapper, *alone[0][1:]]], 1, ghe(gh_cold["ld3000"]))}
        for row, cid in (("exec plain", "xplain"), ("exec injected", "xgpu")):
            d[row] = {"runc": side(proc_true, exec_cmds(runc, cid), 1, env),
                      "gpuhook": side(proc_true, exec_cmds(wrapper, cid), 1, ghe(gh["gpu8"]))}
            if P:
                d[row]["peer"] = side(proc_true, exec_cmds(P, cid), 1, pe(peer_cfg["gpu8"]))
        return d

    defs = define()
    for row, sides in defs.items():
        if row not in want:
            continue
        base = "true" if "true" in sides else "runc"
        n = args.rounds * (FINE_FACTOR if row in FINE else 1)
        times: dict[str, list[float]] = {k: [] for k in sides}
        for i in range(n + 2):  # two warm-up rounds
            got = {}
            for who in random.sample(list(sides), len(sides)):
                spec, cmds, n_timed, e = sides[who]()
                if spec is not None:
                    set_spec(spec, pfile if row.startswith("exec") else os.path.join(b, "config.json"))
                time.sleep(PAUSE_S)
                got[who] = timed(cmds, e, n_timed, check=spec is not None)
            if i >= 2:
                for k, v in got.items():
                    times[k].append(v)
        rows[row] = {"base": base, "rounds": n,
                     "ms": {k: round(statistics.median(v), 2) for k, v in times.items()},
                     "added": {k: round(statistics.median(a - r for a, r in zip(v, times[base])), 2)
                               for k, v in times.items() if k != base}}
        if row == "cold probe":
            rows["cold probe 3000-5"] = {"base": "gpuhook 5", "rounds": n, "ms": {}, "added": {"gpuhook": round(
                statistics.median(a - r for a, r in zip(times["gpuhook 3000"], times["gpuhook 5"])), 2)}}

    if "16 at once" in want:
        rows["16 at once"] = burst(tmp, state, runc, wrapper, P, plain["gpu8"], original, nvidia_req,
                                   ghe(gh["gpu8"]), pe(peer_cfg["gpu8"]) if P else None, env)

    # -- peak RSS ---------------------------------------------------------------------------
    mem = peak_rss(tmp, rss, wrapper, P, original, nvidia_req, b, state, runc, ghe(gh_alone), ghe(gh["gpu8"]),
                   pe(peer_cfg["gpu8-alone"]) if P else None, pe(peer_cfg["gpu8"]) if P else None)
    rows["wrapper peak RSS MiB"] = {"base": None, "ms": {}, "added": {k: v for k, v in mem["wrapper"].items()}}

    with open(f"/proc/{served[gh['gpu8']][1].pid}/status") as f:  # the 8-GPU rows' server: its high-water mark
        mem["server"] = round(int(next(x for x in f if x.startswith("VmHWM:")).split()[1]) / 1024, 1)
    report(rows, mem, peer, entries)
    where = where_time_goes(opt, b, original, ghe(gh_alone), log)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "rss_mib": mem, "where": where, "peer": peer.version if peer else None}, f, indent=1)
    ok = all(within(name, rows) is not False for name in BUDGETS)
    return 0 if ok else 1


def burst(tmp, state, runc, wrapper, peer_rt, plain_spec, original, nvidia_req, gh_env, peer_env, env) -> dict:
    """16 lifecycles at once; the wall time of all, per runtime, in random order per round."""
    bundles = []
    for i in range(BURST):
        bd = os.path.join(tmp, f"burst-{i}")
        bundle.make_bundle(bd, ["true"])
        bundles.append(bd)
    sides = {"runc": (runc, plain_spec, env), "gpuhook": (wrapper, original, gh_env)}
    if peer_rt:
        sides["peer"] = (peer_rt, nvidia_req, peer_env)
    walls: dict[str, list[float]] = {k: [] for k in sides}
    for i in range(BURST_ROUNDS + 1):
        for who in random.sample(list(sides), len(sides)):
            binary, spec, e = sides[who]
            for bd in bundles:
                with open(os.path.join(bd, "config.json"), "wb") as f:
                    f.write(spec)
            time.sleep(0.2)
            errors = []

            def one(j: int) -> None:
                with tempfile.TemporaryFile() as err:
                    for c in lifecycle(binary, state, bundles[j], f"burst-{j}"):
                        if run_quiet(c, e, err) != 0 and c[3] == "create":
                            err.seek(0)
                            errors.append(err.read().decode(errors="replace")[-300:])
            threads = [threading.Thread(target=one, args=(j,)) for j in range(BURST)]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            if errors:
                raise SystemExit(f"bench: 16 at once through {who}: {errors[0]}")
            if i:
                walls[who].append((time.perf_counter() - t) * 1000)
    return {"base": "runc", "rounds": BURST_ROUNDS, "ms": {k: round(statistics.median(v), 1) for k, v in walls.items()},
            "added": {k: round(statistics.median(a / r for a, r in zip(v, walls["runc"])), 3)
                      for k, v in walls.items() if k != "runc"}}


def peak_rss(tmp, rss, wrapper, peer_rt, original, nvidia_req, b, state, runc, gh_alone_env, gh_env,
             peer_alone_env, peer_env) -> dict:
    """Peak RSS (MiB) of each wrapper alone (real runtime /bin/true: the figure is the
    wrapper's) and of each createContainer hook as runc runs it."""
    out = os.path.join(tmp, "rss.out")
    spec_path = os.path.join(b, "config.json")
    result: dict = {"wrapper": {}, "hooks": {}}
    sides = {"gpuhook": (wrapper, original, gh_alone_env)}
    if peer_rt:
        sides["peer"] = (peer_rt, nvidia_req, peer_alone_env)
    for who, (binary, spec, e) in sides.items():
        if os.path.exists(out):
            os.unlink(out)
        for _ in range(5):
            with open(spec_path, "wb") as f:
                f.write(spec)
            subprocess.run([rss, out, who, binary, binary, "create", "--bundle", b, "m"], env=e, check=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        kib = [int(line.split()[1]) for line in open(out)]
        result["wrapper"][who] = round(statistics.median(kib) / 1024, 1)
        # its hooks: the edited spec (the wrapper ran /bin/true on it), each hook under rss
        with open(spec_path) as f:
            edited = json.load(f)
        hooks = edited.get("hooks", {}).get("createContainer", [])
        os.unlink(out)
        for h in hooks:
            name = os.path.basename(h["path"]) + (f" {h['args'][1]}" if who == "peer" and len(h.get("args", [])) > 1 else "")
            h["args"] = [rss, out, name.replace(" ", ":"), h["path"], *(h.get("args") or [h["path"]])]
            h["path"] = rss
        for _ in range(3):
            with open(spec_path, "w") as f:
                json.dump(edited, f)
            for c in lifecycle(runc, state, b, "m"):
                subprocess.run(c, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        per: dict[str, list[int]] = {}
        if os.path.exists(out):
            for line in open(out):
                name, kib_s, _rc = line.split()
                per.setdefault(name.replace(":", " "), []).append(int(kib_s))
        result["hooks"][who] = {k: round(max(v) / 1024, 1) for k, v in per.items()}
    return result


def within(name: str, rows: dict):
    if name not in BUDGETS or name not in rows:
        return None
    budget, how = BUDGETS[name]
    r = rows[name]
    value = r["ms"].get("gpuhook") if how == "total" else r["added"].get("gpuhook")
    return None if value is None else value <= budget


def report(rows: dict, mem: dict, peer, entries: dict) -> None:
    cols = ["gpuhook", "peer"]
    print(f"{'case':<22} {'base ms':>9} {'gpuhook ms':>11} {'+gpuhook':>9} {'peer ms':>9} {'+peer':>8}  budget")
    for name, r in rows.items():
        if name == "wrapper peak RSS MiB":
            continue
        base = r["ms"].get(r["base"]) if r["base"] else None
        cells = []
        for c in cols:
            key = c if c in r["ms"] or c in r["added"] else None
            if name == "cold probe":
                key = None
            ms = r["ms"].get(key) if key else None
            add = r["added"].get(key) if key else None
            cells += [f"{ms:>9.2f}" if ms is not None else f"{'-':>9}",
                      f"{add:>+8.2f}" if add is not None else f"{'n/a' if c == 'peer' and peer else '-':>8}"]
        if name == "cold probe":
            cells = [f"{r['ms']['gpuhook 5']:>9.2f}", f"{r['added']['gpuhook 5']:>+8.2f}",
                     f"{r['ms']['gpuhook 3000']:>9.2f}", f"{r['added']['gpuhook 3000']:>+8.2f}  (5 | 3000 entries)"]
        verdict = within(name, rows)
        b = BUDGETS.get(name)
        tail = "" if b is None else f"  {b[0]:g}{'x' if b[1] == 'ratio' else ' ms'} ({b[1]}) {'ok' if verdict else 'OVER'}"
        unit = "x" if name == "16 at once" else ""
        print(f"{name:<22} {base if base is not None else '-':>9} {cells[0]:>11} {cells[1]:>9}{unit} {cells[2]:>9} "
              f"{cells[3]:>8}{unit}{tail}")
    if not peer:
        print("\n(peer column absent: no --peer-dir / PEER_DIR given, or ../shared/peer not there)")
    print(f"\npeak RSS, MiB (tests/perf/rss.c): wrapper alone: "
          + ", ".join(f"{k} {v}" for k, v in mem["wrapper"].items())
          + f"  (budget gpuhook <= {BUDGETS['wrapper peak RSS MiB'][0]:g}: "
          + ("ok" if mem["wrapper"]["gpuhook"] <= BUDGETS["wrapper peak RSS MiB"][0] else "OVER") + ")")
    if "server" in mem:
        print(f"  gpuhook's runtime server (resident, one per node; not a wrapper's): {mem['server']}")
    for who, hooks in mem["hooks"].items():
        print(f"  {who}'s createContainer hooks: " + (", ".join(f"{k} {v}" for k, v in hooks.items()) or "none"))


def where_time_goes(opt: str, b: str, original: bytes, e: dict, log: str) -> dict:
    """`-X importtime` of the bundle's create (warm caches, /bin/true as runtime), and the
    in-process stages the runtime logs with GPUHOOK_STAGES."""
    import glob

    site = glob.glob(os.path.join(opt, "lib", "python3*", "site-packages"))[0]
    from gpuhook.defaults import RUNTIME_MAIN
    from gpuhook.layout import launch

    # the front's own entry
    cmd = [*launch(opt), "-X", "importtime", "-I", "-S", "-c", RUNTIME_MAIN, site, "create", "--bundle", b, "w"]
    self_us: dict[str, list[int]] = {}
    for _ in range(10):
        with open(os.path.join(b, "config.json"), "wb") as f:
            f.write(original)
        r = subprocess.run(cmd, env=e, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        for line in r.stderr.splitlines():
            if line.startswith("import time:") and "self [us]" not in line:
                us, _cum, name = line[12:].split("|")
                self_us.setdefault(name.strip(), []).append(int(us))
    best = {k: min(v) for k, v in self_us.items() if len(v) >= 5}  # imported on a warm create
    ours = {k: v for k, v in best.items() if k.startswith("gpuhook")}
    print(f"\nwhere the 8-GPU create's time goes in a fresh interpreter (no server; min of 10, warm caches): {len(best)} modules imported, "
          f"{sum(best.values()) / 1000:.2f} ms of import (self), of which gpuhook's {len(ours)} modules "
          f"{sum(ours.values()) / 1000:.2f} ms; the dearest: "
          + ", ".join(f"{k} {v / 1000:.2f}" for k, v in sorted(best.items(), key=lambda kv: -kv[1])[:8]))
    stages: dict[str, list[float]] = {}
    se = dict(e, GPUHOOK_STAGES="1")
    wrapper = os.path.join(opt, "bin", "gpuhook-runtime")
    for _ in range(15):
        with open(os.path.join(b, "config.json"), "wb") as f:
            f.write(original)
        subprocess.run([wrapper, "create", "--bundle", b, "w"], env=se, stdin=subprocess.DEVNULL, check=True)
        with open(log, "rb") as f:
            last = json.loads(f.read().splitlines()[-1])
        prev = 0.0
        for name, t in last.get("stages_ms", {}).items():
            stages.setdefault(name, []).append(t - prev)
            prev = t
    med = {k: round(statistics.median(v), 2) for k, v in stages.items() if k != "start"}
    print("in-process stages in the runtime server, median ms each (from the request on; GPUHOOK_STAGES=1): "
          + ", ".join(f"{k} {v}" for k, v in med.items()) + f"; total {sum(med.values()):.2f}")
    return {"import_self_us": best, "stages_ms": med}


if __name__ == "__main__":
    sys.exit(main())
