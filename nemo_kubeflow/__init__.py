"""nemo_kubeflow: run NeMo-Run experiments on Kubernetes through Kubeflow Trainer v2.

Importing the package registers ``KubeflowExecutor`` with NeMo-Run.
"""

from nemo_kubeflow.errors import (
    ClusterError,
    ConfigError,
    ManifestValidationError,
    NemoKubeflowError,
    PackageTooLargeError,
    PackagingError,
    SubmissionError,
    TemplateError,
)
from nemo_kubeflow.executor import KubeflowExecutor, PVCMount, SecretMount, TCPXOConfig
from nemo_kubeflow.packaging import ConfigMapPackager

__all__ = [
    "ClusterError",
    "ConfigError",
    "ConfigMapPackager",
    "KubeflowExecutor",
    "ManifestValidationError",
    "NemoKubeflowError",
    "PVCMount",
    "PackageTooLargeError",
    "PackagingError",
    "SecretMount",
    "SubmissionError",
    "TCPXOConfig",
    "TemplateError",
]
