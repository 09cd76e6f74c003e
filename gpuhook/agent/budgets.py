"""The agent's bounded state: a token bucket (a budget of `burst`, then `rate` per second) and
a map that keeps its `size` most recently used entries. PodReporter (podevents.py) keeps one
bucket per namespace for its Events and one for its pod lookups, in such maps."""

from __future__ import annotations

from collections import OrderedDict


class Bucket:
    def __init__(self, burst: int, rate: float, clock):
        self.burst, self.rate, self.clock = burst, rate, clock
        self.tokens = float(burst)
        self.at = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class Lru(OrderedDict):
    """A bounded map: the least recently used entry goes first."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get_fresh(self, key, default=None):
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)
