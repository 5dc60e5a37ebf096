"""The names and numbers the emulated components fix, each once, with where it comes from.

The local cluster stands in for Kubernetes, Kubeflow Trainer v2.3.0, JobSet v0.12.0 and Kueue: these
are their values, read from their sources (trainer pkg/constants, jobset api and pkg/webhooks,
kubernetes pkg/apis and apimachinery, kueue pkg/controller/constants), not the product's
(``nemo_kubeflow.constants``): the emulator grades the product, so it must not share its mistakes.
"""

from __future__ import annotations

# --- the Kubernetes the API server emulates ---------------------------------------------------------
#: The release ``GET /version`` reports and whose strict OpenAPI schemas (``kubernetes-validate``'s)
#: decode core objects: a field added after it is an unknown field here, as on that API server.
#: The release the real control plane of the `-m real` tests runs (test/controlplane/versions.py), so that
#: the emulator can be checked against it word for word.
KUBERNETES_VERSION = "1.36.3"
#: The kubelet version node agents report in ``status.nodeInfo``.
KUBELET_VERSION = KUBERNETES_VERSION

# --- Kubeflow Trainer (trainer.kubeflow.org, v2.3.0) -------------------------------------------------
TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
TRAINER_API_VERSION = f"{TRAINER_GROUP}/{TRAINER_VERSION}"
TRAINJOB_KIND = "TrainJob"
TRAINJOB_PLURAL = "trainjobs"
RUNTIME_KIND = "TrainingRuntime"
RUNTIME_PLURAL = "trainingruntimes"
CLUSTER_RUNTIME_KIND = "ClusterTrainingRuntime"
CLUSTER_RUNTIME_PLURAL = "clustertrainingruntimes"
#: The label that marks a replicated job's role (constants.LabelTrainJobAncestor) and the value of the
#: job that ``spec.trainer`` applies to (constants.AncestorTrainer).
ANCESTOR_LABEL = f"{TRAINER_GROUP}/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
#: The container of the trainer job that gets ``spec.trainer`` and the PET_* variables (constants.Node).
TRAINER_NODE = "node"
#: The TrainJob controller's name, ``spec.managedBy``'s default; the CRD's CEL rule also allows MultiKueue.
TRAINJOB_CONTROLLER = f"{TRAINER_GROUP}/trainjob-controller"
TRAINJOB_MANAGED_BY_VALUES = (TRAINJOB_CONTROLLER, "kueue.x-k8s.io/multikueue")
#: ``spec.trainer.command``/``args`` and ``env`` hold at most this many items (the CRD's maxItems).
TRAINER_ARGV_MAX_ITEMS = 128
TRAINER_ENV_MAX_ITEMS = 128
#: The torch plugin's variables (constants.TorchEnv*); its webhook refuses a TrainJob that sets one.
PET_NNODES = "PET_NNODES"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_NODE_RANK = "PET_NODE_RANK"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
PET_ENV_NAMES = (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT)
#: Where the dataset and model initializers write and the trainer reads (DatasetMountPath, ModelMountPath).
DATASET_PATH = "/workspace/dataset"
MODEL_PATH = "/workspace/model"

# --- JobSet (jobset.x-k8s.io, v0.12.0) ----------------------------------------------------------------
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
#: Labels JobSet puts on its Jobs and pods (api/jobset/v1alpha2: JobSetNameKey, ReplicatedJobNameKey,
#: the restart attempt and the JobSet's uid).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
#: The sample of the Job controller's random pod-name suffix the JobSet webhook appends (ValidateCreate).
POD_NAME_SAMPLE_SUFFIX = "-abcde"

# --- the Job controller (batch/v1) -----------------------------------------------------------------------
#: An Indexed Job's pods carry their index as a label and as an annotation of this name.
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_ANNOTATION = COMPLETION_INDEX_LABEL

# --- Kueue (kueue.x-k8s.io) -----------------------------------------------------------------------------
KUEUE_GROUP = "kueue.x-k8s.io"
#: The versions served by default, preferred first (Kueue v0.15 to v0.19: v0.20 serves only v1beta2,
#: kueue#14558), and the one objects are stored in (since v0.16); apiserver/versions.py converts.
KUEUE_SERVED_DEFAULT = ("v1beta2", "v1beta1")
KUEUE_STORAGE_VERSION = "v1beta2"
LOCALQUEUE_KIND = "LocalQueue"
WORKLOAD_KIND = "Workload"
#: A job's LocalQueue and WorkloadPriorityClass (pkg/controller/constants QueueLabel, WorkloadPriorityClassLabel).
QUEUE_LABEL = f"{KUEUE_GROUP}/queue-name"
PRIORITY_CLASS_LABEL = f"{KUEUE_GROUP}/priority-class"

# --- core Kubernetes ----------------------------------------------------------------------------------------
#: The well-known Node label with the node's name.
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: RFC 1035 and 1123 labels, label values and the name part of a qualified name (apimachinery).
DNS_LABEL_MAX = 63
#: RFC 1123 subdomains: most object names, key prefixes, ConfigMap keys (DNS1123SubdomainMaxLength).
DNS_SUBDOMAIN_MAX = 253
#: ConfigMap data plus binaryData, and Secret data (core validation's MaxSecretSize / ConfigMap limit).
CONFIGMAP_MAX_BYTES = 1024 * 1024
#: An object's annotations, keys and values together (TotalAnnotationSizeLimitB).
ANNOTATIONS_MAX_BYTES = 256 * 1024

# --- the local node (shared by the kubelet and the controllers that plan for its pods) ----------------------
#: Every pod and node of the local cluster has this address (the host's loopback).
POD_IP = "127.0.0.1"
#: CrashLoopBackOff starts at 10 s and doubles to 5 min on a real kubelet; scaled down here (the Trainer
#: controller's restart of a failed status-only pod waits the same).
BACKOFF_START, BACKOFF_MAX = 0.1, 1.0


def backoff_delay(start: float, maximum: float, attempt: int) -> float:
    """start doubled per attempt after the first, at most maximum; the exponent is bounded so that a pod
    restarting for hours (2 ** 1024 no longer converts to float) keeps its back-off."""
    return min(maximum, start * 2 ** min(max(attempt - 1, 0), 62))
