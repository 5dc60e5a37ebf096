"""The build stage: one task (executor + NeMo-Run role + files) -> its ``Submission``.

``build_for_app`` is the whole stage as the scheduler and ``nemo-kubeflow render`` run it: validate the
executor, collect and check the task's files, ship a local script, build, validate the manifests
offline. ``resolve`` turns the executor into ``ExecutorFacts`` once per task (the network fabric, the
initializer settings and steps, the runtime's volumes, the resources per node), and the builders
(render.py, manifests.py, initializers.py) take those facts, never the executor's derived settings
again.

Pure apart from reading the packaged templates (the runtime template, the preflight script) and,
in ``build_for_app``, the task's files: no cluster, no environment variables, no clock. The same
inputs give the same manifests, which is what the golden tests pin.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

from torchx.specs import AppDef, Role

from nemo_kubeflow.build import manifests as mf
from nemo_kubeflow.build.command import (
    LaunchSpec,
    build_launch,
    split_torchrun_args,
    substitute_macros,
    warm_start_problem,
)
from nemo_kubeflow.build.packaging import CodePackage, build_code_package, describe_package
from nemo_kubeflow.build.render import existing_runtime_pod, render_runtime, runtime_context, runtime_volumes
from nemo_kubeflow.config.field_types import type_problem
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.constants import DNS_LABEL_MAX, TRAINER_NODE, queue_name
from nemo_kubeflow.errors import ConfigError, PackagingError
from nemo_kubeflow.parts import initializers, naming
from nemo_kubeflow.parts.escapes import literal_env
from nemo_kubeflow.parts.fabrics import Fabric, build_fabric

if TYPE_CHECKING:
    from nemo_run.core.execution.base import ExecutorMacros

    from nemo_kubeflow.config.executor import KubeflowExecutor

# NeMo-Run's torchrun component shell-quotes its arguments itself; its other roles don't.
_QUOTING_ENTRYPOINTS = ("torchrun", "ft_launcher")
#: Task variables the preflight checks read (NCCL and libfabric settings, their own settings).
_PREFLIGHT_ENV_PREFIXES = ("NCCL_", "FI_", "PREFLIGHT_")
#: torchelastic's log level in our pods unless the executor's env_vars set LOGLEVEL: NeMo-Run's launchers set
#: INFO, about 60 lines of agent chatter per job; warnings and errors (a rank's failure) still show.
DEFAULT_LOGLEVEL = "WARNING"


@dataclass
class Submission:
    """Everything one task's submission sends, in the order it is sent."""

    namespace: str
    trainjob: dict
    #: The rendered runtime, or ``None`` when an existing runtime is used.
    runtime: Optional[dict]
    configmaps: list[dict]
    #: The Secret of ``secret_env_vars``, with masked values (filled in at submission).
    secret: Optional[dict]
    #: Secret key -> where its value is read on the submitting machine (``env:``/``file:``).
    secret_sources: dict[str, str]
    #: Claims to create when missing.
    pvcs: list[dict]
    launch: LaunchSpec
    summary: dict[str, Any] = field(default_factory=dict)
    #: The executor's ``gpu_resource_name``: what the checks before writing name ``gpus_per_node`` by.
    gpu_resource: str = "nvidia.com/gpu"

    @property
    def name(self) -> str:
        return self.trainjob["metadata"]["name"]

    def release_files(self) -> None:
        """Drop the shipped files (the ConfigMaps' ``data`` and ``binaryData``) once they were sent, keeping the rest:
        NeMo-Run keeps each task's dry run as long as the experiment, so a sweep would hold a copy of its code per
        task. A submission whose files were released is not sent again (its TrainJob exists: refused first)."""
        self.configmaps = [{k: v for k, v in cm.items() if k not in ("data", "binaryData")} for cm in self.configmaps]

    def manifests(self) -> list[dict]:
        """All objects, masked, in submission order (for dry runs and validation)."""
        objs = [*self.pvcs]
        if self.runtime is not None:
            objs.append(self.runtime)
        objs.append(self.trainjob)
        objs.extend(self.configmaps)
        if self.secret is not None:
            objs.append(self.secret)
        return objs


