"""Building the ``Submission`` of one task: executor + NeMo-Run role + files -> manifests.

Pure apart from reading the runtime template: no cluster, no environment variables,
no clock. The same inputs give the same manifests, which is what the golden tests pin.
"""

from __future__ import annotations

from typing import Optional, Sequence

from torchx.specs import Role

from nemo_kubeflow import manifests as mf
from nemo_kubeflow import naming
from nemo_kubeflow.command import build_launch
from nemo_kubeflow.packaging import BundleFile, build_code_package, describe_package
from nemo_kubeflow.render import render_runtime, runtime_context

# NeMo-Run's torchrun component shell-quotes its arguments itself; its other roles don't.
_QUOTING_ENTRYPOINTS = ("torchrun", "ft_launcher")


def build_submission(
    executor,
    role: Role,
    files: Sequence[BundleFile],
    *,
    task_name: str,
    experiment_id: Optional[str] = None,
) -> mf.Submission:
    """Everything one task sends. ``role`` is NeMo-Run's role after macro substitution."""
    ns = executor.namespace
    experiment_id = experiment_id or executor.experiment_id or "experiment"
    name = naming.trainjob_name(experiment_id, task_name)
    labels = mf.common_labels(experiment_id, task_name, name)

    code = build_code_package(
        files,
        name=naming.derived_name(name, "code"),
        namespace=ns,
        labels=labels,
        mount_path=executor.workspace_mount_path,
        mode=getattr(executor.packager, "mode", "auto"),
        max_shards=getattr(executor.packager, "max_shards", 16),
    ) if files else None

    workspace = executor.workspace_mount_path.rstrip("/")
    has_code = any(f.path.startswith("code/") for f in files)
    exports = {}
    if executor.enable_tcpxo:
        exports["LD_LIBRARY_PATH"] = '/usr/local/nvidia/lib64"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"'
    launch = build_launch(
        role.entrypoint,
        list(role.args),
        args_are_quoted=role.entrypoint in _QUOTING_ENTRYPOINTS,
        distributed=executor.nodes * executor.nprocs_per_node > 1,
        workspace=workspace,
        # Nothing shipped means no workspace volume: stay in the image's working directory.
        workdir=(f"{workspace}/code" if has_code else workspace) if code else None,
        pythonpath=[f"{workspace}/code"] if has_code else [],
        prologue=code.prologue if code else "",
        exports=exports,
    )

    runtime = None
    if executor.runtime_name:
        runtime_name = executor.runtime_name
    else:
        runtime = render_runtime(runtime_context(executor), executor.runtime_template)
        runtime_name = runtime["metadata"]["name"]

    secret_name = naming.derived_name(name, "env") if executor.secret_env_vars else None
    # NeMo-Run folds env_vars into role.env already; merging again keeps a role built any
    # other way honest, and role.env wins because it carries Script.env overrides.
    env = mf.trainer_env(
        {**executor.env_vars, **role.env}, secret_name, list(executor.secret_env_vars), dict(executor.secret_key_refs)
    )
    patch = mf.runtime_patch(
        code.volumes if code else [],
        code.volume_mounts if code else [],
        mf.one_pod_per_node_affinity(name) if executor.spreads_pods() and executor.nodes > 1 else None,
    )
    trainjob = mf.build_trainjob(
        name=name,
        namespace=ns,
        runtime_kind=executor.runtime_kind,
        runtime_name=runtime_name,
        image=executor.container_image,
        launch=launch,
        nodes=executor.nodes,
        nprocs_per_node=executor.nprocs_per_node,
        env=env,
        resources=mf.resources_per_node(executor),
        labels={**labels, **executor.labels},
        annotations=dict(executor.annotations),
        patch=patch,
        active_deadline_seconds=executor.active_deadline_seconds,
    )
    secret = None
    if secret_name:
        secret = mf.masked_secret(
            mf.secret_manifest(secret_name, ns, {k: mf.MASK for k in executor.secret_env_vars}, labels)
        )
    pvcs = [mf.pvc_manifest(p, ns, {mf.MANAGED_BY_LABEL: mf.MANAGED_BY_VALUE}) for p in executor.pvc_mounts if p.create]
    summary = {
        "trainjob": name,
        "namespace": ns,
        "runtime": f"{executor.runtime_kind}/{runtime_name}" + ("" if runtime else " (existing)"),
        "size": f"{executor.nodes} node(s) x {executor.nprocs_per_node} process(es)"
        + (f", {executor.gpus_per_node} GPU(s) per node" if executor.gpus_per_node else ", CPU only"),
        "image": executor.container_image,
        "package": describe_package(code) if code else "nothing to ship",
        "command": launch.command_line,
    }
    return mf.Submission(
        namespace=ns,
        trainjob=trainjob,
        runtime=runtime,
        configmaps=list(code.configmaps) if code else [],
        secret=secret,
        secret_sources=dict(executor.secret_env_vars),
        pvcs=pvcs,
        launch=launch,
        summary=summary,
    )
