"""NeMo-Run's import as the CLI does it: without torch, and for ``render`` and ``validate`` with what only
NeMo-Run's other executors use deferred (``NEMO_RUN_DEFERRED``)."""

from __future__ import annotations

import sys

#: What ``import nemo_run`` loads for its other executors (Lepton's SDK; kubernetes for its own Kubeflow
#: executor; requests for DGX Cloud), its SSH tunnels (paramiko, fabric), running an experiment's task
#: graph (networkx), notebook pictures (graphviz), Markdown help (markdown_it), and fiddle's code printing
#: and lambda sources (libcst): about 1.4 s of NeMo-Run's 1.8 s without torch, none of it used by ``render`` or
#: ``validate``, which defer them while they import NeMo-Run (``deferred_imports``).
NEMO_RUN_DEFERRED = (
    "leptonai",
    "paramiko",
    "fabric",
    "kubernetes",
    "requests",
    "networkx",
    "graphviz",
    "markdown_it",
    "libcst",
)


def _import_nemo_run(defer: bool = False):
    """``import nemo_run``, without the torch import it does only to register a YAML representer
    for ``torch.dtype`` (about half of NeMo-Run's import time; no executor field is a dtype).
    torch stays importable afterwards; only that representer is missing in this process.
    With ``defer`` (``render``, ``validate``), ``NEMO_RUN_DEFERRED`` are stand-ins while it imports."""
    if "nemo_run" not in sys.modules and "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ModuleNotFoundError
        try:
            if defer:
                from nemo_kubeflow.nemo_run.deferred_imports import import_deferring

                import_deferring("nemo_run", NEMO_RUN_DEFERRED)
            import nemo_run
        finally:
            if sys.modules.get("torch", 0) is None:
                del sys.modules["torch"]
    import nemo_run

    return nemo_run