@dataclass(frozen=True)
class ExecutorFacts:
    """A validated executor resolved once per task into what the builders need besides its plain
    fields: the settings objects with their defaults filled in, and what several fields decide
    together. The builders read plain settings (``nodes``, ``tolerations``...) from ``executor``."""

    executor: KubeflowExecutor
    #: What the network fabric profile adds to the pods (``Fabric()`` for ``"none"``).
    fabric: Fabric
    #: ``initializer_settings``, or the defaults.
    initializer_settings: initializers.InitializerSettings
    #: The initializer jobs of the runtime, dataset first (none without ``initializer``).
    initializer_steps: tuple[initializers.Step, ...]
    #: The runtime's pod volumes and their mounts in the ``node`` container.
    volumes: tuple[dict, ...]
    mounts: tuple[dict, ...]
    #: The TrainJob's ``resourcesPerNode`` (``None``: nothing requested).
    resources: Optional[dict]


def resolve(executor: KubeflowExecutor) -> ExecutorFacts:
    """``executor``'s ``ExecutorFacts``. Pure; the executor must have passed ``validate()``."""
    fabric = build_fabric(executor)
    settings = initializers.settings(executor)
    steps = tuple(initializers.steps(executor.initializer, settings))
    volumes, mounts = runtime_volumes(executor, fabric, steps, settings)
    return ExecutorFacts(
        executor=executor,
        fabric=fabric,
        initializer_settings=settings,
        initializer_steps=steps,
        volumes=tuple(volumes),
        mounts=tuple(mounts),
        resources=mf.resources_per_node(executor, fabric),
    )


def build_submission(
    executor: KubeflowExecutor,
    role: Role,
    files: Sequence[BundleFile],
    *,
    task_name: str,
    experiment_id: Optional[str] = None,
) -> Submission:
    """Everything one task sends. ``role`` is NeMo-Run's role after macro substitution (``build_for_app``)."""
    facts = resolve(executor)
    ns = executor.namespace
    experiment_id = experiment_id or executor.experiment_id or "experiment"
    runtime, runtime_name = _runtime(facts)
    name = naming.trainjob_name(experiment_id, task_name, _name_budget(facts, runtime))
    labels = mf.common_labels(experiment_id, task_name, name)
    code = _code_package(executor, files, name, labels)
    launch = _launch(facts, role, files, code, name)

    secret_name = naming.derived_name(name, "env") if executor.secret_env_vars else None
    plain_env = _plain_env(executor, role)
    trainjob = mf.build_trainjob(
        name=name,
        namespace=ns,
        runtime_kind=executor.runtime_kind,
        runtime_name=runtime_name,
        image=executor.container_image,
        launch=launch,
        nodes=executor.nodes,
        nprocs_per_node=executor.nprocs_per_node,
        env=_trainer_env(executor, role, plain_env, secret_name),
        resources=facts.resources,
        labels={**labels, **executor.labels, **mf.queue_labels(executor.queue_name, executor.workload_priority_class)},
        annotations={
            **dict(executor.annotations),
            **mf.node_avoidance_annotations(executor),
            **mf.ttl_annotations(executor),
        },
        patch=_runtime_patch(facts, code, name, plain_env, existing_runtime=runtime is None),
        active_deadline_seconds=executor.active_deadline_seconds,
        initializer=initializers.trainjob_initializer(executor.initializer, facts.initializer_settings),
    )
    return Submission(
        namespace=ns,
        trainjob=trainjob,
        runtime=runtime,
        configmaps=list(code.configmaps) if code else [],
        secret=_masked_secret(executor, secret_name, labels),
        secret_sources=dict(executor.secret_env_vars),
        pvcs=_claims_to_create(facts),
        launch=launch,
        summary=_summary(
            facts,
            trainjob,
            f"{executor.runtime_kind}/{runtime_name}" + ("" if runtime else " (existing)"),
            code,
            launch,
        ),
        gpu_resource=executor.gpu_resource_name,
    )


