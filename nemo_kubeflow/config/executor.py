"""`KubeflowExecutor`: the NeMo-Run executor configuration for Kubeflow Trainer v2.

This module is configuration only. Building an executor (which NeMo-Run does on
every ``clone()`` and every deserialisation) does no I/O: no kubeconfig is read and
no cluster is contacted until something is actually submitted. ``validate()`` is a
pure check that the scheduler calls before anything is built.

No ``from __future__ import annotations`` here: NeMo-Run's CLI reads the field
annotations at run time to parse ``run.executor.<field>=`` overrides, and it understands
neither string annotations nor ``X | Y`` unions (hence ``Optional``/``Union``).

Importing this module registers the executor with NeMo-Run (see ``registration``),
so ``run.Experiment.from_id`` and ``nemo experiment ...`` find it again after fiddle
re-imports the class.
"""

import copy
import dataclasses
import difflib
import functools
import os
import re
import typing
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Union

from nemo_run.core.execution.base import Executor, ExecutorMacros
from nemo_run.core.packaging.base import Packager

from nemo_kubeflow.config.landing import LANDINGS, REFUSED, Landing
from nemo_kubeflow.constants import (
    ANNOTATIONS_MAX_BYTES,
    CLUSTER_RUNTIME_KIND,
    NEMO_RUN_POD_DIR,
    OOM_KILLED_EXIT_CODE,
    PET_MASTER_ADDR,
    PET_NNODES,
    PET_NODE_RANK,
    PET_NPROC_PER_NODE,
    POD_GROUP_POLICIES,
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    RESERVED_KEY_PREFIX,
    RESERVED_KEYS,
    RUNTIME_KIND,
    STANDARD_RESOURCES,
    TAINT_EFFECTS,
    TOLERATION_FIELDS,
    TOLERATION_OPERATORS,
)
from nemo_kubeflow.errors import ConfigError
from nemo_kubeflow.parts import naming
from nemo_kubeflow.parts.fabrics import (
    PROFILES,
    EFAConfig,
    GKERDMAConfig,
    InfiniBandConfig,
    TCPXOConfig,
    fabric_name,
    fabric_problems,
    profile_settings,
)
from nemo_kubeflow.parts.initializers import InitializerSettings, initializer_problems, refused_access_modes
from nemo_kubeflow.quantity import parse_quantity

if TYPE_CHECKING:
    # Not imported at run time: the Kubeflow SDK is heavy and only needed with an initializer.
    # NeMo-Run's CLI resolves this forward reference through this TYPE_CHECKING block.
    from kubeflow.trainer import Initializer


@dataclass(kw_only=True)
class PVCMount:
    """A PersistentVolumeClaim mounted into every training pod."""

    #: Name of the claim (``persistentVolumeClaim.claimName``).
    claim_name: str
    #: Where the volume appears in the container (``volumeMounts[].mountPath``).
    mount_path: str
    #: Mount read-only (``volumeMounts[].readOnly``).
    read_only: bool = False
    #: Mount only this sub-directory of the volume (``volumeMounts[].subPath``).
    sub_path: Optional[str] = None
    #: Create the claim if it does not exist (it is never deleted by NeMo-Run: it holds data).
    create: bool = False
    #: Requested size when creating, e.g. ``"100Gi"`` (``spec.resources.requests.storage``).
    size: Optional[str] = None
    #: StorageClass when creating; ``None`` uses the cluster default.
    storage_class: Optional[str] = None
    #: Access modes when creating. Multi-node jobs need ``ReadWriteMany`` to share one claim.
    access_modes: list[str] = field(default_factory=lambda: ["ReadWriteMany"])


@dataclass(kw_only=True)
class SecretMount:
    """An existing Kubernetes Secret mounted as files into every training pod."""

    #: Name of the Secret, in the executor's namespace.
    secret_name: str
    #: Directory where the Secret's keys appear as files.
    mount_path: str
    #: Only these keys (each becomes a file of the same name); empty mounts every key.
    keys: list[str] = field(default_factory=list)
    #: File mode of the mounted files (``secret.defaultMode``), 0o400 = owner read-only.
    default_mode: int = 0o400


