"""Where each ``KubeflowExecutor`` field lands, declared once.

Every field of the executor (NeMo-Run's inherited ones included) has a ``Landing``: the object and
manifest path its value reaches with a rendered runtime, and with ``runtime_name`` (an admin's
runtime, which nemo_kubeflow neither renders nor changes). What depends on it is derived from it:

* ``KubeflowExecutor.validate()`` refuses, with ``runtime_name``, every field set away from its default
  that lands only in a rendered runtime and that a TrainJob's ``spec.runtimePatches`` cannot carry
  (``refusal``), and checks integer ranges (``int_range``: the schema's int32/int64 format and the
  field's own minimum) and quantities (``quantity``);
* docs/executor.md's "lands in" column (tools/docgen.py);
* test/test_settings_land.py, which sets every field to its ``example`` in both modes and finds the
  value at its declared path, or the field named in ``validate()``'s refusal. A field without a
  ``Landing`` fails that test.

Paths are dotted, from the object's root; ``[node]`` picks the list item named ``node``, ``[0]`` an index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from nemo_kubeflow.constants import INT_FORMAT_RANGES, JOBSET_TTL_MAX
from nemo_kubeflow.parts.fabrics import EFAConfig, GKERDMAConfig, InfiniBandConfig, TCPXOConfig
from nemo_kubeflow.parts.initializers import InitializerSettings

#: The kinds of place a value lands in.
TRAINJOB = "trainjob"  # the TrainJob (metadata, spec.trainer, spec.*): honoured with any runtime
RUNTIME = "runtime"  # the rendered runtime only
RUNTIME_PATCH = "runtime_patch"  # the TrainJob's spec.runtimePatches entry (pod changes, per job)
SCRIPT = "script"  # the launch script (spec.trainer.command/args)
CLIENT = "client"  # the submitting machine (cluster access, log following, NeMo-Run's packaging)
#: With ``runtime_name``: not carried, refused when set.
REFUSED = "refused"

#: The ``node`` pod template of a rendered runtime, and of our runtime patch (same shape, per job).
RUNTIME_POD = "spec.template.spec.replicatedJobs[node].template.spec.template"
PATCH_POD = "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[node].template.spec.template"
_INT32 = INT_FORMAT_RANGES["int32"][1]
_INT64 = INT_FORMAT_RANGES["int64"][1]


@dataclass(frozen=True)
class Landing:
    #: Where the value goes with a rendered runtime (TRAINJOB, RUNTIME, RUNTIME_PATCH, SCRIPT, CLIENT).
    rendered: str
    #: Its path in that object (the TrainJob for all but RUNTIME); for CLIENT, what uses it.
    path: str
    #: Where it goes with ``runtime_name``: a kind above, or REFUSED.
    existing: str
    #: Its path there, when not ``path``.
    existing_path: str = ""
    #: REFUSED: why a runtime patch cannot carry it.
    why: str = ""
    #: Integers: the allowed range, (minimum, the schema format's maximum or the field's own).
    int_range: Optional[tuple[int, int]] = None
    #: Integers: the range message says "whole number of seconds".
    seconds: bool = False
    #: Integers: the maximum is the field's own (said in every message), not only the format's.
    own_maximum: bool = False
    #: Appended to a range message: the fix in the field's terms.
    hint: str = ""
    #: A Kubernetes quantity (a number is as good as a string).
    quantity: bool = False
    #: A value other than the default that must land (a callable for objects built at use).
    example: Any = None
    #: Other settings ``example`` needs to take effect (``gpu_resource_name`` needs GPUs).
    example_with: Mapping[str, Any] = field(default_factory=dict)

    def example_value(self) -> Any:
        return self.example() if callable(self.example) else self.example

    def example_settings(self) -> dict[str, Any]:
        return {k: v() if callable(v) else v for k, v in self.example_with.items()}

    def where(self, with_runtime_name: bool) -> str:
        """``kind: path`` for docs and messages."""
        kind = self.existing if with_runtime_name else self.rendered
        if kind == REFUSED:
            return "refused"
        path = (self.existing_path or self.path) if with_runtime_name else self.path
        return f"{kind}: {path}" if path else kind

    def refusal(self, name: str, runtime_name: str) -> str:
        return (
            f"{name} goes into the rendered runtime ({self.path}), but runtime_name={runtime_name!r} uses an "
            f"existing one, and a TrainJob's runtimePatches cannot carry it ({self.why}); set it in that "
            f"runtime and leave {name} at its default, or leave runtime_name unset"
        )

    def range_problem(self, name: str, value: Any) -> Optional[str]:
        """Why integer ``value`` is out of ``int_range``, or None (types are checked elsewhere)."""
        if self.int_range is None or not isinstance(value, int) or isinstance(value, bool):
            return None
        low, high = self.int_range
        if low <= value <= high:
            return None
        what = "a whole number of seconds" if self.seconds else "an integer"
        if self.own_maximum:
            bound = f"from {low} to {high}"
        elif value > high:
            bound = f"at most {high} (Kubernetes stores it as an {'int32' if high == _INT32 else 'int64'})"
        else:
            bound = f">= {low}"
        return f"{name}={value!r}: must be {what} {bound}{self.hint}"


def _same(kind: str, path: str, **kw: Any) -> Landing:
    """A field that lands in the same place in both modes."""
    return Landing(kind, path, kind, **kw)


def _pod(path: str, **kw: Any) -> Landing:
    """A pod setting: in the rendered runtime's node pod, else carried by the runtime patch."""
    return Landing(RUNTIME, f"{RUNTIME_POD}.{path}", RUNTIME_PATCH, f"{PATCH_POD}.{path}", **kw)


