"""flock(2) with a deadline: the node's files gpuhook locks (the install's, the round robin's)."""

import fcntl
import time


def flock_within(fd: int, seconds: float, interval: float) -> bool:
    """An exclusive flock on fd, tried every `interval` s for up to `seconds`; False if not had."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(interval)