@dataclass(kw_only=True)
class KubeflowExecutor(Executor):
    """Runs NeMo-Run tasks as Kubeflow Trainer v2 TrainJobs.

    Each task becomes: ConfigMaps with its files, a training runtime rendered from
    ``templates/`` (shared by every task with the same settings), and a TrainJob whose
    trainer runs the task's command on ``nodes`` pods with ``nprocs_per_node``
    processes each. Example::

        executor = KubeflowExecutor(
            container_image="nvcr.io/nvidia/nemo:25.02",
            nodes=2, nprocs_per_node=8, gpus_per_node=8,
            namespace="training",
            pvc_mounts=[PVCMount(claim_name="checkpoints", mount_path="/ckpt")],
        )
    """

    # --- size and image ----------------------------------------------------
    #: Number of nodes (pods) of the job (``spec.trainer.numNodes``).
    nodes: int = 1
    #: Processes per node (``spec.trainer.numProcPerNode``, torchrun ``--nproc-per-node``).
    nprocs_per_node: int = 1
    #: GPUs per node, requested and limited as ``gpu_resource_name``. 0 for a CPU-only job.
    gpus_per_node: int = 0
    #: The extended resource name of a GPU.
    gpu_resource_name: str = "nvidia.com/gpu"
    #: Container image of the training pods (``spec.trainer.image``). Required.
    container_image: str = ""
    #: Kubernetes namespace of the TrainJob and everything created with it.
    namespace: str = "default"

    # --- resources (``resourcesPerNode`` of the TrainJob) --------------------
    #: CPU request per node, e.g. ``"8"`` or ``"500m"``.
    cpu_request: Optional[str] = None
    #: CPU limit per node.
    cpu_limit: Optional[str] = None
    #: Memory request per node, e.g. ``"64Gi"``.
    memory_request: Optional[str] = None
    #: Memory limit per node.
    memory_limit: Optional[str] = None
    #: Other extended resources per node, requested and limited alike, e.g. ``{"vpc.amazonaws.com/efa": "4"}``.
    extra_resources: dict[str, str] = field(default_factory=dict)

    # --- environment and secrets ------------------------------------------
    #: Secret environment variables: name -> where to read the value on the submitting
    #: machine, ``"env:LOCAL_VAR"`` or ``"file:/path"``. Values are read at submission,
    #: stored only in a Secret owned by the TrainJob, and never written anywhere else.
    #: Literal values are refused: NeMo-Run saves the executor to disk.
    secret_env_vars: dict[str, str] = field(default_factory=dict)
    #: Existing Secrets whose every key becomes an environment variable (``envFrom``).
    secret_env_from: list[str] = field(default_factory=list)
    #: Environment variables from keys of existing Secrets: name -> ``"secret-name/key"``.
    secret_key_refs: dict[str, str] = field(default_factory=dict)
    #: Existing Secrets mounted as files.
    secret_mounts: list[SecretMount] = field(default_factory=list)

    # --- storage -------------------------------------------------------------
    #: PersistentVolumeClaims mounted into every pod (existing, or created when ``create``).
    pvc_mounts: list[PVCMount] = field(default_factory=list)
    #: Size of the memory-backed ``/dev/shm`` (``emptyDir.sizeLimit``); ``None`` keeps the
    #: container runtime's 64 MiB default, which breaks NCCL and data loaders.
    shm_size: Optional[str] = "16Gi"
    #: Where the task's files (scripts, configs, code) appear in the pod.
    workspace_mount_path: str = NEMO_RUN_POD_DIR

    # --- placement and pod settings ---------------------------------------
    #: Tolerations of the training pods (Kubernetes toleration dicts).
    tolerations: list[dict] = field(default_factory=list)
    #: Node selector of the training pods.
    node_selector: dict[str, str] = field(default_factory=dict)
    #: Spread the job's pods one per Kubernetes node (required anti-affinity scoped to
    #: this job's own pods). ``None``: on when the job uses GPUs.
    one_pod_per_node: Optional[bool] = None
    #: Names of image pull Secrets.
    image_pull_secrets: list[str] = field(default_factory=list)
    #: Service account of the training pods.
    service_account: Optional[str] = None
    #: Labels of the TrainJob object.
    labels: dict[str, str] = field(default_factory=dict)
    #: Annotations of the TrainJob object.
    annotations: dict[str, str] = field(default_factory=dict)
    #: Labels of the training pods (TrainJob labels do not reach pods).
    pod_labels: dict[str, str] = field(default_factory=dict)
    #: Annotations of the training pods.
    pod_annotations: dict[str, str] = field(default_factory=dict)
    #: Fail the job after this many seconds (``spec.activeDeadlineSeconds``).
    active_deadline_seconds: Optional[int] = None
    #: Make the pods pass the Pod Security Standards "restricted" profile: non-root,
    #: no privilege escalation, all capabilities dropped, seccomp ``RuntimeDefault``.
    #: The image must run as a non-root user (see ``run_as_user``). Without it the pods
    #: still pass "baseline" (no host namespaces, host paths or added capabilities),
    #: unless ``network_fabric`` needs privileges (see docs/fabrics.md).
    restricted_security: bool = False
    #: UID the containers run as (``securityContext.runAsUser``); required by images
    #: whose default user is root when ``restricted_security`` is set.
    run_as_user: Optional[int] = None
    #: GID that owns mounted volumes (``securityContext.fsGroup``), so a non-root user can write PVCs.
    fs_group: Optional[int] = None

    # --- queueing and gang scheduling (docs/scheduling.md) --------------------------
    #: Kueue LocalQueue (in ``namespace``) that admits the job: the TrainJob gets the label
    #: ``kueue.x-k8s.io/queue-name``, stays suspended until Kueue admits it, and is not resumed by
    #: NeMo-Run. The queue is checked before anything is written. ``None``: no queue.
    queue_name: Optional[str] = None
    #: Kueue WorkloadPriorityClass of the job (label ``kueue.x-k8s.io/priority-class``); it orders
    #: the queue and decides preemption. Needs ``queue_name``.
    workload_priority_class: Optional[str] = None
    #: Gang scheduling, so that no pod starts before all of them can (the runtime's
    #: ``spec.podGroupPolicy``): ``"none"``, ``"coscheduling"`` (the scheduler-plugins
    #: Coscheduling plugin) or ``"volcano"``. Trainer then creates a PodGroup per TrainJob; the
    #: cluster must run that scheduler.
    pod_group_policy: str = "none"
    #: With ``pod_group_policy="coscheduling"``: how long the PodGroup may wait for all its pods
    #: to be schedulable (``scheduleTimeoutSeconds``); ``None`` keeps Trainer's default, 60.
    schedule_timeout_seconds: Optional[int] = None
    #: The scheduler of the pods (``schedulerName``). ``None``: ``"volcano"`` with the volcano
    #: policy, ``"scheduler-plugins-scheduler"`` with coscheduling (scheduler-plugins installed as
    #: a second scheduler), the cluster's default scheduler otherwise.
    scheduler_name: Optional[str] = None
    #: Kubernetes PriorityClass of the pods (``priorityClassName``): pod priority and preemption
    #: by the scheduler (not Kueue's order: see ``workload_priority_class``).
    priority_class_name: Optional[str] = None
    #: Keep all of the job's node pods in one topology domain: a node label such as
    #: ``"cloud.google.com/gce-topology-block"`` (required pod affinity among this job's own pods).
    #: Pods that do not fit in the first pod's domain stay pending (pair it with gang scheduling).
    topology_key: Optional[str] = None

    # --- no silent hangs --------------------------------------------------------------
    #: Timeouts for distributed jobs, so that a lost rank or a stuck collective ends the job instead
    #: of hanging it: the launch script exports ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``,
    #: ``TORCH_NCCL_ENABLE_MONITORING=1``, ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=600`` and torchrun's
    #: static rendezvous timeout ``PET_RDZV_CONF=timeout=1800``, each unless the task sets it
    #: (``env_vars``, ``Script.env``), the image or an ``envFrom`` Secret does (docs/scheduling.md).
    #: ``False`` exports none.
    timeout_defaults: bool = True

    # --- network fabric --------------------------------------------------------
    #: The GPU interconnect between nodes: ``"none"``, ``"gke-tcpxo"`` (GKE A3 Mega),
    #: ``"gke-rdma"`` (GKE A3 Ultra/A4, gIB), ``"aws-efa"`` or ``"infiniband"``. Each profile
    #: adds its NICs, devices, NCCL settings (and sidecar) to the pods; its parameters are in
    #: ``tcpxo``, ``gke_rdma``, ``aws_efa`` or ``infiniband``. All but aws-efa need a namespace
    #: that allows privileged pods (docs/fabrics.md).
    network_fabric: str = "none"
    #: The older spelling of ``network_fabric="gke-tcpxo"`` (GKE A3 Mega; needs privileged pods).
    enable_tcpxo: bool = False
    # The profile settings below default to None ("the profile's defaults") rather than to an
    # instance: NeMo-Run serialises the executor several times per task, and five nested default
    # configs doubled that cost.
    #: ``gke-tcpxo`` settings; ``None``: ``TCPXOConfig()``.
    tcpxo: Optional[TCPXOConfig] = None
    #: ``gke-rdma`` settings; ``None``: ``GKERDMAConfig()``.
    gke_rdma: Optional[GKERDMAConfig] = None
    #: ``aws-efa`` settings; ``None``: ``EFAConfig()``.
    aws_efa: Optional[EFAConfig] = None
    #: ``infiniband`` settings; ``None``: ``InfiniBandConfig()``.
    infiniband: Optional[InfiniBandConfig] = None

    # --- before training ---------------------------------------------------------
    #: Dataset and model to download before training: the Kubeflow SDK's
    #: ``Initializer(dataset=..., model=...)``. Trainer runs them as the ``dataset-initializer``
    #: and ``model-initializer`` jobs, and ``node`` starts once they complete; training reads
    #: ``/workspace/dataset`` and ``/workspace/model`` (docs/initializers.md).
    initializer: Optional["Initializer"] = None
    #: How the initializers run: the claim they download into, images, commands, Secrets;
    #: ``None``: ``InitializerSettings()`` (which has no claim: set one to use ``initializer``).
    initializer_settings: Optional[InitializerSettings] = None
    #: Check every node pod before training, in a ``preflight`` init container that receives the
    #: PET_* variables: ``True`` runs the checks shipped with nemo_kubeflow (DNS of the master,
    #: GPUs, NCCL interfaces, writable claims), a string is a bash command of your own
    #: (docs/preflight.md). A failed check fails the pod, hence the job after ``retries``.
    preflight: Union[bool, str] = False

    # --- training runtime ---------------------------------------------------------
    #: Use this existing runtime instead of rendering one (nothing is rendered or created).
    runtime_name: Optional[str] = None
    #: ``ClusterTrainingRuntime`` (cluster-scoped, needs cluster RBAC) or
    #: ``TrainingRuntime`` (in ``namespace``; for users with namespace rights only).
    runtime_kind: str = CLUSTER_RUNTIME_KIND
    #: A Jinja template of your own to render the runtime from (same variables as
    #: ``templates/training_runtime.yaml.j2``).
    runtime_template: Optional[str] = None

    # --- after the job finishes (docs/reliability.md#finished-jobs) ----------------------------
    #: Seconds after the job finishes (succeeded or failed) from which ``nemo-kubeflow gc --expired``
    #: deletes its TrainJob, and with it its JobSet, pods (logs included), ConfigMaps and Secret; run
    #: it on a schedule (a CronJob: docs/reliability.md#finished-jobs). A TrainJob annotation, never
    #: a JobSet TTL: Trainer v2.3.0 and older run a failed job again, forever, once a JobSet TTL
    #: deletes its JobSet (trainer#3779). ``None`` keeps the job until you delete it.
    ttl_seconds_after_finished: Optional[int] = None

    # --- failures, restarts and preemption (docs/resilience.md) -------------------------------
    #: Exit codes of the ``node`` container that mean a user error: the job fails at once, with no
    #: gang restart used (the Job's ``podFailurePolicy`` FailJob rule and a JobSet ``failurePolicy``
    #: rule FailJobSet on ``PodFailurePolicy``). Default ``[1]``: Python's exit on an uncaught
    #: exception (and torchrun's when a rank raised). Any other failure, and any pod disrupted by
    #: eviction, preemption or a lost node (``DisruptionTarget``), restarts the gang up to ``retries``.
    #: Empty: every failure restarts. Needs a rendered runtime (not ``runtime_name``).
    fail_fast_exit_codes: list[int] = field(default_factory=lambda: [1])
    #: What a ``node`` container killed for memory (exit code 137, ``OOMKilled``) means. ``False``
    #: (default): a user error, like ``fail_fast_exit_codes``: the job fails at once (137 joins the
    #: FailJob rule). ``True``: an infrastructure fault that restarts the gang, up to ``retries``
    #: (say, memory that leaks over days, or a node whose other tenants squeeze it). The Job's
    #: ``podFailurePolicy`` sees only exit codes, so any other SIGKILL of the container's main
    #: process (137) is classed the same way; a pod disrupted by eviction, preemption or a lost node
    #: always restarts the gang. Needs a rendered runtime (not ``runtime_name``).
    restart_on_oom_kill: bool = False
    #: After a gang restart caused by a node fault (its pod deleted by the taint manager on a lost or
    #: NotReady node, evicted by the kubelet under node pressure), keep the job off that node: the
    #: repair step of a waiting run or of ``nemo-kubeflow watch`` (a status query only reports it)
    #: suspends the TrainJob, adds a ``NotIn`` node affinity through a runtime
    #: patch, has Trainer build the JobSet again, and resumes it. Never so many nodes that the job no
    #: longer fits; status says which nodes are avoided and why (docs/resilience.md#bad-nodes).
    avoid_failed_nodes: bool = True
    #: Seconds between SIGTERM and SIGKILL when a pod is stopped (Kueue preemption, eviction, cancel):
    #: the time training has to write a checkpoint (``terminationGracePeriodSeconds``). ``None``:
    #: Kubernetes' 30. With ``runtime_name``, carried by the job's runtime patch.
    termination_grace_period_seconds: Optional[int] = None
    #: In-job restarts (``launcher="ft"``) without starting Python again: each pod keeps a template
    #: process that has imported these modules (e.g. ``["torch"]``, or heavy modules of your own),
    #: and every worker ft_launcher starts, first and at each in-job restart, is a fork of it, so
    #: the modules are not imported again. The worker gets its own arguments, environment, directory
    #: and output, and ends as the plain Python would (exit code, signal). The modules are imported
    #: once, at pod start, with the pod's environment (not the per-worker ``RANK``, ``LOCAL_RANK``...):
    #: list none that reads such a variable, starts threads or initializes CUDA when imported.
    #: Python workers only; needs nvidia-resiliency-ext for the image's ``python3``. Empty: each
    #: worker is a new Python (docs/resilience.md#warm-worker-starts).
    worker_preload: list[str] = field(default_factory=list)
    #: Seconds between two looks of ft_launcher's agents at their rendezvous while they wait for each
    #: other (``launcher="ft"``: at start and at each in-job restart). ``None``: ft_launcher's 1 s,
    #: which adds 1 to 2 s to every in-job restart. Each look reads the rendezvous state from the
    #: store of node 0's agent, so the store serves ``nodes / rendezvous_poll_seconds`` reads a second
    #: while the agents wait; from 0.05 to 1. Written for nvidia-resiliency-ext 0.4
    #: (docs/resilience.md#warm-worker-starts).
    rendezvous_poll_seconds: Optional[float] = None
    #: Following the logs (``nemo experiment logs -f``), warn when a running node has printed nothing
    #: for this many seconds (a hung collective, a stuck data loader). ``None``: never warn.
    stall_warning_seconds: Optional[int] = 900

    # --- cluster access ---------------------------------------------------------------
    #: Path of the kubeconfig; ``None`` uses ``$KUBECONFIG`` or ``~/.kube/config``
    #: (or the in-cluster service account). Read only when submitting.
    kubeconfig: Optional[str] = None
    #: Context of the kubeconfig; ``None`` uses its current context.
    kube_context: Optional[str] = None
    #: Seconds one task's submission may take in all, every request and retry included. Past it (a
    #: stalled API server) what the submission had created is deleted again and it fails, saying that
    #: the API server stalled (docs/reliability.md#a-stalled-api-server).
    submit_timeout_seconds: int = 60

    def __post_init__(self) -> None:
        # Only normalisation: this runs on every clone and deserialisation, so no I/O.
        if self.packager is None or type(self.packager) is Packager:
            from nemo_kubeflow.config.packager import ConfigMapPackager

            self.packager: Packager = ConfigMapPackager()

    # --- NeMo-Run Executor API -------------------------------------------------
    def to_config(self):
        """This executor as a ``run.Config`` of the fields that differ from their defaults.

        NeMo-Run serialises it for every task (``<task>_executor.yaml``) and for the experiment;
        building it gives an equal executor. Only what was set: readable files, and less than
        half the cost of writing all ~60 fields.
        """
        from fiddle.experimental.dataclasses import convert_dataclasses_to_configs
        from nemo_run.config import Config

        values = {
            f.name: convert_dataclasses_to_configs(getattr(self, f.name), allow_post_init=True)
            for f in dataclasses.fields(self)
            if f.init and not _has_default_value(self, f)
        }
        return Config(type(self), **values)

    def assign(self, exp_id: str, exp_dir: str, task_id: str, task_dir: str) -> None:
        self.experiment_id = exp_id
        self.experiment_dir = exp_dir
        self.job_dir = os.path.join(exp_dir, task_dir)

    def create_job_dir(self) -> None:
        # NeMo-Run names the task's directory after the task: a NUL there is os.makedirs' bare ValueError.
        if "\0" in self.job_dir:
            raise ConfigError(
                f"task name {os.path.basename(self.job_dir.rstrip('/'))!r}: contains a NUL character; "
                "name the task (exp.add(..., name=...)) with letters, digits, '-' and '_'"
            )
        super().create_job_dir()

    def nnodes(self) -> int:
        return self.nodes

    def nproc_per_node(self) -> int:
        return self.nprocs_per_node

    def macro_values(self) -> Optional[ExecutorMacros]:
        # NeMo-Run's launchers write $${head_node_ip_var} etc.; point them at Trainer's PET_* env.
        return ExecutorMacros(
            head_node_ip_var=PET_MASTER_ADDR,
            nproc_per_node_var=PET_NPROC_PER_NODE,
            num_nodes_var=PET_NNODES,
            node_rank_var=PET_NODE_RANK,
            het_group_host_var=PET_MASTER_ADDR,
        )

    def package_configs(self, *cfgs: tuple[str, str]) -> list[str]:
        """Write the configs locally (they are shipped in the task's ConfigMap) and
        return the paths they will have *in the pod*, which is where fdl_runner reads them."""
        local_paths = super().package_configs(*cfgs)
        task_dir = os.path.basename(self.job_dir.rstrip("/"))
        configs_dir = os.path.join(self.job_dir, "configs")
        return [
            f"{self.workspace_mount_path.rstrip('/')}/{task_dir}/configs/"
            + os.path.relpath(p, configs_dir).replace(os.sep, "/")
            for p in local_paths
        ]

    def get_launcher(self):
        # NeMo-Run looks a launcher name up in its LAUNCHER_MAP before validate() runs: a KeyError otherwise.
        if problem := launcher_problem(self.launcher):
            raise ConfigError(problem)
        return super().get_launcher()

    def supports_launcher_transform(self) -> bool:
        return False

    def info(self) -> str:
        return f"KubeflowExecutor ({self.nodes}x{self.nprocs_per_node}, {self.namespace})"

    # --- derived settings ------------------------------------------------------------
    def spreads_pods(self) -> bool:
        return self.gpus_per_node > 0 if self.one_pod_per_node is None else self.one_pod_per_node

    def validate(self) -> None:
        """Check the configuration; raise ``ConfigError`` listing every problem found.

        Pure: touches neither the file system nor the cluster.
        """
        problems, checked, reset = _type_problems(self)
        # A field of the wrong type was checked at its default: its type is its one problem.
        problems += [p for p in checked._problems() if not _names_first(p, reset)]
        if problems:
            listing = "\n".join(f"  - {p}" for p in problems)
            raise ConfigError(f"KubeflowExecutor configuration is invalid:\n{listing}")

    def _problems(self):
        """Every problem but the fields' types: ``validate()`` runs these on fields of the right types only,
        which is why no check here looks at a field's type again."""
        yield from _declared_problems(self)
        for check in (
            self._process_problems,
            self._container_image_problems,
            self._namespace_problems,
            self._request_limit_problems,
            self._extra_resource_problems,
            self._env_name_problems,
            self._secret_source_problems,
            self._secret_reference_problems,
            self._secret_env_from_problems,
            self._mount_path_problems,
            self._mounted_object_problems,
            self._image_problems,
            self._name_problems,
            self._key_name_problems,
            self._reserved_key_problems,
            self._node_selector_value_problems,
            self._annotation_size_problems,
            self._toleration_problems,
            self._resource_name_problems,
            self._resource_count_problems,
            self._runtime_problems,
            self._launcher_problems,
            self._workspace_problems,
            self._label_value_problems,
            self._security_problems,
        ):
            yield from check()
        yield from fabric_problems(self)
        yield from initializer_problems(self)
        for check in (
            self._queue_problems,
            self._queueless_priority_problems,
            self._pod_group_problems,
            self._gang_initializer_problems,
            self._scheduler_name_problems,
            self._failure_policy_problems,
            self._oom_kill_problems,
            self._warm_start_problems,
            self._ft_launcher_setting_problems,
            self._preflight_problems,
        ):
            yield from check()

    def _value_problems(self, *fields: str) -> Iterator[str]:
        """``fields`` set to a value their ``_VALUE_RULES`` row refuses (``None`` is unset, never refused)."""
        for fname in fields:
            is_valid, rule = _VALUE_RULES[fname]
            value = getattr(self, fname)
            if value is not None and not is_valid(value):
                yield f"{fname}={value!r}: {rule}"

    def _process_problems(self):
        if self.gpus_per_node > 0 and self.nprocs_per_node > self.gpus_per_node:
            yield (
                f"nprocs_per_node={self.nprocs_per_node} exceeds gpus_per_node={self.gpus_per_node}: "
                "each process needs its own GPU; lower nprocs_per_node or raise gpus_per_node"
            )

    def _container_image_problems(self):
        image = self.container_image
        if not image or not image.strip():
            yield (
                "container_image is not set: give the image the training pods run, "
                "e.g. container_image='nvcr.io/nvidia/nemo:25.02'"
            )
        elif any(c.isspace() for c in image):
            yield f"container_image={image!r}: must not contain whitespace"
        elif problem := naming.image_reference_problem(image.strip()):
            yield f"container_image={image!r}: {problem}; the kubelet would refuse to pull it"

    def _namespace_problems(self):
        if not naming.is_rfc1123_label(self.namespace or ""):
            yield (
                f"namespace={self.namespace!r}: must be a DNS-1123 label "
                "(lowercase letters, digits and '-', at most 63 characters)"
            )

    def _request_limit_problems(self):
        for lo, hi in (("cpu_request", "cpu_limit"), ("memory_request", "memory_limit")):
            a, b = getattr(self, lo), getattr(self, hi)
            qa, qb = _optional_quantity(a), _optional_quantity(b)
            if qa is not None and qb is not None and qa > qb:
                yield f"{lo}={a!r} is larger than {hi}={b!r}"

    def _extra_resource_problems(self):
        for res, value in self.extra_resources.items():
            if parse_quantity(str(value)) is None:
                yield f"extra_resources[{res!r}]={value!r}: not a Kubernetes quantity"
            if res == self.gpu_resource_name:
                yield f"extra_resources[{res!r}]: set GPUs with gpus_per_node instead"

    def _runtime_problems(self):
        if self.runtime_kind not in (CLUSTER_RUNTIME_KIND, RUNTIME_KIND):
            yield f"runtime_kind={self.runtime_kind!r}: must be {CLUSTER_RUNTIME_KIND!r} or {RUNTIME_KIND!r}"
        yield from self._value_problems("runtime_name")
        if self.runtime_name and self.runtime_template:
            yield "runtime_name and runtime_template are exclusive: use an existing runtime or render one"

    def _launcher_problems(self):
        if problem := launcher_problem(self.launcher):
            yield problem

    def _workspace_problems(self):
        path = self.workspace_mount_path
        if not path.startswith("/") or path == "/" or os.path.normpath(path) != path or "\0" in path:
            yield (
                f"workspace_mount_path={path!r}: must be an absolute path, normalized and other than '/', where "
                "the task's files are mounted, e.g. '/nemo_run'"
            )

    def _label_value_problems(self):
        for key, value in {**self.labels, **self.pod_labels}.items():
            if not naming.is_label_value(str(value)):
                yield f"label {key}={value!r}: label values are {naming.LABEL_VALUE_RULE}"

    def _security_problems(self):
        if self.restricted_security and self.run_as_user == 0:
            yield "run_as_user=0 with restricted_security: the restricted profile forbids running as root"

    def _preflight_problems(self):
        # True, False or a string: the field's type says so.
        if isinstance(self.preflight, str) and not self.preflight.strip():
            yield "preflight='': give a bash command, or True for the packaged checks"

    def _image_problems(self):
        """The other images the pods run (initializers, fabric daemons), by the same grammar."""
        for where, image in [*self._initializer_images(), *self._fabric_images()]:
            # Empty or with whitespace: initializer_problems says so already.
            if image and not any(c.isspace() for c in image):
                if problem := naming.image_reference_problem(image):
                    yield f"{where}={image!r}: {problem}; the kubelet would refuse to pull it"

    def _initializer_images(self) -> list[tuple[str, str]]:
        """``(field, image)`` of each initializer image, with an ``initializer`` (and settings of the right class)."""
        from nemo_kubeflow.parts.initializers import settings

        if self.initializer is None or not isinstance(init := settings(self), InitializerSettings):
            return []
        return [
            (f"initializer_settings.{f}", getattr(init, f))
            for f in ("dataset_image", "model_image", "data_cache_image")
        ]

    def _fabric_images(self) -> list[tuple[str, str]]:
        """``(field, image)`` of each image of the network fabric's daemons (with settings of the right class)."""
        profile = PROFILES.get(fabric_name(self))
        if profile is None or not isinstance(cfg := profile_settings(self, profile.name), profile.settings):
            return []
        return [(f"{profile.field}.{f}", getattr(cfg, f)) for f in profile.images]

    def _name_problems(self):
        """Names of other objects the pods refer to: a wrong one is not refused by the API server but
        leaves the pod Pending (an absent ServiceAccount, Secret or StorageClass can never be found)."""
        yield from self._value_problems("service_account")
        for i, secret in enumerate(self.image_pull_secrets):
            if not naming.is_rfc1123_subdomain(secret):
                yield f"image_pull_secrets[{i}]={secret!r}: must be {_SUBDOMAIN}, the name of a Secret"
        yield from self._claim_name_problems()
        yield from self._secret_mount_name_problems()
        yield from self._secret_key_problems()

    def _secret_key_problems(self):
        """The keys of well-formed ``secret_key_refs`` (``_secret_reference_problems`` reports the others)."""
        for name, ref in self.secret_key_refs.items():
            secret, _, key = str(ref).partition("/")
            if key and naming.is_rfc1123_subdomain(secret) and not naming.is_config_key(key):
                yield f"secret_key_refs[{name!r}]={ref!r}: {key!r} is not a Secret key ([-._a-zA-Z0-9], at most 253)"

    def _claim_name_problems(self):
        """The names inside ``pvc_mounts``: storage classes and sub-paths."""
        for m in self.pvc_mounts:
            if m.storage_class is not None and not naming.is_rfc1123_subdomain(m.storage_class):
                yield f"pvc_mounts[{m.claim_name}]: storage_class={m.storage_class!r} must be {_SUBDOMAIN}"
            if m.sub_path is not None and (problem := naming.descending_path_problem(m.sub_path)):
                yield f"pvc_mounts[{m.claim_name}]: sub_path={m.sub_path!r} {problem}"

    def _secret_mount_name_problems(self):
        """The names inside ``secret_mounts``: Secret keys, and file modes."""
        for secret_mount in self.secret_mounts:
            for key in secret_mount.keys:
                if not naming.is_config_key(key):
                    yield (
                        f"secret_mounts[{secret_mount.secret_name}]: keys has {key!r}, not a Secret key (at "
                        "most 253 letters, digits, '-', '_' and '.', not starting with '..')"
                    )
            if not 0 <= secret_mount.default_mode <= 0o777:
                yield (
                    f"secret_mounts[{secret_mount.secret_name}]: default_mode={secret_mount.default_mode!r} "
                    "must be a file mode 0o000..0o777"
                )

    # Label and annotation keys and values, as the API server checks them.
    def _key_name_problems(self):
        for fname in ("labels", "pod_labels", "annotations", "pod_annotations", "node_selector"):
            for key in getattr(self, fname):
                if not naming.is_qualified_name(key):
                    yield f"{fname}[{key!r}]: not a valid key: {_KEY_RULE}"

    def _reserved_key_problems(self):
        for fname in ("labels", "pod_labels", "annotations", "pod_annotations"):
            if reserved := [key for key in getattr(self, fname) if _is_reserved_key(key)]:
                yield (
                    f"{fname}: {', '.join(map(repr, reserved))} {'is' if len(reserved) == 1 else 'are'} "
                    f"nemo_kubeflow's own (it finds, collects and describes its jobs by them): keys "
                    f"{', '.join(RESERVED_KEYS)} and {RESERVED_KEY_PREFIX}* are reserved; use a key of your own"
                )

    def _node_selector_value_problems(self):
        for key, value in self.node_selector.items():
            if not naming.is_label_value(value):
                yield f"node_selector[{key!r}]={value!r}: node label values are {naming.LABEL_VALUE_RULE}"

    def _annotation_size_problems(self):
        for fname in ("annotations", "pod_annotations"):
            size = sum(len(k.encode()) + len(v.encode()) for k, v in getattr(self, fname).items())
            if size > ANNOTATIONS_MAX_BYTES:
                yield (
                    f"{fname}: {size} bytes in all; Kubernetes allows {ANNOTATIONS_MAX_BYTES // 1024} KiB, "
                    "keys included"
                )

    def _toleration_problems(self):
        """Tolerations as the API server validates them (``validateTolerations``): a wrong one would
        be dropped or refused, and the pods would wait forever for an untainted node."""
        for i, tol in enumerate(self.tolerations):
            yield from _toleration_problems(f"tolerations[{i}]", tol)

    # Resource names and signs; the quantities' syntax is checked by _extra_resource_problems.
    def _resource_name_problems(self):
        for res in [self.gpu_resource_name, *self.extra_resources]:
            where = "gpu_resource_name" if res is self.gpu_resource_name else f"extra_resources[{res!r}]"
            if not _is_resource_name(res):
                yield (
                    f"{where}: {res!r} is not a resource name: extended resources are fully qualified, "
                    "e.g. 'nvidia.com/gpu' or 'vpc.amazonaws.com/efa'"
                )

    def _resource_count_problems(self):
        for res, value in self.extra_resources.items():
            quantity = parse_quantity(value)
            if quantity is not None and (quantity < 0 or quantity != int(quantity)):
                yield f"extra_resources[{res!r}]={value!r}: extended resources are whole, non-negative numbers"

    def _warm_start_problems(self):
        preload, poll = self.worker_preload, self.rendezvous_poll_seconds
        if not all(_MODULE_NAME.fullmatch(m) for m in preload):
            yield (
                f"worker_preload={preload!r}: must be a list of module names to import, e.g. ['torch'] "
                "(dotted Python names, no spaces); [] starts every worker as a new Python"
            )
        if poll is not None and not 0.05 <= poll <= 1:
            yield (
                f"rendezvous_poll_seconds={poll!r}: must be a number of seconds from 0.05 to 1, e.g. 0.1; "
                "None keeps ft_launcher's 1 s"
            )

    def _ft_launcher_setting_problems(self):
        """``worker_preload`` and ``rendezvous_poll_seconds`` set with a launcher other than ft_launcher."""
        used = self._ft_launcher_settings_used()
        if used and not self._runs_ft_launcher():
            verb, them = ("tune", "them") if len(used) > 1 else ("tunes", "it")
            yield (
                f"{' and '.join(used)} {verb} how ft_launcher starts and restarts ranks, but launcher="
                f"{self.launcher!r} is not ft_launcher: set launcher='ft' (or run.FaultTolerance(...)), or leave "
                f"{them} unset"
            )

    def _ft_launcher_settings_used(self) -> list[str]:
        """The settings of ft_launcher that are set: ``worker_preload``, ``rendezvous_poll_seconds``."""
        return [
            name for name in ("worker_preload", "rendezvous_poll_seconds") if getattr(self, name) not in (None, [], ())
        ]

    def _runs_ft_launcher(self) -> bool:
        from nemo_run.core.execution.launcher import FaultTolerance

        return self.launcher == "ft" or isinstance(self.launcher, FaultTolerance)

    def _failure_policy_problems(self):
        codes = self.fail_fast_exit_codes
        if any(not 1 <= c <= 255 for c in codes):
            yield (
                f"fail_fast_exit_codes={codes!r}: must be a list of exit codes from 1 to 255 (0 is success; "
                "the Job's podFailurePolicy refuses it), e.g. [1]; [] restarts on every failure"
            )
        elif len(set(codes)) != len(codes):
            yield f"fail_fast_exit_codes={codes!r}: lists an exit code twice; give each once"

    def _oom_kill_problems(self):
        codes = self.fail_fast_exit_codes
        if self.restart_on_oom_kill and OOM_KILLED_EXIT_CODE in codes:
            yield (
                f"restart_on_oom_kill=True restarts the gang on exit code {OOM_KILLED_EXIT_CODE} (OOMKilled), but "
                f"fail_fast_exit_codes={codes!r} fails the job at once on it; remove {OOM_KILLED_EXIT_CODE} from "
                "fail_fast_exit_codes, or leave restart_on_oom_kill False"
            )

    def _queue_problems(self):
        """Kueue's queue and priority class: fields that also land as labels."""
        for fname, label in (("queue_name", QUEUE_LABEL), ("workload_priority_class", PRIORITY_CLASS_LABEL)):
            yield from self._value_problems(fname)
            value = getattr(self, fname)
            if value is not None and self.labels.get(label, value) != value:
                yield f"{fname}={value!r} and labels[{label!r}]={self.labels[label]!r} disagree; set {fname} only"

    def _queueless_priority_problems(self):
        if self.workload_priority_class is not None and self.queue_name is None and QUEUE_LABEL not in self.labels:
            yield "workload_priority_class needs queue_name: Kueue orders only the jobs of its queues"

    def _pod_group_problems(self):
        if self.pod_group_policy not in POD_GROUP_POLICIES:
            yield f"pod_group_policy={self.pod_group_policy!r}: must be one of {', '.join(POD_GROUP_POLICIES)}"
        if self.schedule_timeout_seconds is not None and self.pod_group_policy != "coscheduling":
            yield "schedule_timeout_seconds applies to pod_group_policy='coscheduling' only"

    def _gang_initializer_problems(self):
        if self.pod_group_policy != "none" and self.initializer is not None:
            yield (
                f"pod_group_policy={self.pod_group_policy!r} with an initializer: Trainer counts the initializer "
                "pods in the gang, but they must finish before the node pods are created, so the gang can never "
                "be complete; use queue_name (Kueue) instead, or drop the initializer"
            )

    def _scheduler_name_problems(self):
        yield from self._value_problems("priority_class_name", "scheduler_name", "topology_key")

    def _env_name_problems(self):
        """The names of the task's environment variables, each set once."""
        seen: set[str] = set()
        for fname in ("env_vars", "secret_env_vars", "secret_key_refs"):
            for name in getattr(self, fname):
                yield from _env_name_problems(fname, name, seen)
                seen.add(name)

    def _secret_source_problems(self):
        for name, source in self.secret_env_vars.items():
            kind, _, ref = str(source).partition(":")
            if kind not in ("env", "file") or not ref:
                yield (
                    f"secret_env_vars[{name!r}]: give where to read the value, 'env:LOCAL_VAR' or "
                    "'file:/path' (literal values are refused because NeMo-Run writes the executor to disk)"
                )

    def _secret_reference_problems(self):
        """``secret_key_refs`` of the form ``secret-name/key``."""
        for name, ref in self.secret_key_refs.items():
            secret, _, key = str(ref).partition("/")
            if not naming.is_rfc1123_subdomain(secret) or not key:
                yield f"secret_key_refs[{name!r}]={ref!r}: expected 'secret-name/key'"

    def _secret_env_from_problems(self):
        for secret in self.secret_env_from:
            if not naming.is_rfc1123_subdomain(secret):
                yield f"secret_env_from: {secret!r} is not a valid Secret name ({_OBJECT_NAME_RULE})"

    def _volume_mounts(self) -> list[tuple[str, str]]:
        """``(entry, mount_path)`` of each entry of ``pvc_mounts`` and ``secret_mounts``."""
        return [(f"pvc_mounts[{m.claim_name}]", m.mount_path) for m in self.pvc_mounts] + [
            (f"secret_mounts[{m.secret_name}]", m.mount_path) for m in self.secret_mounts
        ]

    def _mount_path_problems(self):
        """Mount paths: absolute, and one mount per path."""
        paths: dict[str, str] = {self.workspace_mount_path: "workspace_mount_path"}
        if self.shm_size is not None:
            paths["/dev/shm"] = "shm_size"
        for what, path in self._volume_mounts():
            if not str(path).startswith("/"):
                yield f"{what}: mount_path {path!r} must be an absolute path"
            elif path in paths:
                yield f"{what}: mount_path {path!r} is already used by {paths[path]}"
            paths[path] = what

    def _mounted_object_problems(self):
        """The claims and Secrets the mounts name."""
        for m in self.pvc_mounts:
            yield from _claim_problems(m)
        for secret_mount in self.secret_mounts:
            if not naming.is_rfc1123_subdomain(secret_mount.secret_name):
                yield f"secret_mounts: {secret_mount.secret_name!r} is not a valid Secret name ({_OBJECT_NAME_RULE})"