def _runtime(facts: ExecutorFacts) -> tuple[Optional[dict], str]:
    """The runtime rendered for the task (``None`` with an existing one, ``runtime_name``), and its name."""
    executor = facts.executor
    if executor.runtime_name:
        return None, executor.runtime_name
    runtime = render_runtime(runtime_context(facts), executor.runtime_template)
    return runtime, runtime["metadata"]["name"]


def _trainer_env(
    executor: KubeflowExecutor, role: Role, plain_env: dict[str, str], secret_name: Optional[str]
) -> list[dict]:
    """``spec.trainer.env``: the task's literal variables, the Secret references, ft_launcher's restart attempt."""
    env = mf.trainer_env(plain_env, secret_name, list(executor.secret_env_vars), dict(executor.secret_key_refs))
    if role.entrypoint == "ft_launcher":
        env.append(mf.restart_attempt_env())
    return env


def _masked_secret(executor: KubeflowExecutor, secret_name: Optional[str], labels: dict) -> Optional[dict]:
    """The Secret of ``secret_env_vars``, its values masked (``None`` without secret variables)."""
    if not secret_name:
        return None
    values = {k: mf.MASK for k in executor.secret_env_vars}
    return mf.masked_secret(mf.secret_manifest(secret_name, executor.namespace, values, labels))


def _code_package(
    executor: KubeflowExecutor, files: Sequence[BundleFile], name: str, labels: dict
) -> Optional[CodePackage]:
    """The ConfigMaps that ship the task's files (``None``: nothing to ship)."""
    if not files:
        return None
    return build_code_package(
        files,
        name=naming.derived_name(name, "code"),
        namespace=executor.namespace,
        labels=labels,
        mount_path=executor.workspace_mount_path,
        mode=getattr(executor.packager, "mode", "auto"),
        max_shards=getattr(executor.packager, "max_shards", 16),
        share_code=True,
    )


def _launch(
    facts: ExecutorFacts, role: Role, files: Sequence[BundleFile], code: Optional[CodePackage], name: str
) -> LaunchSpec:
    """The command the ``node`` container runs: the role's entrypoint, in the shipped workspace."""
    executor = facts.executor
    workspace = executor.workspace_mount_path.rstrip("/")
    has_code = any(f.path.startswith("code/") for f in files)
    return build_launch(
        role.entrypoint,
        list(role.args),
        args_are_quoted=role.entrypoint in _QUOTING_ENTRYPOINTS,
        distributed=executor.nodes * executor.nprocs_per_node > 1,
        workspace=workspace,
        # Nothing shipped means no workspace volume: stay in the image's working directory.
        workdir=(f"{workspace}/code" if has_code else workspace) if code else None,
        pythonpath=[f"{workspace}/code"] if has_code else [],
        prologue=code.prologue if code else "",
        exports=_launch_exports(facts, role),
        rendezvous_id=name,
        worker_preload=executor.worker_preload,
        rendezvous_poll_seconds=executor.rendezvous_poll_seconds,
    )


def _launch_exports(facts: ExecutorFacts, role: Role) -> dict[str, str]:
    """Variables the launch script exports before the entrypoint (shell words, already quoted)."""
    executor = facts.executor
    exports = {}
    if facts.fabric.library_path:
        # Extended, not replaced, so that the image's own LD_LIBRARY_PATH survives.
        exports["LD_LIBRARY_PATH"] = shlex.quote(facts.fabric.library_path) + '"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"'
    if executor.timeout_defaults and executor.nodes * executor.nprocs_per_node > 1:
        # In the script, not in spec.trainer.env: a value from the image or an envFrom Secret still wins.
        task_env = [*executor.env_vars, *role.env, *executor.secret_env_vars, *executor.secret_key_refs]
        exports.update(mf.timeout_exports(task_env))
    return exports


def _plain_env(executor: KubeflowExecutor, role: Role) -> dict[str, str]:
    """The task's literal environment variables."""
    # NeMo-Run folds env_vars into role.env already; merging again keeps a role built any
    # other way honest, and role.env wins because it carries Script.env overrides.
    plain_env = {**executor.env_vars, **role.env}
    if "LOGLEVEL" not in executor.env_vars and role.env.get("LOGLEVEL", "INFO") == "INFO":
        plain_env["LOGLEVEL"] = DEFAULT_LOGLEVEL
    return plain_env


