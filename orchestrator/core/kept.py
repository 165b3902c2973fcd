"""Answers kept by content and shared by a fleet's threads, each computed once.

A fleet plans every host at the same moment, and its hosts carry the same files:
a cache that lets each thread compute what another is already computing makes 25
hosts tokenize the same 4,000-line file 25 times. ``Kept`` holds back the others
until the first answer is there.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Kept(Generic[K, V]):
    """The last ``size`` answers, by key, shared by the threads of a fleet.

    A fleet's hosts (and a host's successive plans) carry the same files: what
    is read from a text is kept by that text (or its digest), never by its
    path, which only names errors (and those are never kept). The hosts of a
    fleet ask at the same moment, so the first to ask computes and the others
    wait for its answer (at N = 25 they each tokenized the same 4,000-line
    file); if it fails, each computes its own, to raise its own error.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._computing: dict[K, threading.Event] = {}
        self._lock = threading.Lock()

    def get(self, key: K, make: Callable[[], V]) -> V:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
            computing = self._computing.get(key)
            if computing is None:
                self._computing[key] = threading.Event()
        if computing is not None:
            computing.wait()
            with self._lock:
                hit = self._items.get(key)
            return hit if hit is not None else make()
        try:
            value = make()
            with self._lock:
                self._items[key] = value
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        finally:
            with self._lock:
                self._computing.pop(key).set()
        return value
