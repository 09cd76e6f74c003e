"""retry.Backoff and retry.RetryQueue: the agent waits for the API without spinning, keeps
what waits bounded, and gives up only on a job the API keeps refusing."""

from __future__ import annotations

from gpuhook import log
from gpuhook.agent import kubeclient, retry


class Clock:
    def __init__(self):
        self.t = 50.0

    def __call__(self):
        return self.t


def test_backoff_doubles_up_to_its_most_and_starts_again_after_a_success():
    clock = Clock()
    b = retry.Backoff(1.0, 8.0, clock)
    assert [b.failed() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert b.waiting() and b.due == 58.0
    clock.t = 58.0
    assert not b.waiting() and b.ok() == 6 and b.failed() == 1.0


def test_jobs_wait_in_order_bounded_and_a_refused_job_is_given_up(logs):
    clock = Clock()
    done, answer = [], {"status": None, "down": True}

    def run(job):
        if answer["down"]:
            raise kubeclient.KubeError("refused", answer["status"])
        done.append(job)

    q = retry.RetryQueue(run, log.get(), "test", clock, first=1.0, most=4.0, tries=3, size=4)
    for i in range(6):
        q.submit(i)
    assert q.attempts == 1 and list(j for j, _ in q.jobs) == [2, 3, 4, 5] and q.lost == 2  # the oldest go
    for _ in range(100):  # no answer: never gives up, tries once per wait
        clock.t += 0.5
        q.tick()
    assert q.attempts == 14  # at 50, 51, 53, then every 4 s (57... 97): not a try per tick
    assert len(q.jobs) == 4 and q.lost == 2
    answer["status"] = 503  # answered: the head job's tries count, and it goes after `tries`
    for _ in range(3):
        clock.t += 4
        q.tick()
    assert [j for j, _ in q.jobs] == [3, 4, 5] and q.lost == 3
    assert [x["event"] for x in logs()].count("kube.gave_up") == 1
    answer["down"] = False
    clock.t += 4
    q.tick()
    assert done == [3, 4, 5] and not q.jobs and q.backoff.failures == 0
    assert [x["event"] for x in logs()].count("kube.error") == 2  # unreachable, then http-503
    attempts = q.attempts
    q.submit(6)
    assert done[-1] == 6 and q.attempts == attempts + 1  # at once: the API works
