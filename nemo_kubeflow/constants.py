"""Names and numbers fixed by Kubernetes, JobSet, Kueue and Kubeflow Trainer v2.3, and the few
values nemo_kubeflow itself fixes (its labels, gang scheduler names, timeout defaults).

A value the Trainer controller, JobSet, Kueue or the API server hard-codes is mirrored here once;
the comment says where it comes from. Every module imports them from here.
"""

from typing import Optional

# --- Kubeflow Trainer API ---------------------------------------------------
TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
TRAINER_API_VERSION = f"{TRAINER_GROUP}/{TRAINER_VERSION}"
TRAINJOB_KIND = "TrainJob"
TRAINJOB_PLURAL = "trainjobs"
CLUSTER_RUNTIME_KIND = "ClusterTrainingRuntime"
CLUSTER_RUNTIME_PLURAL = "clustertrainingruntimes"
RUNTIME_KIND = "TrainingRuntime"
RUNTIME_PLURAL = "trainingruntimes"

# The replicated job and the container the controller applies `spec.trainer` to:
# it matches the ancestor label on the Job template and the container name `node`.
TRAINER_NODE = "node"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
# The SDK (not the controller) requires the framework label on runtimes.
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"

# --- JobSet / Job pod labels (set by JobSet and the Job controller) ----------
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
#: The pods a running job's look reads (``observe.job_view.JobView.read_running``), and an experiment's status
#: round lists for its running tasks (``cluster.experiment_snapshot``): a field selector every API server serves.
NOT_RUNNING = "status.phase!=Running"
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
JOBSET_KIND = "JobSet"
#: The ranges of the OpenAPI integer formats (Go's int32 and int64): the API server stores a larger
#: number in a CRD's field, and every typed reader of the kind (controllers, informers) then fails.
INT_FORMAT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
#: JobSet's ``spec.ttlSecondsAfterFinished`` is an int32 with minimum 0 (jobset_types.go).
JOBSET_TTL_MAX = 2**31 - 1
#: The well-known Node label with the node's name (node affinity and pod anti-affinity key on it).
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: The exit code of a container the kernel's OOM killer ended (128 + SIGKILL), with the kubelet's
#: terminated reason ``OOMKilled``; a Job's podFailurePolicy sees only the code.
OOM_KILLED_EXIT_CODE = 137
#: Where the rendered ``node`` Job's podFailurePolicy puts its FailJob rule for ``fail_fast_exit_codes``
#: (after the DisruptionTarget Count rule). The Job controller names the rule's index in the Job's
#: ``Failed`` condition ("Container node for pod <ns>/<pod> failed with exit code 1 matching FailJob rule
#: at index 1"); JobSet's ``userError`` rule matches that message, so that only these exit codes fail
#: the JobSet at once and every other one (the catch-all FailJob rule after it) restarts the gang.
USER_ERROR_POD_FAILURE_RULE = 1
#: JobSet's ``onJobFailureMessagePatterns`` of the ``userError`` rule (a Go regexp, matched anywhere).
USER_ERROR_MESSAGE_PATTERN = f"matching FailJob rule at index {USER_ERROR_POD_FAILURE_RULE}$"

