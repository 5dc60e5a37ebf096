"""nemo_kubeflow: run NeMo-Run experiments on Kubernetes through Kubeflow Trainer v2.

Names are imported on first use (PEP 562), so ``import nemo_kubeflow`` and the local cluster
(``python -m nemo_kubeflow_local``, its own distribution in the repository's ``local/``) don't pay for
importing NeMo-Run. Using
``KubeflowExecutor`` imports ``nemo_kubeflow.config.executor``, which registers it with NeMo-Run;
so does fiddle when it rebuilds a saved experiment.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from importlib import import_module
from types import ModuleType
from typing import Any, Optional

__version__ = "0.1.0"

_EXPORTS = {
    "KubeflowExecutor": "nemo_kubeflow.config.executor",
    "PVCMount": "nemo_kubeflow.config.executor",
    "SecretMount": "nemo_kubeflow.config.executor",
    "TCPXOConfig": "nemo_kubeflow.parts.fabrics",
    "ConfigMapPackager": "nemo_kubeflow.config.packager",
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


#: Modules of earlier layouts whose names live on outside this package: experiments NeMo-Run saved name
#: their executor's classes by module (fiddle), and `nemo` command lines name factories
#: (``nemo_kubeflow.factories.kubeflow_gpu``). Each imports as its new module. First the flat layout, then
#: the stage packages before parts/ (``build.packaging`` still exists: it names ``ConfigMapPackager`` itself).
_MOVED = {
    "nemo_kubeflow.executor": "nemo_kubeflow.config.executor",
    "nemo_kubeflow.factories": "nemo_kubeflow.config.factories",
    "nemo_kubeflow.packaging": "nemo_kubeflow.config.packager",
    "nemo_kubeflow.fabrics": "nemo_kubeflow.parts.fabrics",
    "nemo_kubeflow.initializers": "nemo_kubeflow.parts.initializers",
    "nemo_kubeflow.build.fabrics": "nemo_kubeflow.parts.fabrics",
    "nemo_kubeflow.build.initializers": "nemo_kubeflow.parts.initializers",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a module's old name as the module itself (one object under two names)."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        return importlib.util.spec_from_loader(fullname, self) if fullname in _MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return import_module(_MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """The module ran when it was imported under its own name."""


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
