"""NeMo-Run CLI executor factories: ``run.executor=kubeflow_gpu`` and friends.

Usage with nemo_run 0.11 (see docs/cli.md for the pitfalls of its syntax)::

    nemo <group> <entrypoint> run.executor=kubeflow_gpu run.executor.nodes=2
    python train.py run.executor=kubeflow_cpu run.executor.namespace=team --dryrun

The factories are registered under ``run.Executor``: nemo_run looks executors up in the
``Executor`` namespace only, so registering under ``KubeflowExecutor`` would make them
invisible. This module is the package's ``nemo_run.cli`` entry point, so every
``nemo <group> <cmd>`` (and ``run.cli.resolve_factory``) finds them without the user
importing anything. Scripts driven by ``run.cli.main`` do not load entry points: they
must ``import nemo_kubeflow.config.factories`` themselves.

Each factory returns a ``run.Config`` (not a built executor) so that
``run.executor.<field>=`` overrides apply to any field, nested ones included
(``run.executor.packager.include_pattern=...``, ``run.executor.tcpxo.nic_count=...``).

Importing this module must stay cheap: nemo_run imports every ``nemo_run.cli`` entry
point for every ``nemo`` command, ours or not. No ``from __future__ import annotations``:
nemo_run parses CLI values by the factories' (and fields') annotations, and cannot parse
string annotations.
"""

import os
from typing import Any, Optional

import nemo_run as run

from nemo_kubeflow.config.executor import KubeflowExecutor
from nemo_kubeflow.config.packager import ConfigMapPackager
from nemo_kubeflow.errors import NemoKubeflowError
from nemo_kubeflow.parts.fabrics import TCPXOConfig

#: The image of the GPU and CPU factories: it has torch and nemo_run, which Partial tasks need.
DEFAULT_IMAGE = "nvcr.io/nvidia/nemo:25.02"
#: What the local cluster's pods "run": it ignores the image and uses this machine's Python.
LOCAL_IMAGE = "python:3.11"
#: Where ``kubeflow_local`` reads the local cluster's kubeconfig. A variable of its own rather
#: than ``$KUBECONFIG``, so that a job meant for the local cluster never lands on a real one.
LOCAL_KUBECONFIG_ENV = "NEMO_KUBEFLOW_LOCAL_KUBECONFIG"
#: GKE's node label for A3 Mega (a3-megagpu-8g) machines.
A3_MEGA_NODE_SELECTOR = {"cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"}
#: GKE taints GPU nodes ``nvidia.com/gpu=present:NoSchedule``.
GPU_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


class LocalClusterNotConfiguredError(NemoKubeflowError):
    """``kubeflow_local`` cannot find the local cluster's kubeconfig.

    Deliberately not a ``ValueError``: nemo_run's ``parse_executor`` swallows those and
    reports "Executor kubeflow_local not found" instead of this message.
    """


def _config(**fields: Any) -> run.Config[KubeflowExecutor]:
    # An explicit packager Config makes `run.executor.packager.<field>=` overridable.
    fields.setdefault("packager", run.Config(ConfigMapPackager))
    return run.Config(KubeflowExecutor, **fields)


@run.cli.factory(target=run.Executor)
def kubeflow_gpu(
    nodes: int = 1,
    nprocs_per_node: int = 8,
    gpus_per_node: int = 8,
    container_image: str = DEFAULT_IMAGE,
    namespace: str = "default",
    launcher: Optional[str] = "torchrun",
    shm_size: Optional[str] = "16Gi",
) -> run.Config[KubeflowExecutor]:
    """GPU training: ``nodes`` x ``nprocs_per_node`` torchrun processes, one GPU each."""
    return _config(
        nodes=nodes,
        nprocs_per_node=nprocs_per_node,
        gpus_per_node=gpus_per_node,
        container_image=container_image,
        namespace=namespace,
        launcher=launcher,
        shm_size=shm_size,
    )


@run.cli.factory(target=run.Executor)
def kubeflow_cpu(
    nodes: int = 1,
    nprocs_per_node: int = 1,
    container_image: str = DEFAULT_IMAGE,
    namespace: str = "default",
    cpu_request: Optional[str] = "1",
    memory_request: Optional[str] = "2Gi",
    shm_size: Optional[str] = "1Gi",
) -> run.Config[KubeflowExecutor]:
    """CPU-only jobs (data preparation, evaluation, tests) with small requests.

    No launcher: a Python task with more than one process is run under torchrun anyway.
    """
    return _config(
        nodes=nodes,
        nprocs_per_node=nprocs_per_node,
        gpus_per_node=0,
        container_image=container_image,
        namespace=namespace,
        cpu_request=cpu_request,
        memory_request=memory_request,
        shm_size=shm_size,
    )


@run.cli.factory(target=run.Executor)
def kubeflow_tcpxo(
    nodes: int = 2,
    nprocs_per_node: int = 8,
    gpus_per_node: int = 8,
    container_image: str = DEFAULT_IMAGE,
    namespace: str = "default",
    launcher: Optional[str] = "torchrun",
    shm_size: Optional[str] = "16Gi",
) -> run.Config[KubeflowExecutor]:
    """GKE A3 Mega (8 x H100 Mega per node) with GPUDirect-TCPXO.

    Two nodes by default: TCPXO only carries traffic between nodes. The namespace must
    allow privileged pods (the TCPXO daemon sidecar needs NET_ADMIN and host paths).
    """
    return _config(
        nodes=nodes,
        nprocs_per_node=nprocs_per_node,
        gpus_per_node=gpus_per_node,
        container_image=container_image,
        namespace=namespace,
        launcher=launcher,
        shm_size=shm_size,
        enable_tcpxo=True,
        # An explicit Config makes `run.executor.tcpxo.<field>=` overridable.
        tcpxo=run.Config(TCPXOConfig),
        node_selector=dict(A3_MEGA_NODE_SELECTOR),
        tolerations=[dict(t) for t in GPU_TOLERATIONS],
    )


@run.cli.factory(target=run.Executor)
def kubeflow_local(
    nodes: int = 1,
    nprocs_per_node: int = 1,
    namespace: str = "default",
    kubeconfig: Optional[str] = None,
) -> run.Config[KubeflowExecutor]:
    """A CPU job on a running local cluster (``python -m nemo_kubeflow_local serve``; the local cluster is the
    repository's second distribution: ``pip install ./local``).

    The kubeconfig comes from ``$NEMO_KUBEFLOW_LOCAL_KUBECONFIG`` unless given.
    """
    path = kubeconfig or os.environ.get(LOCAL_KUBECONFIG_ENV)
    if not path:
        raise LocalClusterNotConfiguredError(
            f"kubeflow_local needs a running local cluster: start one with "
            f"`python -m nemo_kubeflow_local serve` and export {LOCAL_KUBECONFIG_ENV} "
            "to the kubeconfig path it prints (the local cluster is installed from the repository's local/ "
            "folder: `pip install ./local`)"
        )
    if not os.path.isfile(path):
        raise LocalClusterNotConfiguredError(
            f"{LOCAL_KUBECONFIG_ENV}={path}: no such file; is the local cluster still running? "
            "Start one with `python -m nemo_kubeflow_local serve` and export the kubeconfig path it prints"
        )
    return _config(
        nodes=nodes,
        nprocs_per_node=nprocs_per_node,
        gpus_per_node=0,
        container_image=LOCAL_IMAGE,
        namespace=namespace,
        kubeconfig=os.path.abspath(path),
        # The local cluster backs every emptyDir with disk: a /dev/shm size means nothing there.
        shm_size=None,
    )