def _runtime_patch(
    facts: ExecutorFacts, code: Optional[CodePackage], name: str, plain_env: dict[str, str], *, existing_runtime: bool
) -> Optional[dict]:
    """The TrainJob's ``runtimePatches`` entry: the code volumes, the placement, the preflight's variables."""
    return mf.runtime_patch(
        code.volumes if code else [],
        code.volume_mounts if code else [],
        _placement_affinity(facts.executor, name),
        _preflight_env(facts.executor, plain_env),
        # An admin's runtime: the pod settings go into the patch (config/landing.py says which).
        **(existing_runtime_pod(facts) if existing_runtime else {}),
    )


def _placement_affinity(executor: KubeflowExecutor, name: str) -> Optional[dict]:
    """The affinity of the job's node pods, when it has several: one pod per node, one topology domain."""
    if executor.nodes <= 1:
        return None
    return mf.merge_affinity(
        mf.one_pod_per_node_affinity(name) if executor.spreads_pods() else None,
        mf.same_domain_affinity(name, executor.topology_key) if executor.topology_key else None,
    )


def _preflight_env(executor: KubeflowExecutor, plain_env: dict[str, str]) -> list[dict]:
    """The task's variables the preflight checks read (none without preflight)."""
    if not executor.preflight:
        return []
    return [literal_env(k, v) for k, v in plain_env.items() if k.startswith(_PREFLIGHT_ENV_PREFIXES)]


def _summary(
    facts: ExecutorFacts, trainjob: dict, runtime: str, code: Optional[CodePackage], launch: LaunchSpec
) -> dict[str, Any]:
    """What a dry run and the submission log say about the task, one line per setting that is in use."""
    executor = facts.executor
    gpus = f", {executor.gpus_per_node} GPU(s) per node" if executor.gpus_per_node else ", CPU only"
    summary = {
        "trainjob": trainjob["metadata"]["name"],
        "namespace": executor.namespace,
        "runtime": runtime,
        "size": f"{executor.nodes} node(s) x {executor.nprocs_per_node} process(es){gpus}",
        "image": executor.container_image,
        "package": describe_package(code) if code else "nothing to ship",
        "command": launch.command_line,
    }
    summary.update({key: line for key, line in _optional_summary(facts, trainjob).items() if line is not None})
    return summary


def _optional_summary(facts: ExecutorFacts, trainjob: dict) -> dict[str, Optional[str]]:
    """The summary's lines of the settings that may be off (``None`` when off)."""
    executor = facts.executor
    return {
        "network_fabric": facts.fabric.name if facts.fabric.name != "none" else None,
        "initializers": (
            ", ".join(st.name for st in facts.initializer_steps) if executor.initializer is not None else None
        ),
        "queue": _queue_summary(executor, queue_name(trainjob)),
        "gang scheduling": executor.pod_group_policy if executor.pod_group_policy != "none" else None,
        "placement": f"all nodes in one {executor.topology_key} domain" if executor.topology_key else None,
        "preflight": _preflight_summary(executor.preflight),
    }


def _queue_summary(executor: KubeflowExecutor, queue: Optional[str]) -> Optional[str]:
    if not queue:
        return None
    priority = executor.workload_priority_class
    return f"Kueue LocalQueue {queue}" + (f", priority {priority}" if priority else "")


def _preflight_summary(preflight: object) -> Optional[str]:
    if not preflight:
        return None
    return "the packaged checks" if preflight is True else "your command"


def planned_jobs(facts: ExecutorFacts, runtime: Optional[dict]) -> list[naming.ReplicatedJobShape]:
    """The replicated jobs of the JobSet Trainer will build: those of the rendered runtime; with an
    existing runtime (``runtime_name``, not readable offline), the initializers this executor asks for and
    the trainer's ``node`` job. submit.py checks an existing runtime's own jobs before writing anything."""
    if runtime is not None:
        return naming.runtime_job_shapes(runtime, facts.executor.nodes)
    return [naming.ReplicatedJobShape(step.name) for step in facts.initializer_steps] + [
        naming.ReplicatedJobShape(TRAINER_NODE, completions=facts.executor.nodes)
    ]


