"""What makes the agent probe again: udev events (UdevWatch) and the quiet time after them
(Debounce), beside the timer of core.py's loop.

    udev event (drm, kfd, accel; nvidia/amdgpu/i915/xe module load and unload)
      -> Debounce.notify -> wait until `debounce` seconds pass without another (at most ten
         times that after the first) -> one reason for the loop's next probe
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from .. import vendors

UDEV_SUBSYSTEMS = vendors.udev_subsystems()  # each vendor's (gpuhook/vendors.py)
UDEV_MODULES = vendors.udev_modules()


class Debounce:
    """Reasons to probe again, gathered until they stop coming: notify() from any thread,
    wait() from the loop. stopped is set by stop(): every wait returns None from then on."""

    def __init__(self, debounce: float, clock: Callable[[], float]):
        self.debounce = debounce
        self.clock = clock
        self.stopped = threading.Event()
        self._cond = threading.Condition()
        self._pending: list[str] = []
        self._first_event = self._last_event = 0.0

    def notify(self, reason: str) -> None:
        """Something may have changed: re-probe once things are quiet for `debounce`."""
        with self._cond:
            now = self.clock()
            if not self._pending:
                self._first_event = now
            self._last_event = now
            if reason not in self._pending:
                self._pending.append(reason)
            self._cond.notify_all()

    def stop(self) -> None:
        self.stopped.set()
        with self._cond:
            self._cond.notify_all()

    def wait(self, deadline: float) -> str | None:
        """Block until the next re-probe is due ("timer" at `deadline` when nothing came); its
        reason, or None when stopping."""
        with self._cond:
            while not self.stopped.is_set() and not self._pending:
                left = deadline - self.clock()
                if left <= 0:
                    return "timer"
                self._cond.wait(min(left, 1.0))
            # debounce: wait until no event came for `debounce` seconds (at most 10 of them)
            while not self.stopped.is_set():
                now = self.clock()
                due = min(self._last_event + self.debounce, self._first_event + 10 * max(self.debounce, 0.1))
                if now >= due:
                    break
                self._cond.wait(due - now)
            if self.stopped.is_set():
                return None
            reason = ", ".join(self._pending[:5]) + (f" (+{len(self._pending) - 5})" if len(self._pending) > 5 else "")
            self._pending.clear()
            return reason


class UdevWatch:
    """pyudev monitor thread: calls notify(reason) for each relevant event."""

    def __init__(self, notify: Callable[[str], None], log, stop: threading.Event):
        self.notify = notify
        self.log = log
        self.stop = stop
        self.monitor: Any = None
        self.thread: threading.Thread | None = None
        self.source: str | None = None

    def start(self) -> None:
        """Raises when pyudev or libudev cannot be used (the agent falls back to its timer)."""
        import pyudev

        context = pyudev.Context()
        # libudev disables a "udev" monitor when udevd's control socket is not there (a
        # container without /run/udev): then take the kernel's events, which the debounce
        # delays until udev has made the nodes.
        self.source = "udev" if os.path.exists("/run/udev/control") else "kernel"
        monitor = pyudev.Monitor.from_netlink(context, source=self.source)
        for s in UDEV_SUBSYSTEMS:
            monitor.filter_by(s)
        monitor.start()
        self.monitor = monitor
        self.thread = threading.Thread(target=self._loop, name="gpuhook-udev", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                device = self.monitor.poll(timeout=0.5)
                if device is None:
                    continue
                if device.subsystem == "module" and device.sys_name not in UDEV_MODULES:
                    continue
                self.notify(f"udev:{device.action}:{device.subsystem}:{device.sys_name}")
        except Exception as e:  # the timer still runs: say so once and stop watching
            self.log.warning("udev.failed", error=f"{type(e).__name__}: {e}", fallback="periodic")
