"""The steps of a TrainJob besides training: the initializer jobs and the preflight init container.

Pure helpers for whoever reads pods (logs, status): how to find each step's pods, and why a step
failed. Trainer's ``Failed`` condition only names the first failed Job (``...-dataset-initializer-0``
or ``...-node-0``); the step's own message is in its pod's container status, where the initializer
and preflight containers put it (``terminationMessagePolicy: FallbackToLogsOnError``, and the
preflight script writes its verdict to the termination log).
"""

from __future__ import annotations

from typing import Optional, Sequence

from nemo_kubeflow.constants import COMPLETION_INDEX_LABEL, JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL, TRAINER_NODE

DATASET_INITIALIZER = "dataset-initializer"
MODEL_INITIALIZER = "model-initializer"
#: The replicated jobs that run before ``node``; each has one pod whose container bears the job's name.
INITIALIZER_STEPS = (DATASET_INITIALIZER, MODEL_INITIALIZER)
#: The init container of every ``node`` pod that runs the preflight checks.
PREFLIGHT_CONTAINER = "preflight"


def step_selector(trainjob: str, step: str) -> str:
    """Label selector of a step's pods: ``dataset-initializer``, ``model-initializer`` or ``node``."""
    return f"{JOBSET_NAME_LABEL}={trainjob},{REPLICATED_JOB_LABEL}={step}"


def failed_step(pods: Sequence[dict]) -> Optional[str]:
    """What failed first among the initializers and the preflight checks, with its message
    (``None`` if neither did). Give it the TrainJob's pods (``step_selector`` or the JobSet label)."""
    failures = []
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels", {})
        status = pod.get("status") or {}
        job = labels.get(REPLICATED_JOB_LABEL)
        if job in INITIALIZER_STEPS:
            where, statuses = job, status.get("containerStatuses") or []
        elif job == TRAINER_NODE:
            where = f"preflight on node {labels.get(COMPLETION_INDEX_LABEL, '?')}"
            statuses = [s for s in status.get("initContainerStatuses") or [] if s.get("name") == PREFLIGHT_CONTAINER]
        else:
            continue
        for cs in statuses:
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if term and term.get("exitCode", 0) != 0:
                why = _headline(term.get("message") or "") or f"exited with code {term.get('exitCode')}"
                failures.append((term.get("finishedAt") or "", f"{where} (pod {pod['metadata']['name']}): {why}"))
    return min(failures)[1] if failures else None


def _headline(message: str) -> str:
    """The line of a termination message (often a log tail) that says what went wrong: the last
    one mentioning an error (a logged ERROR, ``FooError: ...``), else the last line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    return (errors or lines or [""])[-1]
