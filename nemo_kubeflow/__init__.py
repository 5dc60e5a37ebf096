"""nemo_kubeflow: run NeMo-Run experiments on Kubernetes through Kubeflow Trainer v2.

Names are imported on first use (PEP 562), so ``import nemo_kubeflow`` and the local
cluster (``python -m nemo_kubeflow.local``) don't pay for importing NeMo-Run. Using
``KubeflowExecutor`` imports ``nemo_kubeflow.executor``, which registers it with NeMo-Run;
so does fiddle when it rebuilds a saved experiment.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "KubeflowExecutor": "nemo_kubeflow.executor",
    "PVCMount": "nemo_kubeflow.executor",
    "SecretMount": "nemo_kubeflow.executor",
    "TCPXOConfig": "nemo_kubeflow.executor",
    "ConfigMapPackager": "nemo_kubeflow.packaging",
    "AdmissionDeniedError": "nemo_kubeflow.errors",
    "ClusterError": "nemo_kubeflow.errors",
    "ConfigError": "nemo_kubeflow.errors",
    "ManifestValidationError": "nemo_kubeflow.errors",
    "NemoKubeflowError": "nemo_kubeflow.errors",
    "PackageTooLargeError": "nemo_kubeflow.errors",
    "PackagingError": "nemo_kubeflow.errors",
    "SubmissionError": "nemo_kubeflow.errors",
    "TemplateError": "nemo_kubeflow.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nemo_kubeflow' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
