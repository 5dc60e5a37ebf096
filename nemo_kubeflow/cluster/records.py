"""Where a submitted job lives, so a new process can reach it again.

TorchX hands the scheduler nothing but the app id (``<namespace>:<trainjob>``). The
kubeconfig and context it was submitted with are kept in one small JSON file per app
under ``$NEMORUN_HOME/kubeflow_trainer/``: written atomically by the one process that owns the app (rewritten only to record an
outcome nemo_kubeflow decided itself), so concurrent submissions cannot lose each
other's entries (unlike a shared state file).
Without a record, the default kubeconfig is used.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class AppRecord:
    namespace: str
    name: str
    kubeconfig: Optional[str]
    context: Optional[str]
    nodes: int
    job_dir: str = ""
    #: Set when nemo_kubeflow ended the job itself (e.g. an image that cannot be pulled).
    outcome_state: str = ""
    outcome_message: str = ""
    #: Following a running node's log warns after this many seconds without output (None: never).
    stall_warning_seconds: Optional[int] = None
    #: The task's name as its TrainJob's role (``<task>/<node>`` before log lines), for when the TrainJob is gone.
    task: str = ""
    #: Its TrainJob's experiment label: the status queries of the experiment's tasks read one snapshot of them
    #: (``cluster/experiment_snapshot.py``); "" in a record written before it was kept (each read on its own).
    experiment: str = ""


def app_id(namespace: str, name: str) -> str:
    return f"{namespace}:{name}"


def parse_app_id(value: str) -> tuple[str, str]:
    namespace, sep, name = value.partition(":")
    if not sep or not namespace or not name:
        raise ValueError(f"not a kubeflow_trainer app id (expected '<namespace>:<trainjob>'): {value!r}")
    return namespace, name


def _records_dir() -> str:
    from nemo_run.config import get_nemorun_home

    return os.path.join(get_nemorun_home(), "kubeflow_trainer")


def _path(namespace: str, name: str) -> str:
    return os.path.join(_records_dir(), f"{namespace}__{name}.json")


def save(record: AppRecord) -> None:
    directory = _records_dir()
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(record), f)
    os.replace(tmp, _path(record.namespace, record.name))


def load(namespace: str, name: str) -> Optional[AppRecord]:
    try:
        with open(_path(namespace, name)) as f:
            return AppRecord(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def record_outcome(namespace: str, name: str, state: str, message: str) -> bool:
    """Keep the final state of a job nemo_kubeflow deleted itself (a repair, `gc`) in its record, so that a
    later status reports how it ended rather than that it is gone. False when this machine has no record
    of the job (it was submitted elsewhere): nothing to keep it in."""
    record = load(namespace, name)
    if record is None:
        return False
    save(replace(record, outcome_state=state, outcome_message=message))
    return True