def _env_name_problems(fname: str, name: str, seen: set[str]) -> Iterator[str]:
    """Problems of environment variable ``name`` of field ``fname``, the names ``seen`` before it set already."""
    if reserved := naming.trainer_env_problem(name):
        yield f"{fname}: environment variable {reserved}; remove it"
    elif not naming.is_env_var_name(name):
        yield f"{fname}: environment variable {name!r}: names are {naming.ENV_VAR_NAME_RULE}"
    if name in seen:
        yield f"environment variable {name} is set twice (env_vars, secret_env_vars, secret_key_refs)"


def _is_reserved_key(key: str) -> bool:
    """Whether label or annotation ``key`` is one nemo_kubeflow finds its own objects by."""
    return key in RESERVED_KEYS or str(key).startswith(RESERVED_KEY_PREFIX)


def _is_resource_name(res: str) -> bool:
    """Whether ``res`` names a resource: a standard one (``cpu``, ``hugepages-*``...) or a fully qualified one."""
    return naming.is_qualified_name(res) and ("/" in res or res in STANDARD_RESOURCES or res.startswith("hugepages-"))


def _is_queue_object_name(value: str) -> bool:
    """Whether ``value`` can name a Kueue object that a label also carries (a label value has at most 63 characters)."""
    return naming.is_rfc1123_subdomain(value) and len(value) <= 63


