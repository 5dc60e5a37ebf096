"""Why a training process failed, in the words it wrote: read from the failed node's log. Pure.

The pod's container status says only how ``node`` ended (exit code 1, or a signal). What the
user needs is in the log:

* torchrun's failure report ends with ``Root Cause (first observed failure):`` and the failed
  worker's global ``rank``, ``local_rank``, ``exitcode`` (negative for a signal, with its name)
  and ``error_file``. When the worker's entrypoint is decorated with
  ``torch.distributed.elastic.multiprocessing.errors.record``, the worker writes its exception to
  the error file (``TORCHELASTIC_ERROR_FILE``, set by torchrun for every worker) and torchrun
  prints that traceback as the report's ``traceback``; otherwise it says "To enable traceback see".
* The worker's own traceback, whose last line is the exception ("RuntimeError: ..."). With
  ``--tee``/``--redirects`` (NeMo-Run's torchrun launcher passes ``--tee 3``) torchrun prefixes
  each line with ``[<role><local_rank>]:``; newer torch versions may use ``[rank<N>]:``.
* A shell that cannot find a command exits with 127 and says ``torchrun: command not found``
  (bash) or ``torchrun: not found`` (sh).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

ROOT_CAUSE_HEADER = "Root Cause (first observed failure):"
#: torchrun's own exception, raised in the agent after a worker failed: never the root cause.
_AGENT_ERRORS = ("ChildFailedError",)
_PREFIX = re.compile(r"^\[(?:rank(?P<rank>\d+)|(?P<role>[A-Za-z_][\w.-]*?)(?P<local>\d+))\]:")
_FIELD = re.compile(r"^\s+(?P<key>rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Warning|Failure)\b"
                        r"(?::.*)?$|^[A-Za-z_][\w.]*: .+$")
_NOT_FOUND = re.compile(r"(?P<cmd>[\w./-]+): (?:command )?not found\s*$")
#: Exit code of a shell whose command was not found.
COMMAND_NOT_FOUND_EXIT = 127


@dataclass(frozen=True)
class RankFailure:
    """What the failed node's log says about its failure ("" / None for what it does not say)."""

    #: Global rank of the failed worker (torchrun's report).
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    #: torchrun's ``exitcode``: negative for a signal.
    exitcode: Optional[int] = None
    signal_name: str = ""
    #: The exception line, "RuntimeError: step 7 got a bad batch".
    error: str = ""
    #: The worker's traceback (its lines, without torchrun's prefix), to quote.
    traceback: tuple[str, ...] = ()
    #: A command the container could not find ("torchrun").
    missing_command: str = ""

    def headline(self, node: Optional[int]) -> str:
        """"rank 3 on node 1: RuntimeError: ..." (or what of it is known; "" if nothing)."""
        where = f"rank {self.rank}" if self.rank is not None else ""
        if node is not None:
            where = f"{where} on node {node}" if where else f"node {node}"
        if self.missing_command:
            return f"{where}: {missing_command_hint(self.missing_command)}"
        if self.error:
            return f"{where}: {self.error}"
        if self.signal_name:
            return f"{where}: killed by {self.signal_name} (torchrun exitcode {self.exitcode})"
        if self.exitcode is not None and self.rank is not None:
            return f"{where}: exited with code {self.exitcode}"
        return ""


def missing_command_hint(command: str) -> str:
    """What a "<command>: not found" in the pod means, and how to fix it."""
    name = command.rsplit("/", 1)[-1]
    if name in ("torchrun", "python", "python3"):
        what = "torch (torchrun comes with PyTorch)" if name == "torchrun" else "Python"
        return (f"{name}: command not found in the container: the image has no {what}; use an image that "
                f"has it (e.g. nvcr.io/nvidia/nemo or a pytorch image). On the local cluster, the pods run "
                f"with the submitting Python's environment: install torch in it (pip install torch)")
    return f"{command}: command not found in the container: the image does not have it, or PATH misses it"