def _name_budget(facts: ExecutorFacts, runtime: Optional[dict]) -> int:
    """How long the TrainJob name may be so that JobSet accepts every pod name (naming.py has the rule)."""
    jobs = planned_jobs(facts, runtime)
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


def _claims_to_create(facts: ExecutorFacts) -> list[dict]:
    """PVCs marked for creation: ``pvc_mounts`` with ``create``, the initializers' claim."""
    executor = facts.executor
    labels = {mf.MANAGED_BY_LABEL: mf.MANAGED_BY_VALUE}
    pvcs = [
        mf.pvc_manifest(
            p.claim_name,
            executor.namespace,
            labels,
            size=p.size,
            access_modes=p.access_modes,
            storage_class=p.storage_class,
        )
        for p in executor.pvc_mounts
        if p.create
    ]
    if claim := _initializer_claim(facts, labels, created={p["metadata"]["name"] for p in pvcs}):
        pvcs.append(claim)
    return pvcs


def _initializer_claim(facts: ExecutorFacts, labels: dict, created: set[str]) -> Optional[dict]:
    """The initializers' claim to create (``create_claim``), unless a ``pvc_mounts`` entry creates it (``created``)."""
    s = facts.initializer_settings
    if facts.executor.initializer is None or not s.create_claim or s.claim_name in created:
        return None
    return mf.pvc_manifest(
        s.claim_name,
        facts.executor.namespace,
        labels,
        size=s.claim_size,
        access_modes=s.access_modes,
        storage_class=s.storage_class,
    )


# --- the task -------------------------------------------------------------------------------


def _script_arg(role: Role) -> Optional[tuple[int, str]]:
    """(index in role.args, path) of the script file a ``Script(path=...)`` task runs, if any."""
    if role.entrypoint in _QUOTING_ENTRYPOINTS:
        return _launched_script_arg(list(role.args))
    if role.entrypoint in ("python", "python3", "bash", "sh"):
        return _interpreted_script_arg(list(role.args))
    return None


def _launched_script_arg(args: list[str]) -> Optional[tuple[int, str]]:
    """(index, path) of the script torchrun or ft_launcher runs (quoted with its arguments), if any (not a module)."""
    kept, rest = split_torchrun_args(args)
    if "-m" in kept or "--module" in kept or not rest:
        return None
    token = shlex.split(rest[0])[0] if rest[0] else ""
    # rest is the tail of args, so its first item is in args.
    return (args.index(rest[0]), token) if token else None


def _interpreted_script_arg(args: list[str]) -> Optional[tuple[int, str]]:
    """(0, path) of the script python or bash runs, if its first argument is one (not an option)."""
    if not args or not args[0] or args[0].startswith("-"):
        return None
    return 0, args[0]


def _script_file(role: Role) -> Optional[tuple[int, str]]:
    """(index in role.args, local path) of the script a Script(path=...) task runs, if it
    is a file on this machine that the pod would not otherwise have."""
    found = _script_arg(role)
    if found is None or found[1].startswith("/nemo_run/") or not os.path.isfile(found[1]):
        return None
    return found


def task_problems(
    app: AppDef, role: Role, files: list[BundleFile], experiment_id: Optional[str], local_script: bool = True
) -> list[str]:
    """What is wrong with the task itself (its name, its script), found before anything is sent.
    ``local_script``: a relative script path must name a file here (NeMo-Run's ``Script(path=...)``)."""
    problems = _task_name_problems(role.name or app.name, experiment_id)
    if problem := type_problem(dict(role.env), dict[str, str], "the task's env"):
        problems.append(problem)
    if local_script and (problem := _missing_script_problem(role, files)):
        problems.append(problem)
    return problems


