"""Building the ``Submission`` of one task: executor + NeMo-Run role + files -> manifests.

Pure apart from reading the packaged templates (the runtime template, the preflight script):
no cluster, no environment variables, no clock. The same inputs give the same manifests, which
is what the golden tests pin.
"""

from __future__ import annotations

import shlex
from typing import Optional, Sequence

from torchx.specs import Role

from nemo_kubeflow import initializers
from nemo_kubeflow import manifests as mf
from nemo_kubeflow import naming
from nemo_kubeflow.command import build_launch
from nemo_kubeflow.constants import DNS_LABEL_MAX, TRAINER_NODE
from nemo_kubeflow.errors import ConfigError
from nemo_kubeflow.fabrics import build_fabric
from nemo_kubeflow.packaging import BundleFile, build_code_package, describe_package
from nemo_kubeflow.status import queue_name
from nemo_kubeflow.render import render_runtime, runtime_context

# NeMo-Run's torchrun component shell-quotes its arguments itself; its other roles don't.
_QUOTING_ENTRYPOINTS = ("torchrun", "ft_launcher")
#: Task variables the preflight checks read (NCCL and libfabric settings, their own settings).
_PREFLIGHT_ENV_PREFIXES = ("NCCL_", "FI_", "PREFLIGHT_")


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
    runtime = None
    if executor.runtime_name:
        runtime_name = executor.runtime_name
    else:
        runtime = render_runtime(runtime_context(executor), executor.runtime_template)
        runtime_name = runtime["metadata"]["name"]
    name = naming.trainjob_name(experiment_id, task_name, _name_budget(executor, runtime))
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
    fabric = build_fabric(executor)
    if fabric.library_path:
        # Extended, not replaced, so that the image's own LD_LIBRARY_PATH survives.
        exports["LD_LIBRARY_PATH"] = shlex.quote(fabric.library_path) + '"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"'
    if executor.timeout_defaults and executor.nodes * executor.nprocs_per_node > 1:
        # In the script, not in spec.trainer.env: a value from the image or an envFrom Secret still wins.
        task_env = [*executor.env_vars, *role.env, *executor.secret_env_vars, *executor.secret_key_refs]
        exports.update(mf.timeout_exports(task_env))
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
        rendezvous_id=name,
    )

    secret_name = naming.derived_name(name, "env") if executor.secret_env_vars else None
    # NeMo-Run folds env_vars into role.env already; merging again keeps a role built any
    # other way honest, and role.env wins because it carries Script.env overrides.
    plain_env = {**executor.env_vars, **role.env}
    env = mf.trainer_env(plain_env, secret_name, list(executor.secret_env_vars), dict(executor.secret_key_refs))
    if role.entrypoint == "ft_launcher":
        env.append(mf.restart_attempt_env())
    preflight_env = [{"name": k, "value": str(v)} for k, v in plain_env.items()
                     if k.startswith(_PREFLIGHT_ENV_PREFIXES)] if executor.preflight else []
    patch = mf.runtime_patch(
        code.volumes if code else [],
        code.volume_mounts if code else [],
        mf.merge_affinity(
            mf.one_pod_per_node_affinity(name) if executor.spreads_pods() and executor.nodes > 1 else None,
            mf.same_domain_affinity(name, executor.topology_key) if executor.topology_key and executor.nodes > 1
            else None,
        ),
        preflight_env,
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
        labels={**labels, **executor.labels, **mf.queue_labels(executor.queue_name, executor.workload_priority_class)},
        annotations=dict(executor.annotations),
        patch=patch,
        active_deadline_seconds=executor.active_deadline_seconds,
        initializer=initializers.trainjob_initializer(executor),
    )
    secret = None
    if secret_name:
        secret = mf.masked_secret(
            mf.secret_manifest(secret_name, ns, {k: mf.MASK for k in executor.secret_env_vars}, labels)
        )
    pvcs = _claims_to_create(executor)
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
    if fabric.name != "none":
        summary["network_fabric"] = fabric.name
    if executor.initializer is not None:
        summary["initializers"] = ", ".join(st.name for st in initializers.steps(executor))
    queue = queue_name(trainjob)
    if queue:
        summary["queue"] = f"Kueue LocalQueue {queue}" + (
            f", priority {executor.workload_priority_class}" if executor.workload_priority_class else "")
    if executor.pod_group_policy != "none":
        summary["gang scheduling"] = executor.pod_group_policy
    if executor.topology_key:
        summary["placement"] = f"all nodes in one {executor.topology_key} domain"
    if executor.preflight:
        summary["preflight"] = "the packaged checks" if executor.preflight is True else "your command"
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


def planned_jobs(executor, runtime: Optional[dict]) -> list[naming.ReplicatedJobShape]:
    """The replicated jobs of the JobSet Trainer will build: those of the rendered runtime; with an
    existing runtime (``runtime_name``, not readable offline), the initializers this executor asks for and
    the trainer's ``node`` job. submit.py checks an existing runtime's own jobs before writing anything."""
    if runtime is not None:
        return naming.runtime_job_shapes(runtime, executor.nodes)
    return ([naming.ReplicatedJobShape(step.name) for step in initializers.steps(executor)]
            + [naming.ReplicatedJobShape(TRAINER_NODE, completions=executor.nodes)])


def _name_budget(executor, runtime: Optional[dict]) -> int:
    """How long the TrainJob name may be so that JobSet accepts every pod name (naming.py has the rule)."""
    jobs = planned_jobs(executor, runtime)
    budget = naming.jobset_name_budget(jobs)
    if budget < naming.TRAINJOB_NAME_MIN:
        longest = max(jobs, key=lambda job: len(naming.longest_pod_name("", job)))
        raise ConfigError(
            f"replicated job {longest.name!r} of the runtime leaves {budget} characters for the TrainJob name"
            f" (pod names '<trainjob>-{longest.name}-{longest.replicas - 1}-{longest.completions - 1}-<5 random>'"
            f" must fit in {DNS_LABEL_MAX}); a name needs at least {naming.TRAINJOB_NAME_MIN}:"
            " give the runtime's replicated jobs shorter names"
        )
    return budget


def _claims_to_create(executor) -> list[dict]:
    """PVCs marked for creation: ``pvc_mounts`` with ``create``, the initializers' claim."""
    labels = {mf.MANAGED_BY_LABEL: mf.MANAGED_BY_VALUE}
    pvcs = [mf.pvc_manifest(p.claim_name, executor.namespace, labels, size=p.size, access_modes=p.access_modes,
                            storage_class=p.storage_class) for p in executor.pvc_mounts if p.create]
    s = initializers.settings(executor)
    created = {p["metadata"]["name"] for p in pvcs}
    if executor.initializer is not None and s.create_claim and s.claim_name not in created:
        pvcs.append(mf.pvc_manifest(s.claim_name, executor.namespace, labels, size=s.claim_size,
                                    access_modes=s.access_modes, storage_class=s.storage_class))
    return pvcs
