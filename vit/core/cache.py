"""A least-recently-used cache bounded by the bytes its values hold, shared by every user of the app.

Streamlit's ``cache_resource`` bounds a cache by its number of entries only, and one entry may be a
2-MB model or a 1-GB one, one attention analysis 50 KB or 500 MB. ``ByteCache`` counts the bytes of
the tensors, arrays and images each value holds (``nbytes``) and drops the least recently used
values until the total fits; a value larger than the whole budget is returned but not kept.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

import numpy as np
import torch
from PIL import Image

T = TypeVar("T")


def nbytes(value: object) -> int:
    """The bytes of the tensors, arrays, images, strings and bytes ``value`` holds, looked for through
    dataclasses, modules, lists, tuples and dicts; memory shared between two of them counts once."""
    seen: set[int] = set()

    def walk(item: object) -> int:
        if id(item) in seen:
            return 0
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            if item.device.type == "meta":
                return 0
            key = -item.untyped_storage().data_ptr()  # negative: never an id(); views of one storage count once
            if key in seen:
                return 0
            seen.add(key)
            return item.untyped_storage().nbytes()
        if isinstance(item, np.ndarray):
            base = item
            while isinstance(base.base, np.ndarray):
                base = base.base
            key = -base.__array_interface__["data"][0]
            if key in seen:
                return 0
            seen.add(key)
            return base.nbytes
        if isinstance(item, Image.Image):
            return item.width * item.height * max(1, len(item.getbands())) * (4 if item.mode in ("I", "F") else 1)
        if isinstance(item, (bytes, bytearray, str)):
            return len(item)
        if isinstance(item, torch.nn.Module):
            return sum(walk(t) for t in item.state_dict(keep_vars=True).values())
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            return sum(walk(getattr(item, f.name)) for f in dataclasses.fields(item))
        if isinstance(item, dict):
            return sum(walk(k) + walk(v) for k, v in item.items())
        if isinstance(item, (list, tuple, set, frozenset)):
            return sum(walk(v) for v in item)
        held = getattr(type(item), "held", None)  # an object that names the tensors it holds (CheckpointedStates)
        return walk(tuple(item.held())) if callable(held) else 0

    return walk(value)


class ByteCache:
    """Thread-safe LRU cache holding values of at most ``max_bytes`` in all (as ``nbytes`` counts them)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._values: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        """The bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._values

    def get(self, key: Hashable, default: object = None) -> object:
        """The cached value for ``key`` (now the most recently used), else ``default``."""
        with self._lock:
            if key not in self._values:
                return default
            self._values.move_to_end(key)
            return self._values[key][0]

    def get_or_compute(self, key: Hashable, compute: Callable[[], T], max_share: float = 1.0) -> T:
        """The cached value for ``key``, else ``compute()``, kept if it fits; exceptions are not cached.

        A value over ``max_share`` of the budget is returned without being kept, so one huge value does
        not evict many small ones."""
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key][0]  # type: ignore[return-value]
        value = compute()  # outside the lock: other users' hits and computations go on meanwhile
        size = nbytes(value)
        with self._lock:
            if key in self._values:  # computed meanwhile by another session: keep one copy
                self._bytes -= self._values.pop(key)[1]
            if size <= max_share * self.max_bytes:
                self._values[key] = (value, size)
                self._bytes += size
                while self._bytes > self.max_bytes:
                    _, (_, dropped) = self._values.popitem(last=False)
                    self._bytes -= dropped
        return value

    def clear(self) -> None:
        """Drop every value."""
        with self._lock:
            self._values.clear()
            self._bytes = 0
