"""A check that stored objects are never modified in place (`NEMO_KUBEFLOW_LOCAL_FROZEN_STORE=1`).

The store hands its objects themselves to listeners, watch history and readers that only read
(``stored_list``, ``snapshot``) and deep-copies them outside its lock, on the rule that nothing
changes a stored object. With the switch set, every stored object is kept as a read-only copy
whose every change raises :class:`ModifiedStoredObject` at the writer, naming it in the
traceback (and logging it, in case a thread swallows the exception). Deep copies of a frozen
object are ordinary dicts and lists again. Off by default: it costs a copy per write.
"""

from __future__ import annotations

import logging
import os
import traceback
from typing import Any, NoReturn

ENV = "NEMO_KUBEFLOW_LOCAL_FROZEN_STORE"
#: Where each change in place is also written (a thread's exception may never reach a test).
LOG_ENV = "NEMO_KUBEFLOW_LOCAL_FROZEN_STORE_LOG"

logger = logging.getLogger(__name__)


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


class ModifiedStoredObject(RuntimeError):
    """Something changed a stored object in place (it must change a copy and write that)."""


def _refuse(what: str) -> NoReturn:
    stack = "".join(traceback.format_stack(limit=12)[:-2])
    logger.error("a stored object was modified in place (%s) at:\n%s", what, stack)
    if path := os.environ.get(LOG_ENV):
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"--- {what}\n{stack}\n")
    raise ModifiedStoredObject(f"a stored object was modified in place ({what}); copy it before changing it")


class FrozenDict(dict):
    def __deepcopy__(self, memo: dict) -> dict:
        return {key: _thaw(value, memo) for key, value in self.items()}

    def __copy__(self) -> dict:
        return dict(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (dict, (dict(self),))

    def __setitem__(self, key: Any, value: Any) -> None:
        _refuse(f"[{key!r}] = ...")

    def __delitem__(self, key: Any) -> None:
        _refuse(f"del [{key!r}]")

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse("|=")

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        _refuse(f"setdefault({key!r})")

    def pop(self, key: Any, *default: Any) -> Any:
        if key not in self and default:
            return default[0]
        _refuse(f"pop({key!r})")

    def popitem(self) -> NoReturn:
        _refuse("popitem()")

    def clear(self) -> None:
        _refuse("clear()")

    def update(self, *args: Any, **kwargs: Any) -> None:
        _refuse("update()")


class FrozenList(list):
    def __deepcopy__(self, memo: dict) -> list:
        return [_thaw(value, memo) for value in self]

    def __copy__(self) -> list:
        return list(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (list, (list(self),))

    def __setitem__(self, index: Any, value: Any) -> None:
        _refuse(f"[{index!r}] = ...")

    def __delitem__(self, index: Any) -> None:
        _refuse(f"del [{index!r}]")

    def __iadd__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse("+=")

    def __imul__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse("*=")

    def append(self, value: Any) -> None:
        _refuse("append()")

    def extend(self, values: Any) -> None:
        _refuse("extend()")

    def insert(self, index: Any, value: Any) -> None:
        _refuse("insert()")

    def remove(self, value: Any) -> None:
        _refuse("remove()")

    def pop(self, index: Any = -1) -> NoReturn:
        _refuse("pop()")

    def clear(self) -> None:
        _refuse("clear()")

    def sort(self, *args: Any, **kwargs: Any) -> None:
        _refuse("sort()")

    def reverse(self) -> None:
        _refuse("reverse()")


def freeze(value: Any) -> Any:
    """A read-only copy of a stored object (dicts and lists all the way down)."""
    if isinstance(value, dict):
        return FrozenDict((key, freeze(item)) for key, item in value.items())
    if isinstance(value, list):
        return FrozenList(freeze(item) for item in value)
    return value


def _thaw(value: Any, memo: dict) -> Any:
    if isinstance(value, (dict, list)):
        import copy

        return copy.deepcopy(value, memo)
    return value
