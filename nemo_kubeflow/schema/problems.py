"""How a check reports a problem (``_Problems``: ``<path>: <what is wrong>; <how to fix>``), and the small
helpers every check of this package uses to read a manifest that may be malformed."""

from __future__ import annotations

import difflib
import json
import re
from typing import Any, Iterator, Optional, Sequence, TypeGuard, Union

Path = tuple[Union[str, int], ...]


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _fmt_path(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out or "<object>"


def _sort_key(path: Path) -> tuple:
    # Indices sort numerically and before keys, so containers[10] follows containers[9].
    return tuple((1, 0, p) if isinstance(p, str) else (0, p, "") for p in path)


class _Problems:
    def __init__(self) -> None:
        self.items: list[tuple[Path, str]] = []
        #: Reported only where ``items`` has nothing at the same path: the CRDs' generic value rules
        #: (minimum, maxItems, enum...), which the specific rules of this module word better.
        self.fallbacks: list[tuple[Path, str]] = []

    def add(self, path: Path, what: str, fix: str = "") -> None:
        self.items.append((path, _message(what, fix)))

    def soft(self, path: Path, what: str, fix: str = "") -> None:
        self.fallbacks.append((path, _message(what, fix)))

    def paths(self) -> set[Path]:
        return {path for path, _ in self.items}

    def render(self) -> list[str]:
        items = self.items + _not_at(self.fallbacks, self.paths())
        unique = sorted(set(items), key=lambda item: (_sort_key(item[0]), item[1]))
        return [f"{_fmt_path(path)}: {message}" for path, message in unique]


def _message(what: str, fix: str) -> str:
    """A problem's message: ``<what is wrong>; <how to fix>``."""
    return f"{what}; {fix}" if fix else what


def _not_at(items: list[tuple[Path, str]], paths: set[Path]) -> list[tuple[Path, str]]:
    """The problems of ``items`` whose path is not among ``paths``."""
    return [item for item in items if item[0] not in paths]


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: The JSON name of each type a manifest's values have, in order: bool before int (a bool is an int).
_JSON_TYPES: tuple[tuple[Union[type, tuple[type, ...]], str], ...] = (
    (type(None), "null"),
    (bool, "boolean"),
    ((int, float), "number"),
    (str, "string"),
    (list, "list"),
    (dict, "object"),
)


def _json_type(value: Any) -> str:
    for types, name in _JSON_TYPES:
        if isinstance(value, types):
            return name
    return type(value).__name__


def _close_match(key: str, choices: Sequence[str]) -> Optional[str]:
    lowered = {c.lower(): c for c in choices}
    return lowered.get(key.lower()) or next(iter(difflib.get_close_matches(key, choices, n=1, cutoff=0.6)), None)


def _did_you_mean(key: str, choices: Sequence[str], known: str = "known fields") -> str:
    """A "did you mean" for a misspelt key, else the list of valid choices when it is short."""
    choices = sorted(set(choices))
    match = _close_match(key, choices)
    if match:
        return f"did you mean {match}?"
    if not choices:
        return "remove it"
    if len(choices) <= 15:
        return f"remove it ({known}: {', '.join(choices)})"
    return "remove it"


def _dict(value: Any) -> dict:
    """The value if it is a mapping, else {} (its type problem is reported by the schema layer)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _first_with(items: list, key: str, value: Any) -> Optional[dict]:
    """The first object of ``items`` whose ``key`` is ``value`` (not None), or None."""
    return next((item for item in items if _dict(item).get(key) == value), None)


def _find(node: Any, pattern: Sequence[str], path: Path) -> Iterator[tuple[Path, Any]]:
    """Yield (path, value) for every value at ``pattern``; "*" walks every item of a list."""
    if not pattern:
        yield path, node
        return
    head, rest = pattern[0], pattern[1:]
    if head == "*":
        for i, item in enumerate(_list(node)):
            yield from _find(item, rest, path + (i,))
    elif isinstance(node, dict) and node.get(head) is not None:
        yield from _find(node[head], rest, path + (head,))
