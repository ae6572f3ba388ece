"""Event aggregation: the same event on the same object again is a count, not a new object.

Like client-go's event correlator (simplified): an event with the same involved object, type, reason and
message as one this operator posted within ``WINDOW`` seconds increments that Event's ``count`` and
``lastTimestamp`` (a merge patch) instead of creating another Event. A restart storm of one stream is
then one Event with a count, not hundreds of objects in etcd. The cache is bounded (least recently used
entries go first, 4096 at most): a deleted stream's entries stay only until newer ones push them out.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

WINDOW = 600.0
MAX_ENTRIES = 4096

Key = tuple[str, str, str, str, str, str]   # namespace, involved uid, kind, type, reason, message


@dataclass(frozen=True)
class Posted:
    name: str          # the Event object's name
    count: int
    first: str         # its firstTimestamp
    at: float          # when we last posted or bumped it (monotonic)


class EventCache:
    def __init__(self, clock: Callable[[], float] = time.monotonic, window: float = WINDOW,
                 max_entries: int = MAX_ENTRIES):
        self.clock, self.window, self.max_entries = clock, window, max_entries
        self._posted: OrderedDict[Key, Posted] = OrderedDict()

    def recent(self, key: Key) -> Posted | None:
        """The Event to bump for ``key``, if one was posted within the window."""
        p = self._posted.get(key)
        if p is None or self.clock() - p.at > self.window:
            self._posted.pop(key, None)
            return None
        return p

    def posted(self, key: Key, name: str, count: int, first: str) -> None:
        self._posted[key] = Posted(name, count, first, self.clock())
        self._posted.move_to_end(key)
        while len(self._posted) > self.max_entries:
            self._posted.popitem(last=False)

    def forget(self, key: Key) -> None:
        self._posted.pop(key, None)

    def forget_object(self, namespace: str, uid: str) -> None:
        for key in [k for k in self._posted if k[0] == namespace and k[1] == uid]:
            del self._posted[key]

    def __len__(self) -> int:
        return len(self._posted)