def _toleration_problems(where: str, tol: dict) -> Iterator[str]:
    """What the API server would refuse in one toleration ``tol``."""
    yield from _unknown_toleration_fields(where, tol)
    key, operator = tol.get("key", ""), tol.get("operator", "Equal")
    value, effect = tol.get("value", ""), tol.get("effect", "")
    if not all(isinstance(v, str) for v in (key, operator, value, effect)):
        yield f"{where}={tol!r}: key, operator, value and effect are strings"
        return
    for problem in (
        _toleration_key_problem(key),
        _toleration_operator_problem(key, operator, value),
        _toleration_effect_problem(effect),
        _toleration_seconds_problem(tol.get("tolerationSeconds"), effect),
    ):
        if problem:
            yield f"{where}: {problem}"


def _toleration_key_problem(key: str) -> Optional[str]:
    if key and not naming.is_qualified_name(key):
        return f"key={key!r} is not a taint key (a label key such as 'nvidia.com/gpu')"
    return None


def _toleration_effect_problem(effect: str) -> Optional[str]:
    if effect and effect not in TAINT_EFFECTS:
        return f"effect={effect!r} must be one of {', '.join(TAINT_EFFECTS)} (or unset: any effect)"
    return None


def _unknown_toleration_fields(where: str, tol: dict) -> Iterator[str]:
    unknown = sorted(set(tol) - set(TOLERATION_FIELDS))
    if unknown:
        yield (
            f"{where}: unknown field(s) {', '.join(map(repr, unknown))}: a toleration has "
            f"{', '.join(TOLERATION_FIELDS)}{_toleration_field_hints(unknown)}"
        )