# --- torch plugin environment (Torch.EnforceMLPolicy) -------------------------
PET_NNODES = "PET_NNODES"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_NODE_RANK = "PET_NODE_RANK"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
DEFAULT_MASTER_PORT = 29500
#: What the torch plugin sets each PET_* variable to (torch.go EnforceMLPolicy). Its webhook rejects a
#: TrainJob whose ``spec.trainer.env`` sets one of them (naming.trainer_env_problem says so).
PET_ENV_VALUES = {
    PET_NNODES: "spec.trainer.numNodes",
    PET_NPROC_PER_NODE: "spec.trainer.numProcPerNode",
    PET_NODE_RANK: "each pod's job completion index",
    PET_MASTER_ADDR: "the first node pod, <trainjob>-node-0-0.<trainjob>",
    PET_MASTER_PORT: str(DEFAULT_MASTER_PORT),
}
PET_ENV_NAMES = tuple(PET_ENV_VALUES)
#: JobSet's pod label counting gang restarts (``jobset.sigs.k8s.io/restart-attempt``, JobSet v0.12).
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
#: JobSet's condition (v0.12 on) that is True from a gang restart until every Job of the new attempt is ready.
JOBSET_RESTARTING_CONDITION = "RestartingJobSet"
#: JobSet's pod label with the UID of the JobSet that made the pod (a JobSet built again has a new one).
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
#: Set from ``RESTART_ATTEMPT_LABEL`` through the downward API when the task runs ``ft_launcher``:
#: each gang attempt gets its own c10d rendezvous id.
RESTART_ATTEMPT_ENV = "NEMO_KUBEFLOW_RESTART_ATTEMPT"

#: Trainer publishes its version in this ConfigMap, which every authenticated user may read (the
#: ``kubeflow-trainer-public`` Role and RoleBinding of its manifests and Helm chart).
TRAINER_SYSTEM_NAMESPACE = "kubeflow-system"
TRAINER_PUBLIC_CONFIGMAP = "kubeflow-trainer-public"
TRAINER_VERSION_KEY = "kubeflow_trainer_version"
#: Trainer v2.3.0 and older clear a TrainJob's ``Failed`` condition on every reconcile and build its
#: JobSet again when the JobSet is gone, so a JobSet ``ttlSecondsAfterFinished`` reruns a failed job
#: forever (trainer#3779); #3891 made ``Failed`` terminal after v2.3, in v2.4.0.
TRAINER_FAILED_TERMINAL_SINCE = (2, 4, 0)
#: Trainer before v2.3 must be upgraded through v2.3 (v2.3.0 release notes); Kueue v0.17 and later
#: need a Trainer with ``runtimePatches`` (v2.2 and later; Kueue checks the CRD at startup).
TRAINER_UPGRADE_THROUGH = (2, 3, 0)
TRAINER_FOR_KUEUE_017 = (2, 2, 0)

# --- Kubernetes ------------------------------------------------------------------
#: The Kubernetes version whose strict schemas check core objects (kubeschema.py), both before a
#: submission (validation.py) and in the local cluster's API server. Fields added after it (e.g.
#: pod-level ``resources``) are unknown fields: an API server of this version would reject them.
KUBERNETES_VERSION = "1.31"

# --- Kubernetes limits ---------------------------------------------------------
#: The API server rejects a ConfigMap whose data plus binaryData exceed 1 MiB.
CONFIGMAP_MAX_BYTES = 1024 * 1024
#: RFC 1035 labels (TrainJob names) and RFC 1123 labels are at most 63 characters.
DNS_LABEL_MAX = 63
# TrainJob names have no fixed limit below 63: naming.jobset_name_budget derives it from the
# runtime's replicated jobs (JobSet's pod-name rule).
#: `spec.trainer.command` / `args` hold at most 128 items each (CRD maxItems).
TRAINER_ARGV_MAX_ITEMS = 128
#: `spec.trainer.env` holds at most 128 entries (CRD maxItems).
TRAINER_ENV_MAX_ITEMS = 128

