"""Waiting for the API without spinning: Backoff (1, 2, 4... s after consecutive failures, at
most `most`) and RetryQueue, the agent's pod reports that the API did not take yet.

RetryQueue runs each job (a callable's argument) at once while the API works. When a job fails
with an error worth trying again (no answer, 429, 5xx: KubeError.transient), it goes back to
the head of a bounded queue, the jobs after it wait behind it, and the next try is after the
backoff: however many creates come while the API is away, it costs one call per wait, never a
call per create nor a loop. Once a try works the queue is run through, oldest first. Each failed
try is one `kube.retry` line (the consecutive failures, the wait, what waits), each kind of
error one `kube.error` line until the API works again (`kube.ok`). A job the API answered with
429 or 5xx `tries` times is given up (logged); no answer at all never uses up a job's tries
(the API is away, not the job wrong). Past `size` waiting jobs the oldest is dropped and
counted (`lost`).
"""

from __future__ import annotations

import collections
import time
from typing import Any, Callable

from . import kubeclient


class Backoff:
    """The wait after `failures` consecutive failures: first * 2**(failures - 1), at most `most`."""

    def __init__(self, first: float = 1.0, most: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.first, self.most, self.clock = first, most, clock
        self.failures = 0
        self.due = 0.0  # no try before this (clock time)

    def failed(self) -> float:
        """One more failure: the wait before the next try (seconds)."""
        self.failures += 1
        wait = min(self.first * 2.0 ** (self.failures - 1), self.most)
        self.due = self.clock() + wait
        return wait

    def ok(self) -> int:
        """A try worked: the failures before it (0: none); the next try is at once."""
        failures, self.failures, self.due = self.failures, 0, 0.0
        return failures

    def waiting(self) -> bool:
        return self.clock() < self.due


class RetryQueue:
    """Jobs for `run` (see the module's doc). `what` names them in the log."""

    def __init__(
        self,
        run: Callable[[Any], None],
        log,
        what: str,
        clock: Callable[[], float] = time.monotonic,
        first: float = 1.0,
        most: float = 30.0,
        tries: int = 5,
        size: int = 1024,
        node: str | None = None,
    ):
        self.run, self.log, self.what, self.node = run, log, what, node
        self.backoff = Backoff(first, most, clock)
        self.tries, self.size = tries, size
        self.jobs: collections.deque[list] = collections.deque()  # [job, answered failures]
        self.attempts = 0  # calls of run: what an outage cost
        self.lost = 0  # dropped: the queue was full, or the API kept refusing them
        self.said: set[str] = set()  # kinds of error logged since the API last worked

    def submit(self, job: Any) -> None:
        """Run `job` now, or after what waits already."""
        if self.jobs or self.backoff.waiting():
            self._keep([job, 0])
        else:
            self._try([job, 0])

    def tick(self) -> None:
        """Run what waits, when the wait is over, until a try fails."""
        while self.jobs and not self.backoff.waiting():
            if not self._try(self.jobs.popleft()):
                return

    def _keep(self, entry: list, head: bool = False) -> None:
        if len(self.jobs) >= self.size:
            self.jobs.pop() if head else self.jobs.popleft()
            self.lost += 1
        self.jobs.appendleft(entry) if head else self.jobs.append(entry)

    def _try(self, entry: list) -> bool:
        """Run one job; False when the API did not take it and it waits again."""
        self.attempts += 1
        try:
            self.run(entry[0])
        except kubeclient.KubeError as e:
            if e.kind not in self.said:
                self.said.add(e.kind)
                self.log.warning("kube.error", error=str(e), kind=e.kind, node=self.node, what=self.what,
                                 note="retried with backoff" if e.transient else "not retried")  # fmt: skip
            if not e.transient:
                return True  # this job is wrong, not the API: the next one goes on
            entry[1] += e.status is not None
            if entry[1] >= self.tries:
                self.lost += 1
                self.log.warning("kube.gave_up", what=self.what, node=self.node, error=str(e), tries=entry[1])
            else:
                self._keep(entry, head=True)
            wait = self.backoff.failed()
            self.log.info("kube.retry", what=self.what, node=self.node, failures=self.backoff.failures,
                          retry_in_s=wait, waiting=len(self.jobs))  # fmt: skip
            return False
        failures = self.backoff.ok()
        if failures or self.said:
            self.log.info("kube.ok", what=self.what, node=self.node, after_failures=failures, waiting=len(self.jobs))
            self.said.clear()
        return True
