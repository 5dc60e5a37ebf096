"""`KubeflowExecutor`: the NeMo-Run executor configuration for Kubeflow Trainer v2.

This module is configuration only. Building an executor (which NeMo-Run does on
every ``clone()`` and every deserialisation) does no I/O: no kubeconfig is read and
no cluster is contacted until something is actually submitted. ``validate()`` is a
pure check that the scheduler calls before anything is built: the fields' types are checked by
``field_types.py``, their values by ``checks.py``.

No ``from __future__ import annotations`` here: NeMo-Run's CLI reads the field
annotations at run time to parse ``run.executor.<field>=`` overrides, and it understands
neither string annotations nor ``X | Y`` unions (hence ``Optional``/``Union``).

Importing this module registers the executor with NeMo-Run (see ``registration``),
so ``run.Experiment.from_id`` and ``nemo experiment ...`` find it again after fiddle
re-imports the class.
"""

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Union

from nemo_run.core.execution.base import Executor, ExecutorMacros
from nemo_run.core.packaging.base import Packager

from nemo_kubeflow.config import checks
from nemo_kubeflow.config.field_types import has_default_value, names_first, type_problems
from nemo_kubeflow.constants import (
    CLUSTER_RUNTIME_KIND,
    NEMO_RUN_POD_DIR,
    PET_MASTER_ADDR,
    PET_NNODES,
    PET_NODE_RANK,
    PET_NPROC_PER_NODE,
)
from nemo_kubeflow.errors import ConfigError
from nemo_kubeflow.parts.fabrics import (
    EFAConfig,
    GKERDMAConfig,
    InfiniBandConfig,
    TCPXOConfig,
)
from nemo_kubeflow.parts.initializers import InitializerSettings

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
    #: Warn when a running job has made no new training step for this many seconds (a hung collective,
    #: a stuck data loader): status, ``watch`` and an attached wait say it, naming the last step rank 0
    #: reached (docs/progress.md). A job that reports no progress is judged by log silence instead: no
    #: line from a running node for as long (also while following its logs, ``nemo experiment logs -f``).
    #: ``None``: never warn.
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
            if f.init and not has_default_value(self, f)
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
        if problem := checks.launcher_problem(self.launcher):
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
        problems, checked, reset = type_problems(self)
        # A field of the wrong type was checked at its default: its type is its one problem.
        problems += [p for p in checks.problems(checked) if not names_first(p, reset)]
        if problems:
            listing = "\n".join(f"  - {p}" for p in problems)
            raise ConfigError(f"KubeflowExecutor configuration is invalid:\n{listing}")


# Registration must happen when the module defining the class is imported: fiddle
# imports this module when NeMo-Run deserialises an experiment in a new process.
from nemo_kubeflow.config.registration import register_executor  # noqa: E402

register_executor(KubeflowExecutor)
