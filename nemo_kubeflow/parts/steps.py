"""The steps of a TrainJob besides training: the initializer jobs and the preflight init container.

Their names, and how to find each step's pods; why a step failed is ``pod_states.failed_step``.
"""

from __future__ import annotations

from nemo_kubeflow.constants import JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL

DATASET_INITIALIZER = "dataset-initializer"
MODEL_INITIALIZER = "model-initializer"
#: The replicated jobs that run before ``node``; each has one pod whose container bears the job's name.
INITIALIZER_STEPS = (DATASET_INITIALIZER, MODEL_INITIALIZER)
#: The init container of every ``node`` pod that runs the preflight checks.
PREFLIGHT_CONTAINER = "preflight"


def step_selector(trainjob: str, step: str) -> str:
    """Label selector of a step's pods: ``dataset-initializer``, ``model-initializer`` or ``node``."""
    return f"{JOBSET_NAME_LABEL}={trainjob},{REPLICATED_JOB_LABEL}={step}"