# --- Our own labels and annotations ------------------------------------------
LABEL_PREFIX = "nemo-kubeflow.nvidia.com"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "nemo-kubeflow"
EXPERIMENT_LABEL = f"{LABEL_PREFIX}/experiment"
TASK_LABEL = f"{LABEL_PREFIX}/task"
TRAINJOB_LABEL = f"{LABEL_PREFIX}/trainjob"
RUNTIME_HASH_LABEL = f"{LABEL_PREFIX}/runtime-hash"
BUNDLE_HASH_ANNOTATION = f"{LABEL_PREFIX}/bundle-hash"
#: On a ConfigMap of code that every task shipping the same files shares (``"true"``): named by its content,
#: owned by each TrainJob that mounts it, so Kubernetes deletes it with the last of them (docs/packaging.md).
SHARED_CODE_LABEL = f"{LABEL_PREFIX}/shared-code"
#: A random id per submission, to recognise our own TrainJob when a lost create is retried.
SUBMISSION_ANNOTATION = f"{LABEL_PREFIX}/submission-id"
#: On the TrainJob: the nodes avoided and why, and a move in progress (JSON; repair/node_avoidance.py).
NODE_AVOIDANCE_ANNOTATION = f"{LABEL_PREFIX}/node-avoidance"
#: On the TrainJob: the executor's ``ttl_seconds_after_finished``; ``nemo-kubeflow gc --expired``
#: deletes the job that long after it finished (docs/reliability.md#finished-jobs).
TTL_ANNOTATION = f"{LABEL_PREFIX}/ttl-seconds-after-finished"
#: The annotation's value when the executor says ``avoid_failed_nodes=False``.
NODE_AVOIDANCE_OFF = "off"
#: Label and annotation keys the product sets and reads itself (gc, status, logs): a user's value
#: would replace ours silently. Exact keys, and every key under ``LABEL_PREFIX/``.
RESERVED_KEYS = (MANAGED_BY_LABEL,)
RESERVED_KEY_PREFIX = f"{LABEL_PREFIX}/"

# --- Kueue (kueue.x-k8s.io, pkg/controller/constants and the TrainJob integration) ------------
KUEUE_GROUP = "kueue.x-k8s.io"
#: The Kueue API versions nemo_kubeflow reads, preferred first. v1beta2 is served since Kueue v0.15
#: and stored since v0.16; v0.20 no longer serves v1beta1 (kueue#14558). The client asks the server
#: which it serves (``KubernetesCluster.served_version``) and uses the first of these it serves. The
#: fields read (Workload ownerReferences and conditions, LocalQueue ``spec.clusterQueue`` and
#: ``stopPolicy``, ClusterQueue conditions and ``stopPolicy``) are the same in both.
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
#: Kueue's visibility API (on-demand pending workloads, feature ``VisibilityOnDemand``; an aggregated API server
#: of Kueue's): a LocalQueue's ``pendingworkloads``, each with its place in the queue. Versions preferred first.
KUEUE_VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
KUEUE_VISIBILITY_VERSIONS = ("v1beta2", "v1beta1")
#: Kueue's first version serving v1beta2, and the one that serves nothing else.
KUEUE_V1BETA2_SINCE = "v0.15"
KUEUE_V1BETA1_UNSERVED_SINCE = "v0.20"
#: The queue of a namespace a job is sent to, and the object that stands for a job in it.
LOCALQUEUE_KIND = "LocalQueue"
WORKLOAD_KIND = "Workload"
#: The cluster-wide queue a LocalQueue sends its jobs to (its ``spec.clusterQueue``).
CLUSTERQUEUE_KIND = "ClusterQueue"
#: The LocalQueue of a job. Kueue's webhook suspends a TrainJob that carries it, creates a
#: Workload owned by it, and unsuspends it on admission.
QUEUE_LABEL = f"{KUEUE_GROUP}/queue-name"