def _toleration_field_hints(unknown: list[str]) -> str:
    """`` (did you mean ...)`` for the ``unknown`` toleration fields close to a real one ('' for none)."""
    close = {u: difflib.get_close_matches(u, TOLERATION_FIELDS, n=1) for u in unknown}
    hints = "; ".join(f"did you mean {c[0]!r} for {u!r}" for u, c in close.items() if c)
    return f" ({hints})" if hints else ""


def _toleration_operator_problem(key: str, operator: str, value: str) -> Optional[str]:
    if operator not in TOLERATION_OPERATORS:
        return f"operator={operator!r} must be one of {', '.join(TOLERATION_OPERATORS)}"
    if operator == "Exists":
        return f"operator 'Exists' takes no value (got {value!r}); drop value, or use 'Equal'" if value else None
    if not key:
        return "an empty key tolerates every taint only with operator 'Exists'"
    if not naming.is_label_value(value):
        return f"value={value!r} is not a taint value ({naming.LABEL_VALUE_RULE})"
    return None


def _toleration_seconds_problem(seconds: object, effect: str) -> Optional[str]:
    if seconds is None:
        return None
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        return f"tolerationSeconds={seconds!r} must be an integer"
    if effect != "NoExecute":
        return f"tolerationSeconds applies to effect 'NoExecute' only (effect is {effect!r})"
    return None