def _strip(line: str) -> tuple[Optional[str], str]:
    """(worker key of torchrun's prefix or None, line without it)."""
    m = _PREFIX.match(line)
    if not m:
        return None, line
    key = f"rank{m['rank']}" if m["rank"] is not None else f"local{m['local']}"
    return key, line[m.end():]


def _root_cause(lines: Sequence[str]) -> dict:
    """torchrun's root-cause fields: rank, local_rank, exitcode, signal, traceback lines."""
    start = max((i for i, line in enumerate(lines) if ROOT_CAUSE_HEADER in line), default=None)
    if start is None:
        return {}
    found: dict = {}
    tb: list[str] = []
    in_tb = False
    for line in lines[start + 1:]:
        if line.startswith("===") or line.strip().startswith("====="):
            break
        m = _FIELD.match(line)
        if m and not in_tb:
            key, value = m["key"], m["value"].strip()
            if key == "rank":
                r = re.match(r"(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?", value)
                if r:
                    found["rank"] = int(r[1])
                    found["local_rank"] = int(r[2]) if r[2] else None
            elif key == "exitcode":
                r = re.match(r"(-?\d+)", value)
                found["exitcode"] = int(r[1]) if r else None
                s = re.search(r"\((SIG[A-Z0-9]+)\)", value)
                found["signal"] = s[1] if s else ""
            elif key == "traceback":
                in_tb = True
                if value and not value.startswith("To enable traceback"):
                    tb.append(value)
            continue
        if in_tb:
            tb.append(line[2:] if line.startswith("  ") else line)
    found["traceback"] = [t for t in tb if t.strip()]
    return found


def _tracebacks(lines: Sequence[str]) -> dict[Optional[str], list[list[str]]]:
    """Python tracebacks in the log, by torchrun worker prefix (None: unprefixed), each as its
    lines from "Traceback (most recent call last):" to the exception line."""
    found: dict[Optional[str], list[list[str]]] = {}
    open_tb: dict[Optional[str], list[str]] = {}
    for raw in lines:
        key, line = _strip(raw)
        if line.startswith("Traceback (most recent call last):"):
            open_tb[key] = [line]
            continue
        current = open_tb.get(key)
        if current is None:
            continue
        current.append(line)
        if line and not line[0].isspace():
            # The first unindented line after the frames is the exception.
            found.setdefault(key, []).append(current)
            del open_tb[key]
    return found


def _exception_line(tb: Sequence[str]) -> str:
    for line in reversed(tb):
        text = line.strip()
        if text and not text.startswith(("File ", "Traceback", "^", "~")) and _EXCEPTION.match(text):
            return text
    return ""


def read_rank_failure(lines: Sequence[str], exit_code: Optional[int] = None) -> RankFailure:
    """What a failed node's log (its last lines, oldest first) says about why it failed."""
    if exit_code == COMMAND_NOT_FOUND_EXIT or exit_code is None:
        for line in reversed(lines[-20:]):
            m = _NOT_FOUND.search(line)
            if m:
                return RankFailure(missing_command=m["cmd"])
    root = _root_cause(lines)
    error = _exception_line(root.get("traceback") or [])
    tb: list[str] = list(root.get("traceback") or []) if error else []
    if not error:
        by_worker = _tracebacks(lines)
        local = root.get("local_rank")
        rank = root.get("rank")
        keys = [k for k in (f"rank{rank}" if rank is not None else None,
                            f"local{local}" if local is not None else None) if k and k in by_worker]
        candidates = [t for k in keys for t in by_worker[k]]
        if not candidates and not root:
            # No torchrun: the process's own traceback, unprefixed.
            candidates = by_worker.get(None, [])
        if not candidates and len([k for k in by_worker if k is not None]) == 1:
            candidates = next(v for k, v in by_worker.items() if k is not None)
        candidates = [t for t in candidates if not any(a in _exception_line(t) for a in _AGENT_ERRORS)]
        if candidates:
            tb = candidates[-1]
            error = _exception_line(tb)
    return RankFailure(rank=root.get("rank"), local_rank=root.get("local_rank"), exitcode=root.get("exitcode"),
                       signal_name=root.get("signal", ""), error=error, traceback=tuple(tb))