def queue_name(trainjob: Optional[dict]) -> str:
    """The Kueue LocalQueue a TrainJob waits in ("" for none)."""
    return (((trainjob or {}).get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL, "")


#: The WorkloadPriorityClass of a job.
PRIORITY_CLASS_LABEL = f"{KUEUE_GROUP}/priority-class"

#: The values a TrainJob's ``spec.managedBy`` may take (the CRD's CEL rule): Trainer's own controller
#: (the default), or MultiKueue, which dispatches the job to another cluster.
TRAINJOB_CONTROLLER = f"{TRAINER_GROUP}/trainjob-controller"
TRAINJOB_MANAGED_BY_VALUES = (TRAINJOB_CONTROLLER, f"{KUEUE_GROUP}/multikueue")

# --- gang scheduling ---------------------------------------------------------------------------
#: ``pod_group_policy`` values; each but "none" is a key of the runtime's ``spec.podGroupPolicy``.
POD_GROUP_POLICIES = ("none", "coscheduling", "volcano")
#: ``schedulerName`` of the pods per gang policy when ``scheduler_name`` is unset: Trainer only
#: creates the PodGroup, the pods must go to the scheduler that reads it (Volcano's, or
#: scheduler-plugins installed as a second scheduler, the name its Helm chart gives it).
GANG_SCHEDULERS = {"coscheduling": "scheduler-plugins-scheduler", "volcano": "volcano"}

# --- timeouts of a distributed job ---------------------------------------------------------------
#: Timeouts a distributed job's launch script exports (``timeout_defaults``), so that a lost rank or a
#: stuck collective ends the job (and lets JobSet restart it) instead of hanging it. Each is read by
#: torch 2.x (ProcessGroupNCCL's environment, torchrun's ``PET_*``-backed flags).
TIMEOUT_DEFAULTS: dict[str, str] = {
    # A failed or timed-out NCCL collective aborts the communicators and ends the process
    # (3 = SkipCleanUp: no cleanup that could itself hang). torch's current default, pinned
    # against images and older torch versions that default otherwise.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    # A monitor thread kills the process when NCCL's watchdog thread itself is stuck...
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    # ...for this many seconds without a heartbeat (torch's default is 480).
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "600",
    # torchrun's --rdzv-conf: the static rendezvous (how Trainer wires torchrun) gives up when a node
    # has not joined after this many seconds (torch's default 600; nodes pulling a large image start late).
    "PET_RDZV_CONF": "timeout=1800",
}
#: Older spellings torch still reads: a value set under one of them is kept.
TIMEOUT_ALIASES = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "NCCL_ASYNC_ERROR_HANDLING"}

#: NeMo-Run writes inline scripts as /nemo_run/scripts/<name>.sh (nemo_run.config.RUNDIR_NAME).
NEMO_RUN_POD_DIR = "/nemo_run"

# Scheduler name registered with torchx and nemo_run. nemo_run's own is "kubeflow".
SCHEDULER_NAME = "kubeflow_trainer"

# --- pod fields the API server validates (k8s.io/kubernetes pkg/apis/core/validation) -------------
#: The fields of a toleration (core/v1 Toleration).
TOLERATION_FIELDS = ("key", "operator", "value", "effect", "tolerationSeconds")
#: Toleration operators (validateTolerations; "Equal" when unset).
TOLERATION_OPERATORS = ("Equal", "Exists")
#: Taint effects a toleration may name (unset: every effect).
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: Resource names without a domain prefix (hugepages-<size> aside); others are extended resources.
STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
#: The most bytes an object's annotations may hold, keys and values together (TotalAnnotationSizeLimitB).
ANNOTATIONS_MAX_BYTES = 256 * 1024

# --- the policy engines of a namespace (read by doctor): (kind, API group, version) ----------------
#: admissionregistration.k8s.io's kinds: ValidatingAdmissionPolicy (GA in Kubernetes 1.30) and its bindings,
#: and the admission webhooks (Kyverno, Gatekeeper and others register as these).
ADMISSION_GROUP = "admissionregistration.k8s.io"
ADMISSION_POLICY = ("ValidatingAdmissionPolicy", ADMISSION_GROUP, "v1")
ADMISSION_POLICY_BINDING = ("ValidatingAdmissionPolicyBinding", ADMISSION_GROUP, "v1")
VALIDATING_WEBHOOKS = ("ValidatingWebhookConfiguration", ADMISSION_GROUP, "v1")
MUTATING_WEBHOOKS = ("MutatingWebhookConfiguration", ADMISSION_GROUP, "v1")