def _runtime_only(path: str, why: str, **kw: Any) -> Landing:
    return Landing(RUNTIME, path, REFUSED, why=why, **kw)


def _fabric(example: Any, profile: Optional[str] = None) -> Landing:
    """A network fabric setting: the profile's sidecars, devices and env on ``node``; on 8-GPU nodes."""
    settings: dict[str, Any] = {"gpus_per_node": 8, "nprocs_per_node": 8}
    if profile:
        settings["network_fabric"] = profile
    return _runtime_only(RUNTIME_POD, _FABRIC_WHY, example=example, example_with=settings)


def _pvc() -> list:
    from nemo_kubeflow.config.executor import PVCMount

    return [PVCMount(claim_name="data", mount_path="/data")]


def _secret_mount() -> list:
    from nemo_kubeflow.config.executor import SecretMount

    return [SecretMount(secret_name="creds", mount_path="/creds")]


def _packager() -> Any:
    from nemo_kubeflow.config.packager import ConfigMapPackager

    return ConfigMapPackager(max_shards=4)


def _settings(cls: type, **values: Any) -> Callable[[], Any]:
    """A settings object built at use (a new one each time)."""

    def build() -> Any:
        return cls(**values)

    return build


def _own_template() -> str:
    """A runtime template of one's own: the packaged one with a label of its own, in a new folder."""
    import tempfile
    from pathlib import Path

    from nemo_kubeflow.parts.templates import DEFAULT_TEMPLATE, templates_dir

    text = (templates_dir() / DEFAULT_TEMPLATE).read_text()
    path = Path(tempfile.mkdtemp(prefix="nemo-kubeflow-example-")) / "runtime.yaml.j2"
    path.write_text(
        text.replace(
            "trainer.kubeflow.org/framework: torch",
            'trainer.kubeflow.org/framework: torch\n    example.com/own-template: "yes"',
            1,
        )
    )
    return str(path)


def _initializer() -> Any:
    from kubeflow.trainer import HuggingFaceDatasetInitializer, Initializer

    return Initializer(dataset=HuggingFaceDatasetInitializer(storage_uri="hf://org/data"))


_TRAINER = "spec.trainer"
_NCCL = {"NCCL_DEBUG": "INFO"}
_RESOURCES = "spec.trainer.resourcesPerNode"
_NOT_IN_PATCH = "a runtime patch's pod spec has no such field"
_FABRIC_WHY = "the profile adds sidecars, devices and env to node, which a patch cannot add"

