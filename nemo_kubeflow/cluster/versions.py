"""What the cluster runs, read the way any user may: Trainer's version from the ConfigMap its
manifests publish (``kubeflow-system/kubeflow-trainer-public``, readable by every authenticated
user), and what follows from it for a runtime's JobSet TTL.

Trainer v2.3.0 and older clear a TrainJob's ``Failed`` condition at the top of every reconcile
(``removeFailedCondition``, kept only for ``DeadlineExceeded``) and rebuild the job's objects while
it looks unfinished: once a JobSet ``ttlSecondsAfterFinished`` deletes a failed job's JobSet, Trainer
builds it again (about 11 s later on the real controllers), the job runs again from restart 0, and
so on forever (trainer#3779; fixed by #3891, in v2.4.0). ``Complete`` jobs are not affected.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Optional

from nemo_kubeflow.cluster.client import Cluster
from nemo_kubeflow.constants import (
    TRAINER_FAILED_TERMINAL_SINCE,
    TRAINER_PUBLIC_CONFIGMAP,
    TRAINER_SYSTEM_NAMESPACE,
    TRAINER_VERSION_KEY,
)
from nemo_kubeflow.errors import ClusterError, ConfigError

log = logging.getLogger(__name__)

Version = tuple[int, int, int]


def parse_version(text: Any) -> Optional[Version]:
    """``v2.3.0``, ``2.3.0-rc.1``, ``v0.19.2`` -> (2, 3, 0); ``None`` for anything else."""
    found = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(text or "").strip())
    return (int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)) if found else None


def format_version(version: Optional[Version]) -> str:
    return "v" + ".".join(map(str, version)) if version else "unknown"


def trainer_version(cluster: Cluster) -> tuple[Optional[Version], str]:
    """Trainer's version and where it was read ("" when found), or ``None`` and why it is unknown."""
    where = f"ConfigMap {TRAINER_SYSTEM_NAMESPACE}/{TRAINER_PUBLIC_CONFIGMAP}"
    try:
        found = cluster.get("ConfigMap", TRAINER_PUBLIC_CONFIGMAP, TRAINER_SYSTEM_NAMESPACE)
    except ClusterError as e:
        return None, f"{where} could not be read ({e.status or e})"
    if found is None:
        return None, f"{where} does not exist (Trainer installed without its manifests' public ConfigMap)"
    return _version_in(found, where)


def _version_in(configmap: dict, where: str) -> tuple[Optional[Version], str]:
    """The version Trainer's public ConfigMap (``where``) publishes, or ``None`` and what it holds instead."""
    text = (configmap.get("data") or {}).get(TRAINER_VERSION_KEY)
    version = parse_version(text)
    if version is None:
        return None, f"{where} has no version in {TRAINER_VERSION_KEY} ({text!r})"
    return version, ""


def keeps_failed_jobs_failed(version: Optional[Version]) -> bool:
    """Whether this Trainer leaves a failed TrainJob failed once its JobSet is gone (unknown: no)."""
    return version is not None and version >= TRAINER_FAILED_TERMINAL_SINCE


def jobset_ttl(runtime: Optional[dict]) -> Optional[int]:
    """The ``ttlSecondsAfterFinished`` of a runtime's JobSet template, ``None`` when it sets none."""
    ttl: Any = runtime
    for key in ("spec", "template", "spec", "ttlSecondsAfterFinished"):
        ttl = (ttl or {}).get(key)
    return ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else None


def ttl_loop_problem(runtime: Optional[dict], version: Optional[Version], unknown_why: str = "") -> str:
    """Why a job on ``runtime`` would run again forever after failing ("" when it would not)."""
    runtime = runtime or {}
    ttl = jobset_ttl(runtime)
    if ttl is None or keeps_failed_jobs_failed(version):
        return ""
    which = f"{runtime.get('kind', 'runtime')} {(runtime.get('metadata') or {}).get('name', '?')!r}"
    return (
        f"{which} sets a JobSet ttlSecondsAfterFinished ({ttl}) and {_this_trainer(version, unknown_why)}: "
        "Trainer v2.3.0 and older "
        "build a failed job's JobSet again once the TTL deletes it and run the job again, forever "
        "(trainer#3779, fixed in v2.4.0). Remove ttlSecondsAfterFinished from that runtime, and use the "
        "executor's ttl_seconds_after_finished with `nemo-kubeflow gc --expired` on a schedule instead "
        "(docs/reliability.md#finished-jobs)"
    )


def _this_trainer(version: Optional[Version], unknown_why: str) -> str:
    """This cluster's Trainer as a message names it: its version, or why that is unknown."""
    if version:
        return f"this cluster's Trainer is {format_version(version)}"
    return f"this cluster's Trainer version is unknown: {unknown_why}"


def check_runtime_ttl(cluster: Cluster, runtime: Optional[dict]) -> None:
    """Refuse, before anything is written, a job whose runtime has a JobSet TTL on a Trainer that reruns
    failed jobs after it (or whose version cannot be told)."""
    if jobset_ttl(runtime) is None:
        return
    version, why = trainer_version(cluster)
    problem = ttl_loop_problem(runtime, version, why)
    if problem:
        raise ConfigError(problem)
