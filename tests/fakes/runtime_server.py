"""Start the runtime server (runtime/server.py) as the node's systemd would, for tests and the bench."""

import os
import subprocess
import time

from gpuhook.runtime.server import SOCKET_NAME


def start(argv: list[str], env: dict, timeout: float = 10.0, **popen) -> subprocess.Popen:
    """`gpuhook runtime-server` (argv) with env, returned once its socket is in env's
    GPUHOOK_CACHE_DIR; RuntimeError (with what it printed, when piped) if it exits first."""
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, **popen)
    sock = os.path.join(env["GPUHOOK_CACHE_DIR"], SOCKET_NAME)
    deadline = time.monotonic() + timeout
    while not os.path.exists(sock) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if proc.poll() is not None or not os.path.exists(sock):
        proc.kill()
        said = proc.communicate()[1] if popen.get("stderr") == subprocess.PIPE else ""
        raise RuntimeError(f"the runtime server did not start: {said or ''}"[-500:])
    return proc