#: Field name -> where it lands. Inherited NeMo-Run fields first, then the executor's own, in order.
LANDINGS: dict[str, Landing] = {
    # --- NeMo-Run's Executor --------------------------------------------------------------
    "packager": _same(CLIENT, "collects the task's files (shipped as ConfigMaps)", example=_packager),
    "launcher": _same(SCRIPT, _TRAINER, example="torchrun"),
    "env_vars": _same(TRAINJOB, f"{_TRAINER}.env", example={"EXAMPLE": "1"}),
    "retries": _runtime_only(
        "spec.template.spec.failurePolicy.maxRestarts",
        "JobSet's failurePolicy is outside the pod template",
        int_range=(0, _INT32),
        example=2,
    ),
    "experiment_id": _same(CLIENT, "NeMo-Run's experiment: names and labels", example="exp-1"),
    "job_dir": _same(CLIENT, "NeMo-Run's task folder: where the task's files are read", example="/tmp/job"),
    # --- size and image -------------------------------------------------------------------
    "nodes": _same(TRAINJOB, f"{_TRAINER}.numNodes", int_range=(1, _INT32), example=2),
    "nprocs_per_node": _same(TRAINJOB, f"{_TRAINER}.numProcPerNode", int_range=(1, _INT32), example=2),
    "gpus_per_node": _same(TRAINJOB, _RESOURCES, int_range=(0, _INT64), example=1),
    "gpu_resource_name": _same(TRAINJOB, _RESOURCES, example="amd.com/gpu", example_with={"gpus_per_node": 1}),
    "container_image": _same(TRAINJOB, f"{_TRAINER}.image", example="registry.example.com/train:2"),
    "namespace": _same(TRAINJOB, "metadata.namespace", example="team-a"),
    # --- resources ---------------------------------------------------------------------------
    "cpu_request": _same(TRAINJOB, f"{_RESOURCES}.requests.cpu", quantity=True, example="2"),
    "cpu_limit": _same(TRAINJOB, f"{_RESOURCES}.limits.cpu", quantity=True, example="4"),
    "memory_request": _same(TRAINJOB, f"{_RESOURCES}.requests.memory", quantity=True, example="1Gi"),
    "memory_limit": _same(TRAINJOB, f"{_RESOURCES}.limits.memory", quantity=True, example="2Gi"),
    "extra_resources": _same(TRAINJOB, f"{_RESOURCES}.limits", quantity=True, example={"example.com/dev": "1"}),
    # --- environment and secrets ------------------------------------------------------------------
    "secret_env_vars": _same(TRAINJOB, f"{_TRAINER}.env", example={"TOKEN": "env:EXAMPLE_TOKEN"}),
    "secret_env_from": _runtime_only(
        f"{RUNTIME_POD}.spec.containers[node].envFrom",
        "a patch's containers take no envFrom; use secret_key_refs",
        example=["team-env"],
    ),
    "secret_key_refs": _same(TRAINJOB, f"{_TRAINER}.env", example={"KEY": "creds/key"}),
    "secret_mounts": _pod("spec.volumes", example=_secret_mount),
    # --- storage ---------------------------------------------------------------------------------
    "pvc_mounts": _pod("spec.volumes", example=_pvc),
    "shm_size": _pod("spec.volumes", quantity=True, example="1Gi"),
    "workspace_mount_path": _same(
        RUNTIME_PATCH, f"{PATCH_POD}.spec.containers[node].volumeMounts", example="/workspace-files"
    ),
    # --- placement and pod settings ----------------------------------------------------------------
    "tolerations": _pod(
        "spec.tolerations", example=[{"key": "example.com/pool", "operator": "Exists", "effect": "NoSchedule"}]
    ),
    "node_selector": _pod("spec.nodeSelector", example={"example.com/pool": "a"}),
    "one_pod_per_node": _same(RUNTIME_PATCH, f"{PATCH_POD}.spec.affinity", example=True, example_with={"nodes": 2}),
    "image_pull_secrets": _pod("spec.imagePullSecrets", example=["pull"]),
    "service_account": _pod("spec.serviceAccountName", example="trainer"),
    "labels": _same(TRAINJOB, "metadata.labels", example={"team": "a"}),
    "annotations": _same(TRAINJOB, "metadata.annotations", example={"example.com/note": "x"}),
    "pod_labels": _pod("metadata.labels", example={"team": "a"}),
    "pod_annotations": _pod("metadata.annotations", example={"example.com/note": "x"}),
    "active_deadline_seconds": _same(TRAINJOB, "spec.activeDeadlineSeconds", int_range=(1, _INT64), example=3600),
    "restricted_security": _pod("spec.securityContext", example=True, example_with={"run_as_user": 1000}),
    "run_as_user": _pod("spec.securityContext", int_range=(0, _INT64), hint=" (a UID)", example=1000),
    "fs_group": _pod("spec.securityContext", int_range=(0, _INT64), hint=" (a GID)", example=1000),
    # --- queueing and gang scheduling -----------------------------------------------------------------
    "queue_name": _same(TRAINJOB, "metadata.labels", example="team-queue"),
    "workload_priority_class": _same(
        TRAINJOB, "metadata.labels", example="high", example_with={"queue_name": "team-queue"}
    ),
    "pod_group_policy": _runtime_only(
        "spec.podGroupPolicy", "it is the runtime's, beside the pod template", example="coscheduling"
    ),
    "schedule_timeout_seconds": _runtime_only(
        "spec.podGroupPolicy.coscheduling.scheduleTimeoutSeconds",
        "it is the runtime's, beside the pod template",
        int_range=(1, _INT32),
        example=120,
        example_with={"pod_group_policy": "coscheduling"},
    ),
    "scheduler_name": _runtime_only(f"{RUNTIME_POD}.spec.schedulerName", _NOT_IN_PATCH, example="volcano"),
    "priority_class_name": _runtime_only(f"{RUNTIME_POD}.spec.priorityClassName", _NOT_IN_PATCH, example="high"),
    "topology_key": _same(
        RUNTIME_PATCH, f"{PATCH_POD}.spec.affinity", example="example.com/block", example_with={"nodes": 2}
    ),
    # --- no silent hangs ------------------------------------------------------------------------
    "timeout_defaults": _same(SCRIPT, _TRAINER, example=False, example_with={"nodes": 2}),
    # --- network fabric ---------------------------------------------------------------------------
    "network_fabric": _fabric("aws-efa"),
    "enable_tcpxo": _fabric(True),
    "tcpxo": _fabric(_settings(TCPXOConfig, nccl_env=_NCCL), "gke-tcpxo"),
    "gke_rdma": _fabric(_settings(GKERDMAConfig, nccl_env=_NCCL), "gke-rdma"),
    "aws_efa": _fabric(_settings(EFAConfig, nccl_env=_NCCL), "aws-efa"),
    "infiniband": _fabric(_settings(InfiniBandConfig, nccl_env=_NCCL), "infiniband"),
    # --- before training -------------------------------------------------------------------------
    "initializer": _runtime_only(
        "spec.template.spec.replicatedJobs",
        "the initializer jobs and their claim are replicated jobs of the runtime",
        example=_initializer,
        example_with={"initializer_settings": _settings(InitializerSettings, claim_name="data")},
    ),
    "initializer_settings": _runtime_only(
        "spec.template.spec.replicatedJobs",
        "the initializer jobs and their claim are replicated jobs of the runtime",
        example=_settings(InitializerSettings, claim_name="data"),
        example_with={"initializer": _initializer},
    ),
    "preflight": _runtime_only(
        f"{RUNTIME_POD}.spec.initContainers", "a patch cannot add the preflight init container", example=True
    ),
    # --- training runtime ---------------------------------------------------------------------------
    "runtime_name": _same(TRAINJOB, "spec.runtimeRef.name", example="team-runtime"),
    "runtime_kind": _same(TRAINJOB, "spec.runtimeRef.kind", example="TrainingRuntime"),
    "runtime_template": _runtime_only(
        "metadata.labels", "it is the template of the runtime nemo_kubeflow renders", example=_own_template
    ),
    # --- after the job finishes ---------------------------------------------------------------------
    # Never a JobSet TTL (Trainer v2.3.0 reruns a failed job whose JobSet is deleted): an annotation that
    # `nemo-kubeflow gc --expired` acts on, in both modes.
    "ttl_seconds_after_finished": _same(
        TRAINJOB,
        "metadata.annotations",
        int_range=(0, JOBSET_TTL_MAX),
        seconds=True,
        own_maximum=True,
        hint=", e.g. 86400 for a day (nemo-kubeflow gc --expired deletes the TrainJob after it); None keeps "
        "finished jobs",
        example=600,
    ),
    # --- failures, restarts and preemption ----------------------------------------------------------
    "fail_fast_exit_codes": _runtime_only(
        "spec.template.spec.replicatedJobs[node].template.spec.podFailurePolicy",
        "the Job's podFailurePolicy is outside the pod template",
        example=[1, 3],
    ),
    "restart_on_oom_kill": _runtime_only(
        "spec.template.spec.replicatedJobs[node].template.spec.podFailurePolicy",
        "the Job's podFailurePolicy is outside the pod template",
        example=True,
    ),
    "avoid_failed_nodes": _same(TRAINJOB, "metadata.annotations", example=False),
    "termination_grace_period_seconds": _pod(
        "spec.terminationGracePeriodSeconds",
        int_range=(0, _INT64),
        seconds=True,
        hint=" (terminationGracePeriodSeconds), e.g. 300 to checkpoint on SIGTERM; None keeps 30",
        example=300,
    ),
    "worker_preload": _same(SCRIPT, _TRAINER, example=["json"], example_with={"launcher": "ft"}),
    "rendezvous_poll_seconds": _same(SCRIPT, _TRAINER, example=0.1, example_with={"launcher": "ft"}),
    "stall_warning_seconds": _same(
        CLIENT,
        "the stall warning of status, watch, an attached wait and log following",
        int_range=(1, _INT64),
        seconds=True,
        hint=", e.g. 900 (15 minutes); None turns the warning off",
        example=60,
    ),
    # --- cluster access ---------------------------------------------------------------------------
    "submit_timeout_seconds": _same(
        CLIENT,
        "the submission's total deadline",
        int_range=(1, 3600),
        seconds=True,
        own_maximum=True,
        hint=", e.g. 60",
        example=30,
    ),
    "kubeconfig": _same(CLIENT, "cluster access", example="/tmp/kubeconfig"),
    "kube_context": _same(CLIENT, "cluster access", example="other"),
}


def landing(name: str) -> Optional[Landing]:
    return LANDINGS.get(name)