def _claim_problems(m: PVCMount) -> Iterator[str]:
    """One ``pvc_mounts`` entry's claim: its name, and with ``create`` its size and access modes."""
    if not naming.is_rfc1123_subdomain(m.claim_name):
        yield f"pvc_mounts: claim_name {m.claim_name!r} is not a valid Kubernetes name ({_OBJECT_NAME_RULE})"
    if not m.create:
        return
    if m.size is None or parse_quantity(str(m.size)) is None:
        yield f"pvc_mounts[{m.claim_name}]: create=True needs size, e.g. size='100Gi'"
    if (refused := refused_access_modes(m.access_modes)) is not None:
        yield f"pvc_mounts[{m.claim_name}]: invalid access_modes {refused}"


# A module worker_preload imports: a dotted Python name.
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: The rule of a DNS-1123 subdomain, the name of most objects, in words for messages.
_OBJECT_NAME_RULE = "at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
#: What the name of an object the pods refer to must be, for messages.
_SUBDOMAIN = f"a Kubernetes object name ({_OBJECT_NAME_RULE})"
#: The rule of label and annotation keys, in words for messages.
_KEY_RULE = (
    "keys are an optional DNS-subdomain prefix and '/', then at most 63 letters, digits, "
    "'-', '_' and '.' starting and ending with a letter or digit, e.g. 'example.com/team'"
)
_NOT_AN_OBJECT_NAME = f"not a valid Kubernetes object name ({_OBJECT_NAME_RULE})"
_NOT_A_QUEUE_OBJECT_NAME = (
    "must be a Kubernetes object name of at most 63 characters (lowercase letters, digits, '-' and '.')"
)
#: The optional fields that name something, as ``_value_problems`` checks them when set:
#: field -> (whether a value is valid, what the message says of an invalid one).
_VALUE_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    # Objects Trainer or the pods refer to: a wrong name is refused, or leaves the pods Pending.
    "runtime_name": (naming.is_rfc1123_subdomain, _NOT_AN_OBJECT_NAME),
    "service_account": (naming.is_rfc1123_subdomain, f"must be {_SUBDOMAIN}"),
    "priority_class_name": (naming.is_rfc1123_subdomain, _NOT_AN_OBJECT_NAME),
    "scheduler_name": (naming.is_rfc1123_subdomain, _NOT_AN_OBJECT_NAME),
    # A node label key, which the pod affinity's topologyKey is.
    "topology_key": (naming.is_qualified_name, "must be a node label key, e.g. 'cloud.google.com/gce-topology-block'"),
    # Kueue's objects, named in labels too (at most 63 characters there).
    "queue_name": (_is_queue_object_name, _NOT_A_QUEUE_OBJECT_NAME),
    "workload_priority_class": (_is_queue_object_name, _NOT_A_QUEUE_OBJECT_NAME),
}