def _task_name_problems(task_name: Optional[str], experiment_id: Optional[str]) -> list[str]:
    """The task's name and the experiment's id with a '/', which NeMo-Run cannot make a directory of."""
    names = {"task name": task_name, "experiment id": experiment_id}
    return [
        f"{what} {name!r}: must not contain '/': NeMo-Run makes it a directory name (the job's "
        f"files and `nemo experiment` commands would not find it); use e.g. {name.replace('/', '-')!r}"
        for what, name in names.items()
        if name and "/" in name
    ]


def _missing_script_problem(role: Role, files: list[BundleFile]) -> Optional[str]:
    """Why the relative script path of a ``Script(path=...)`` task names no file here (and none shipped), or None."""
    found = _script_arg(role)
    if found is None:
        return None
    path = found[1]
    if os.path.isabs(path) or any(f.path == f"code/{path}" for f in files) or os.path.isfile(path):
        return None
    return (
        f"run.Script path {path!r}: no such file in {os.getcwd()}; the pod runs the copy shipped from "
        "this machine. Fix the path (it is relative to the current directory), or give the absolute "
        "path of a file that is only in the image"
    )


def ship_script(role: Role, files: list[BundleFile], workspace: str) -> Role:
    """Add the local script a ``Script(path=...)`` task runs to ``files`` and point the role at its pod path."""
    found = _script_file(role)
    if found is None:
        return role
    index, local = found
    rel = os.path.relpath(os.path.abspath(local))
    pod_rel = os.path.basename(local) if rel.startswith("..") else rel.replace(os.sep, "/")
    if not any(f.path == f"code/{pod_rel}" for f in files):
        files.append(_script_bundle_file(local, f"code/{pod_rel}"))
    args = list(role.args)
    pod_path = f"{workspace.rstrip('/')}/code/{pod_rel}"
    args[index] = shlex.quote(pod_path) if role.entrypoint in _QUOTING_ENTRYPOINTS else pod_path
    role.args = args
    return role


def _script_bundle_file(local: str, path: str) -> BundleFile:
    """The local script ``local`` as the bundle's file ``path``, executable when it is here."""
    try:
        with open(local, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise PackagingError(f"cannot read the task's script {local!r}: {e.strerror}") from None
    return BundleFile(path=path, data=data, mode=0o755 if os.access(local, os.X_OK) else 0o644)


def build_for_app(app: AppDef, executor: KubeflowExecutor, *, local_script: bool = True) -> Submission:
    """Everything a task would send, checked offline: the build half of a dry run.
    ``local_script``: see ``task_problems``."""
    from nemo_kubeflow.schema.validation import check_manifests

    executor.validate()
    role = app.roles[0]
    files = list(executor.packager.collect(job_dir=executor.job_dir)) if executor.job_dir else []
    _check_task(app, executor, files, local_script)
    role = ship_script(_with_macros(role, executor.macro_values()), files, executor.workspace_mount_path)
    submission = build_submission(executor, role, files, task_name=role.name or app.name)
    check_manifests(submission.manifests())
    return submission


def _check_task(app: AppDef, executor: KubeflowExecutor, files: list[BundleFile], local_script: bool) -> None:
    """Raise ``ConfigError`` listing what is wrong with the task itself: ``task_problems``, and a task whose
    workers ``worker_preload`` cannot start."""
    role = app.roles[0]
    problems = task_problems(app, role, files, executor.experiment_id, local_script)
    if executor.worker_preload and (problem := warm_start_problem(role.entrypoint, role.args)):
        problems.append(problem)
    if problems:
        raise ConfigError("the task cannot run:\n" + "\n".join(f"  - {p}" for p in problems))


def _with_macros(role: Role, macros: Optional[ExecutorMacros]) -> Role:
    """A copy of ``role`` with NeMo-Run's named placeholders (``macros``) replaced; the task's text, `$$`
    included, stays as written (``role`` itself without macros)."""
    if not macros:
        return role
    values = {k: v for k, v in dataclasses.asdict(macros).items() if isinstance(v, str)}
    role = copy.deepcopy(role)
    role.args = [substitute_macros(arg, values) for arg in role.args]
    role.env = {key: substitute_macros(value, values) for key, value in role.env.items()}
    return role
