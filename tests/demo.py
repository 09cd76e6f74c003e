"""`make demo`: what gpuhook sees on this machine, what it would inject on a GPU node, and,
as root with runc, a real container started through gpuhook-runtime on both. It runs from the
checkout (the simulated node is the tests' fake host, tests/fakes/, which is not installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # gpuhook from this checkout, and the tests' fakes

from fakes import bundle, fakehost  # noqa: E402
from gpuhook.cli import format_edits, format_inventory  # noqa: E402
from gpuhook.config import Config  # noqa: E402
from gpuhook.plan import plan, request_from_spec  # noqa: E402
from gpuhook.probe import nodestate, probe  # noqa: E402

SHOW = (
    'echo "GPUHOOK_ACCELERATOR=${GPUHOOK_ACCELERATOR:-<unset: run on CPU>}"; '
    'echo "GPUHOOK_DEVICES=${GPUHOOK_DEVICES:-<unset>}" | cut -c1-110; '
    "echo 'device nodes (type major, minor):'; "
    "ls -l /dev/nvidia* /dev/kfd /dev/dri/* 2>/dev/null | while read m l u g maj min rest; do "
    'echo "  ${rest##* }  $m $maj $min"; done; '
    "[ -e /dev/nvidia0 ] && { echo 'open /dev/nvidia0 (no driver behind the fake node, but the cgroup allows it):'; "
    "cat /dev/nvidia0 2>&1 | sed 's/^/  /'; }; "
    "echo 'driver libraries in the container ld cache:'; "
    "tr '\\000' '\\n' < /etc/ld.so.cache | grep -aE '/lib(cuda|nvidia-[a-z]+)[.]so[.][0-9]+$' | sort -u | sed 's/^/  /'; true"
)


def title(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def run_container(wrapper: str, host_root: str, tmp: str, name: str) -> None:
    conf = os.path.join(tmp, f"{name}.toml")
    with open(conf, "w") as f:
        f.write(f'host_root = "{host_root}"\nlog_file = "{tmp}/gpuhook.log"\n')
    b = os.path.join(tmp, f"bundle-{name}")
    bundle.make_bundle(b, ["sh", "-c", SHOW])
    env = dict(os.environ, GPUHOOK_CONFIG=conf, GPUHOOK_CACHE_DIR=os.path.join(tmp, "cache"))
    state = os.path.join(tmp, "state")
    print(f"$ gpuhook-runtime run --bundle {b} demo-{name}    (host_root = {host_root})")
    r = subprocess.run(
        [wrapper, "--root", state, "run", "--bundle", b, f"demo-{name}"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        print(f"(container exited {r.returncode}: {r.stderr.strip()})")
    subprocess.run(["runc", "--root", state, "delete", "--force", f"demo-{name}"], capture_output=True)


def main() -> int:
    title("1. gpuhook probe: this machine")
    print(format_inventory(probe("/")))

    tmp = tempfile.mkdtemp(prefix="gpuhook-demo-")
    try:
        root = os.path.join(tmp, "gpu-node")
        can_run = (
            os.geteuid() == 0
            and shutil.which("runc")
            and bundle.find_busybox()
            and os.path.exists(os.path.join(os.path.dirname(sys.executable), "gpuhook-runtime"))
        )
        fakehost.build(root, "nvidia", mknod=bool(can_run))
        title("2. gpuhook probe --root <simulated 8-GPU NVIDIA node>")
        print(format_inventory(probe(root)))
        title("3. gpuhook plan: what a gpu-optional container would get there")
        spec = bundle.spec(["sh"], rootfs=os.path.join(tmp, "rootfs"))
        inv, config = probe(root), Config(log_file="")
        print(format_edits(plan(inv, nodestate.read(inv, config), request_from_spec(spec), config).edits, root))

        if not can_run:
            print("\n(As root with runc and busybox-static, the demo also starts real containers: sudo make demo.)")
            return 0
        wrapper = os.path.join(os.path.dirname(sys.executable), "gpuhook-runtime")
        title("4. a real container through gpuhook-runtime + runc, on the simulated GPU node")
        run_container(wrapper, root, tmp, "gpu")
        title("5. the same container on this machine (CPU-only): nothing injected")
        run_container(wrapper, "/", tmp, "cpu")
        title("gpuhook's log (one JSON line per create)")
        with open(os.path.join(tmp, "gpuhook.log")) as f:
            for line in f:
                print(line.rstrip()[:200] + (" ..." if len(line) > 200 else ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