# --- types of the fields ------------------------------------------------------------------
# Python does not check dataclass annotations, and NeMo-Run builds executors from YAML and the
# command line too, so a wrong type would otherwise surface as an AttributeError deep in the
# build, or as a manifest the server refuses. bool is an int in Python, hence the explicit checks.

#: Fields that take a Kubernetes quantity: a number is as good as a string there.
_QUANTITY_FIELDS = frozenset(
    {
        *(f"KubeflowExecutor.{name}" for name, lands in LANDINGS.items() if lands.quantity),
        "PVCMount.size",
        "InitializerSettings.claim_size",
    }
)
#: Settings objects whose own checks say when they are of the wrong class (and only when they are used).
_SETTINGS_CHECKED_ELSEWHERE = frozenset({*(p.field for p in PROFILES.values()), "initializer_settings"})
_TYPE_NAMES = {
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    bool: ("True or False", "booleans"),
    str: ("a string", "strings"),
    dict: ("a dict", "dicts"),
    list: ("a list", "lists"),
}


def launcher_problem(launcher: object) -> Optional[str]:
    """Why ``launcher`` names no NeMo-Run launcher (``None`` when it is one, or a Launcher object)."""
    from nemo_run.core.execution.launcher import LAUNCHER_MAP

    if not isinstance(launcher, str) or launcher in LAUNCHER_MAP:
        return None
    close = difflib.get_close_matches(launcher, list(LAUNCHER_MAP), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (
        f"launcher={launcher!r}: not a NeMo-Run launcher; {hint}use one of "
        f"{', '.join(map(repr, sorted(LAUNCHER_MAP)))}, a run.Torchrun(...)/run.FaultTolerance(...), or None"
    )


def _type_problems(executor: "KubeflowExecutor") -> tuple[list[str], "KubeflowExecutor", tuple[str, ...]]:
    """The fields whose values have the wrong type, the executor to run the other checks on, and the
    fields set back: ``executor`` itself, or a copy with those fields back at their defaults (so that every
    other problem is still listed, and no check trips over a value of the wrong type)."""
    problems, bad = [], []
    executor_class: type = type(executor)  # (a class is hashable, even when its instances are not)
    for f, annotation in _typed_fields(executor_class):
        if problem := _field_type_problem(executor, f, annotation):
            problems.append(problem)
            bad.append(f)
    return (problems, *_with_defaults(executor, bad))


def _with_defaults(
    executor: "KubeflowExecutor", fields: list[dataclasses.Field]
) -> tuple["KubeflowExecutor", tuple[str, ...]]:
    """``executor`` with ``fields`` set back to their defaults (a copy, when there are any), and the names of
    the fields set back."""
    checked = copy.copy(executor) if fields else executor
    reset = []
    for f in fields:
        default = _field_default(f)
        # A required field was given: a value of the wrong type stays.
        if default is not dataclasses.MISSING:
            object.__setattr__(checked, f.name, default)
            reset.append(f.name)
    return checked, tuple(reset)


def _field_type_problem(executor: "KubeflowExecutor", f: dataclasses.Field, annotation: object) -> Optional[str]:
    """Why field ``f`` of ``executor`` does not fit its ``annotation``, or None (also for a settings object
    whose own checks refuse its class)."""
    value = getattr(executor, f.name)
    if _checked_elsewhere(f.name, value, annotation):
        return None
    return type_problem(value, annotation, f.name, f"{type(executor).__name__}.{f.name}" in _QUANTITY_FIELDS)


def _checked_elsewhere(name: str, value: object, annotation: object) -> bool:
    """Whether field ``name`` holds a settings object of another class than its ``annotation``'s, which the
    settings' own checks refuse (``_SETTINGS_CHECKED_ELSEWHERE``)."""
    if name not in _SETTINGS_CHECKED_ELSEWHERE or value is None:
        return False
    return not isinstance(value, tuple(a for a in typing.get_args(annotation) if isinstance(a, type)))


def _field_default(f: dataclasses.Field) -> Any:
    """The default value of field ``f`` (a fresh one from its factory), or ``dataclasses.MISSING``."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _names_first(problem: str, fields: tuple[str, ...]) -> bool:
    """Whether ``problem`` starts with the name of one of ``fields`` (is about it)."""
    if not fields:
        return False
    return re.match(rf"({'|'.join(fields)})\b", problem) is not None


@functools.lru_cache(maxsize=None)
def _typed_fields(cls: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    """``(field, its resolved annotation)`` of each field of dataclass ``cls`` that its constructor takes (see
    ``_field_types`` for the fields left out)."""
    hints = _field_types(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls) if f.init and f.name in hints)


@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> dict:
    """The resolved annotation of each field of dataclass ``cls``; forward references that do not
    resolve (``"Initializer"``, imported only for type checkers) are left out."""
    hints = {}
    for f in dataclasses.fields(cls):
        tp = f.type
        if isinstance(tp, str):
            try:
                tp = typing.get_type_hints(cls, include_extras=False).get(f.name, tp)
            except (NameError, TypeError):
                continue
        if not isinstance(tp, str):
            hints[f.name] = tp
    return hints


@functools.lru_cache(maxsize=None)
def _annotation_parts(tp) -> tuple:
    """``(typing.get_origin(tp), typing.get_args(tp))``, once per annotation: validate() asks for
    them for every field of every task's executor."""
    return typing.get_origin(tp), typing.get_args(tp)


def _origin_and_args(tp) -> tuple:
    """``(typing.get_origin(tp), typing.get_args(tp))``, cached unless ``tp`` is unhashable."""
    try:
        return _annotation_parts(tp)
    except TypeError:  # an unhashable annotation
        return typing.get_origin(tp), typing.get_args(tp)


def type_problem(value, tp, where: str, numbers_ok: bool = False) -> Optional[str]:
    """Why ``value`` does not fit annotation ``tp`` (naming ``where`` and the type expected), or None."""
    if tp is typing.Any or isinstance(tp, (str, typing.ForwardRef)):
        return None
    origin, args = _origin_and_args(tp)
    if tp in _PLAIN_TYPES and type(value) is tp:
        return None  # the common case, a value of exactly the annotated class
    if origin in _GENERIC_CHECKS:
        return _GENERIC_CHECKS[origin](value, tp, args, where, numbers_ok)
    if tp in _SCALAR_CHECKS:
        return None if _SCALAR_CHECKS[tp](value, numbers_ok) else _mismatch(where, value, tp, numbers_ok)
    return _class_problem(value, tp, where)


def _class_problem(value, tp, where: str) -> Optional[str]:
    """Why ``value`` is no instance of class ``tp`` (or of a dataclass, has fields of the wrong type), or None;
    an annotation that is no class is not checked."""
    if not isinstance(tp, type):
        return None
    if dataclasses.is_dataclass(tp):
        return _dataclass_problem(value, tp, where)
    return None if isinstance(value, tp) else _mismatch(where, value, tp)


def _union_problem(value, tp, args: tuple, where: str, numbers_ok: bool) -> Optional[str]:
    if any(isinstance(a, typing.ForwardRef) or type_problem(value, a, where, numbers_ok) is None for a in args):
        return None
    # The one alternative the value was meant for: say what is wrong inside it.
    alternative = _meant_alternative(value, args)
    if alternative is None:
        return _mismatch(where, value, tp, numbers_ok)
    return type_problem(value, alternative, where, numbers_ok)


def _meant_alternative(value, args: tuple) -> Any:
    """The alternative of a Union (of ``args``) that ``value`` was meant for: the one of its own kind (X of
    Optional[X], list[str] of Union[str, list[str]]), else (a value given) the one other than None; ``None``
    when that is not one alternative."""
    kinds = [a for a in args if _of_kind(value, a)]
    if len(kinds) == 1:
        return kinds[0]
    others = [a for a in args if a is not type(None)]
    if value is not None and len(others) == 1:
        return others[0]
    return None


def _of_kind(value, alternative) -> bool:
    """Whether ``value`` is of the class of a Union's ``alternative`` (of ``list`` for ``list[str]``)."""
    kind = typing.get_origin(alternative) or alternative
    return isinstance(kind, type) and isinstance(value, kind) and alternative is not type(None)


def _list_problem(value, tp, args: tuple, where: str, numbers_ok: bool) -> Optional[str]:
    if not isinstance(value, (list, tuple)):
        return _mismatch(where, value, tp, numbers_ok)
    item_type = args[0] if args else typing.Any
    return next(
        (p for i, item in enumerate(value) if (p := type_problem(item, item_type, f"{where}[{i}]", numbers_ok))), None
    )


def _dict_problem(value, tp, args: tuple, where: str, numbers_ok: bool) -> Optional[str]:
    if not isinstance(value, dict):
        return _mismatch(where, value, tp, numbers_ok)
    key_type, value_type = args if args else (typing.Any, typing.Any)
    return next(
        (
            p
            for key, item in value.items()
            if (
                p := type_problem(key, key_type, f"{where} key")
                or type_problem(item, value_type, f"{where}[{key!r}]", numbers_ok)
            )
        ),
        None,
    )


#: The check of each generic annotation's origin: ``(value, tp, args, where, numbers_ok) -> problem``.
_GENERIC_CHECKS: dict[object, Callable[..., Optional[str]]] = {
    Union: _union_problem,
    list: _list_problem,
    dict: _dict_problem,
}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: Whether a value fits each scalar annotation: ``(value, numbers_ok) -> bool``. A number is no bool
#: (True and False are integers to Python, not to Kubernetes); a quantity field takes numbers as strings.
_SCALAR_CHECKS: dict[type, Callable[[object, bool], bool]] = {
    bool: lambda value, numbers_ok: isinstance(value, bool),
    int: lambda value, numbers_ok: isinstance(value, int) and not isinstance(value, bool),
    float: lambda value, numbers_ok: _is_number(value),
    str: lambda value, numbers_ok: isinstance(value, str) or (numbers_ok and _is_number(value)),
}


def _dataclass_problem(value, tp: type, where: str) -> Optional[str]:
    if not isinstance(value, tp):
        return _mismatch(where, value, tp)
    cls: typing.Any = type(value)  # a dataclass, by the check above
    if not cls.__module__.startswith("nemo_kubeflow."):
        return None  # NeMo-Run's own settings (Packager, launchers) are not annotated strictly enough
    return next(
        (
            p
            for f, annotation in _typed_fields(cls)
            if (
                p := type_problem(
                    getattr(value, f.name),
                    annotation,
                    f"{where}.{f.name}",
                    f"{cls.__name__}.{f.name}" in _QUANTITY_FIELDS,
                )
            )
        ),
        None,
    )


#: Annotations a value of exactly that class always fits (bool is no int here: ``type(True) is bool``).
_PLAIN_TYPES = frozenset({str, int, float, bool})


def _describe(tp, numbers_ok: bool = False, plural: bool = False) -> str:
    """Annotation ``tp`` in words (``plural``: of several values), as a message says what a value must be."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        return _describe_union(args, numbers_ok, plural)
    if origin is list:
        return _describe_container(origin, args[:1], numbers_ok, plural)
    if origin is dict:
        return _describe_container(origin, args, numbers_ok, plural)
    if tp is str and numbers_ok:
        return _describe_quantity(plural)
    if tp in _TYPE_NAMES:
        return _TYPE_NAMES[tp][plural]
    return _describe_class(tp, plural)


def _describe_quantity(plural: bool) -> str:
    """A Kubernetes quantity in words: a string field that takes numbers too."""
    return "quantities (strings or numbers)" if plural else "a quantity (a string such as '8Gi', or a number)"


def _describe_union(args: tuple, numbers_ok: bool, plural: bool) -> str:
    """A Union of ``args`` in words: its alternatives (a bool as its two values), None last."""
    words = ["True, False" if a is bool else _describe(a, numbers_ok, plural) for a in args if a is not type(None)]
    words += ["None"] if type(None) in args else []
    return ", ".join(words[:-1]) + " or " + words[-1]


def _describe_container(origin: type, args: tuple, numbers_ok: bool, plural: bool) -> str:
    """A list (``args``: its item type) or a dict (``args``: its key and value types) in words."""
    word = _TYPE_NAMES[origin][plural]
    if not args:
        return word
    items = " to ".join([_describe(a, plural=True) for a in args[:-1]] + [_describe(args[-1], numbers_ok, True)])
    return f"{word} of {items}"


def _describe_class(tp, plural: bool) -> str:
    """Any other class in words, by its name (with its article)."""
    name = getattr(tp, "__name__", str(tp))
    return f"{name} objects" if plural else f"{'an' if name[:1] in 'AEIOU' else 'a'} {name}"


def _mismatch(where: str, value, tp, numbers_ok: bool = False) -> str:
    got = "None" if value is None else type(value).__name__
    fix = next((f" ({fix(value, tp)})" for applies, fix in _FIXES if applies(value, tp, numbers_ok)), "")
    return f"{where}={value!r}: must be {_describe(tp, numbers_ok)}, not {got}{fix}"


#: How to fix a value of the wrong type, the first that applies: ``(applies(value, tp, numbers_ok), fix(value, tp))``.
_FIXES: tuple[tuple[Callable[[Any, Any, bool], bool], Callable[[Any, Any], str]], ...] = (
    (
        lambda value, tp, _: tp is int and isinstance(value, bool),
        lambda value, tp: "True and False are integers to Python, not to Kubernetes: give a number",
    ),
    (
        lambda value, tp, _: tp is int and isinstance(value, str) and value.strip().isdigit(),
        lambda value, tp: f"write {int(value)}, without quotes",
    ),
    (
        lambda value, tp, _: tp is int and isinstance(value, float) and value.is_integer(),
        lambda value, tp: f"write {int(value)}",
    ),
    (
        lambda value, tp, numbers_ok: (
            tp is str and isinstance(value, (int, float, bool)) and not (numbers_ok and isinstance(value, bool))
        ),
        lambda value, tp: f"quote it: {str(value)!r}",
    ),
    (lambda value, tp, _: tp is str and value is None, lambda value, tp: "remove the entry, or give ''"),
    (
        lambda value, tp, _: isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, dict),
        lambda value, tp: f"write {tp.__name__}(**...) around it",
    ),
)


def _optional_quantity(value: object) -> Optional[Decimal]:
    """``value`` as a number (``None`` when unset or not a quantity)."""
    return parse_quantity(str(value)) if value is not None else None


def _declared_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """The checks derived from each field's ``Landing`` (config/landing.py): integer ranges, quantities,
    and with ``runtime_name`` every field set that only a rendered runtime could carry."""
    for f in dataclasses.fields(executor):
        if (lands := LANDINGS.get(f.name)) is not None:
            yield from _landing_problems(executor, f, lands)


def _landing_problems(executor: "KubeflowExecutor", f: dataclasses.Field, lands: Landing) -> Iterator[str]:
    """Field ``f``'s problems by its ``Landing``: its range, its quantity, its refusal with ``runtime_name``."""
    value = getattr(executor, f.name)
    if problem := lands.range_problem(f.name, value):
        yield problem
    if lands.quantity and (problem := _quantity_problem(f.name, value, lands.example)):
        yield problem
    if refusal := _runtime_name_refusal(executor, f, lands):
        yield refusal


def _runtime_name_refusal(executor: "KubeflowExecutor", f: dataclasses.Field, lands: Landing) -> Optional[str]:
    """The refusal of field ``f`` set with ``runtime_name`` though only a rendered runtime could carry it, or None."""
    if executor.runtime_name is None or lands.existing != REFUSED or _has_default_value(executor, f):
        return None
    return lands.refusal(f.name, executor.runtime_name)


def _quantity_problem(name: str, value: object, example: object) -> Optional[str]:
    """Why ``value`` of the quantity field ``name`` is no quantity of a resource, or None (also when unset;
    a dict of quantities, ``extra_resources``, is checked entry by entry elsewhere)."""
    if value is None or isinstance(value, dict):
        return None
    quantity = parse_quantity(str(value))
    if quantity is None:
        return f"{name}={value!r}: not a Kubernetes quantity (e.g. {example!r}, '500m', '64Gi')"
    if quantity < 0:
        return f"{name}={value!r}: must not be negative"
    return None


def _has_default_value(obj, f: dataclasses.Field) -> bool:
    default = _field_default(f)
    if default is dataclasses.MISSING:
        return False
    value = getattr(obj, f.name)
    try:
        return value is default or (type(value) is type(default) and bool(value == default))
    except Exception:  # an odd value whose == fails: keep it
        return False


# Registration must happen when the module defining the class is imported: fiddle
# imports this module when NeMo-Run deserialises an experiment in a new process.
from nemo_kubeflow.nemo_run.registration import register_executor  # noqa: E402

register_executor(KubeflowExecutor)
