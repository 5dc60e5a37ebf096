"""The Trainer controller, with the JobSet and Job controllers it drives: TrainJobs become JobSets, Jobs and pods.

`build_jobset` is what Trainer v2.3 builds from a TrainJob and its runtime (runtimePatches,
numNodes, resourcesPerNode, the trainer overrides, the torch PET_* variables). JobSet's rules (its webhooks'
defaults and name checks, the Job per replica) live in jobset.py, the Job controller's (indexed pods,
backoffLimit, podFailurePolicy) in job.py. One reconcile loop applies all three, keyed by TrainJob: in the
local cluster a JobSet and its Jobs only ever exist under a TrainJob (clients cannot write them). It plays
JobSet (the JobSet object and its headless Service, dependsOn, failurePolicy restarts, success/failure) and
the Job controller, writes the JobSet's and the Jobs' status as those controllers do
(test/data/real-trainer/statuses.yaml) and the TrainJob status the way Trainer mirrors it from the JobSet.
The objects chain as on a cluster: TrainJob -> JobSet -> Jobs -> pods (and the Service), each owned by the
one before, so deleting the TrainJob collects everything.
"""

from __future__ import annotations

import copy
import functools
import heapq
import logging
import math
import queue
import re
import socket
import threading
import time
from typing import Optional

import yaml

from nemo_kubeflow_local import constants as C
from nemo_kubeflow_local.apiserver import admission, pod_admission
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import ApiError, FieldError, aggregate, invalid
from nemo_kubeflow_local.apiserver.core_validation import pod_spec_errors
from nemo_kubeflow_local.apiserver.patch import strategic_merge_patch
from nemo_kubeflow_local.apiserver.registry import random_suffix
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.constants import BACKOFF_MAX, BACKOFF_START, POD_IP, backoff_delay
from nemo_kubeflow_local.controllers.job import (
    DEFAULT_BACKOFF_LIMIT,
    JOB_NAME_LABEL,
    JOB_TRACKING_FINALIZER,
    JobState,
    build_pod,
    completed_indexes,
    label_priority,
    pod_failure_policy_match,
    set_job_condition,
    set_job_suspend,
)
from nemo_kubeflow_local.controllers.jobset import (
    JOBSET_UID_LABEL,
    JOBSET_WEBHOOK,
    JobSetState,
    build_job,
    default_jobset,
    jobset_pod_name_errors,
)
from nemo_kubeflow_local.controllers.objects import (
    condition,
    controller_ref,
    gone_or_going,
    is_true,
    owned_by,
    pod_ready,
    terminal,
)
from nemo_kubeflow_local.controllers.trainjob_status import StatusServer
from nemo_kubeflow_local.events import EventRecorder
from nemo_kubeflow_local.quantity import parse_quantity
from nemo_kubeflow_local.timeutil import now_rfc3339, parse, set_condition

logger = logging.getLogger(__name__)

SNAPSHOT_SUFFIX = "-runtime-snapshot"
#: How Trainer's and JobSet's controllers sign their events (events.k8s.io `reportingController`, as for real).
TRAINER_COMPONENT, JOBSET_COMPONENT = "trainer-trainjob-controller", "jobset"
#: The Job controller's back-off after the API server refused a pod (FailedCreate).
CREATE_BACKOFF_START_S, CREATE_BACKOFF_MAX_S = 1.0, 10.0
#: Where Trainer's PET_NODE_RANK reads the completion index from (the annotation) ...
COMPLETION_INDEX_FIELD = f"metadata.annotations['{C.COMPLETION_INDEX_ANNOTATION}']"
#: What Trainer's coscheduling and volcano plugins put on every pod (scheduler-plugins, Volcano).
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
#: Queued when a runtime changes: TrainJobs still waiting for theirs get another try.
_RUNTIMES_CHANGED = ("", "")


# --- building the JobSet spec (Trainer v2.3 runtime framework) -------------------------------------------


def _upsert(items: list[dict], new: list[dict], key: str = "name") -> None:
    """apply.UpsertEnvVars / UpsertPort: replace by key in place, append the rest."""
    for item in new:
        index = next((i for i, cur in enumerate(items) if cur.get(key) == item.get(key)), None)
        if index is None:
            items.append(copy.deepcopy(item))
        else:
            items[index] = copy.deepcopy(item)


def _pod_spec(rjob: dict) -> dict:
    return rjob["template"]["spec"]["template"].setdefault("spec", {})


def _container(pod_spec: dict, name: str, init: bool = True) -> Optional[dict]:
    bags = pod_spec.get("containers", []) + (pod_spec.get("initContainers", []) if init else [])
    return next((c for c in bags if c.get("name") == name), None)


def _ancestor(rjob: dict) -> Optional[str]:
    return ((rjob.get("template") or {}).get("metadata") or {}).get("labels", {}).get(C.ANCESTOR_LABEL)


def _num_gpu(resources: dict) -> int:
    for bag in ("requests", "limits"):
        for name, value in (resources.get(bag) or {}).items():
            if "gpu" in name.lower():
                return math.ceil(parse_quantity(value) or 0)
    return 0


def _num_cpu(resources: dict) -> int:
    request = parse_quantity((resources.get("requests") or {}).get("cpu"))
    if not request:
        return math.ceil(parse_quantity((resources.get("limits") or {}).get("cpu")) or 0)
    return math.ceil(request)


def build_jobset(trainjob: dict, runtime: dict, master_addr: str, master_port: int) -> dict:
    """The JobSet spec Trainer would apply for `trainjob` (PET_MASTER_* pointed at this host)."""
    spec = _runtime_jobset_spec(trainjob, runtime)
    tj_spec = trainjob["spec"]
    trainer = tj_spec.get("trainer")
    ml_policy = runtime["spec"].get("mlPolicy")
    node_resources: dict = {}
    trainer_count = None
    for rjob in spec["replicatedJobs"]:
        job_spec = rjob["template"].setdefault("spec", {})
        pod_spec = _pod_spec(rjob)
        ancestor = _ancestor(rjob)
        count = job_spec.get("parallelism", 1)
        node = _container(pod_spec, C.TRAINER_NODE, init=False)
        if ancestor == C.ANCESTOR_TRAINER:
            rjob["replicas"] = 1
            count = trainer_count = _trainer_nodes(count, trainer, ml_policy)
            if node is not None:
                node_resources = copy.deepcopy(node.get("resources") or {})
                _apply_trainer(node, trainer, ml_policy)
        elif ancestor in ("dataset-initializer", "model-initializer"):
            rjob["replicas"] = 1
            _apply_initializer(pod_spec, ancestor, tj_spec.get("initializer") or {})
        job_spec["parallelism"] = job_spec["completions"] = count
    torch = (ml_policy or {}).get("torch")
    if torch is not None:
        proc = trainer.get("numProcPerNode") if trainer else None
        resources = trainer.get("resourcesPerNode") if trainer and trainer.get("resourcesPerNode") else node_resources
        if proc is None:
            proc = "auto" if _num_gpu(resources) else max(1, _num_cpu(resources))
        env = _torch_env(trainer_count if trainer_count is not None else 1, proc, master_addr, master_port)
        _inject_torch_env(spec, torch, env, master_port, with_trainer=trainer is not None)
    _tie_to_pod_group(spec, runtime["spec"].get("podGroupPolicy") or {}, trainjob["metadata"]["name"])
    spec["suspend"] = bool(tj_spec.get("suspend"))
    return spec


def _runtime_jobset_spec(trainjob: dict, runtime: dict) -> dict:
    """The runtime's JobSet template with the TrainJob's runtimePatches applied, its replicated jobs in the
    runtime's order (new ones last)."""
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    order = {rjob["name"]: i for i, rjob in enumerate(spec.get("replicatedJobs") or [])}
    for patch in trainjob["spec"].get("runtimePatches") or []:
        patch_spec = (((patch.get("trainingRuntimeSpec") or {}).get("template")) or {}).get("spec")
        if patch_spec:
            spec = strategic_merge_patch(spec, patch_spec)
    spec["replicatedJobs"].sort(key=lambda rjob: order.get(rjob["name"], len(order)))
    return spec


def _trainer_nodes(count: int, trainer: Optional[dict], ml_policy: Optional[dict]) -> int:
    """The trainer's node count: the TrainJob's ``numNodes``, else the runtime's mlPolicy's, else the Job's
    parallelism."""
    if ml_policy is not None:
        count = ml_policy.get("numNodes", 1)
    if trainer and trainer.get("numNodes") is not None:
        count = trainer["numNodes"]
    return count


def _apply_trainer(node: dict, trainer: Optional[dict], ml_policy: Optional[dict]) -> None:
    """The TrainJob's ``trainer`` on the runtime's node container: resourcesPerNode (with an mlPolicy),
    image, command, args, env."""
    if not trainer:
        return
    if trainer.get("resourcesPerNode") and ml_policy is not None:
        merged = node.setdefault("resources", {})
        for bag in ("limits", "requests"):
            if trainer["resourcesPerNode"].get(bag):
                merged[bag] = {**(merged.get(bag) or {}), **trainer["resourcesPerNode"][bag]}
    for key in ("image", "command", "args"):
        if trainer.get(key) is not None:
            node[key] = copy.deepcopy(trainer[key])
    _upsert(node.setdefault("env", []), trainer.get("env") or [])


def _apply_initializer(pod_spec: dict, ancestor: str, initializer: dict) -> None:
    """The TrainJob's ``initializer.dataset`` or ``.model`` on its initializer container: STORAGE_URI, env,
    the secret's envFrom."""
    config = initializer.get(ancestor.split("-")[0]) or None
    container = _container(pod_spec, ancestor, init=False)
    if config is None or container is None:
        return
    env = container.setdefault("env", [])
    if config.get("storageUri") is not None:
        _upsert(env, [{"name": "STORAGE_URI", "value": config["storageUri"]}])
    _upsert(env, config.get("env") or [])
    if config.get("secretRef"):
        container.setdefault("envFrom", []).append({"secretRef": {"name": config["secretRef"]["name"]}})


def _torch_env(nnodes: int, proc: object, master_addr: str, master_port: int) -> list[dict]:
    """The PET_* variables of the torch plugin: node count, processes per node, node rank, master."""
    return [
        {"name": C.PET_NNODES, "value": str(nnodes)},
        {"name": C.PET_NPROC_PER_NODE, "value": str(proc)},
        {"name": C.PET_NODE_RANK, "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},
        {"name": C.PET_MASTER_ADDR, "value": master_addr},
        {"name": C.PET_MASTER_PORT, "value": str(master_port)},
    ]


def _inject_torch_env(spec: dict, torch: dict, env: list[dict], master_port: int, with_trainer: bool) -> None:
    """The torch plugin: ``env`` and the master port on the trainer's node container (when the TrainJob has a
    ``trainer``), ``env`` on the containers of ``torch.envInjection.targets``."""
    for rjob in spec["replicatedJobs"]:
        node = _container(_pod_spec(rjob), C.TRAINER_NODE, init=False)
        if _ancestor(rjob) == C.ANCESTOR_TRAINER and node is not None and with_trainer:
            _upsert(node.setdefault("env", []), env)
            _upsert(
                node.setdefault("ports", []), [{"containerPort": master_port, "protocol": "TCP"}], key="containerPort"
            )
    for target in ((torch.get("envInjection") or {}).get("targets")) or []:
        rjob = next((r for r in spec["replicatedJobs"] if r["name"] == target.get("jobName")), None)
        for name in target.get("containerNames") or []:
            container = _container(_pod_spec(rjob), name) if rjob else None
            if container is not None:
                _upsert(container.setdefault("env", []), env)


def _tie_to_pod_group(spec: dict, group: dict, name: str) -> None:
    """Gang scheduling: the coscheduling and volcano plugins tie every pod to the job's PodGroup (there is no
    PodGroup object and no gang scheduler here: pods are scheduled one by one as always)."""
    for rjob in spec["replicatedJobs"]:
        template = rjob["template"]["spec"]["template"]
        if "coscheduling" in group:
            template.setdefault("metadata", {}).setdefault("labels", {})[POD_GROUP_LABEL] = name
        if "volcano" in group:
            template.setdefault("metadata", {}).setdefault("annotations", {})[VOLCANO_GROUP_ANNOTATION] = name


# --- the JobSet webhooks (JobSet v0.12) -----------------------------------------------------------------


# --- JobSet / Job state ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((POD_IP, 0))
        return sock.getsockname()[1]


#: What JobSet's webhook lets change in the pod templates of a suspended JobSet (for Kueue): (part, key).
_MUTABLE_WHILE_SUSPENDED = (
    ("metadata", "labels"),
    ("metadata", "annotations"),
    ("spec", "nodeSelector"),
    ("spec", "tolerations"),
    ("spec", "schedulingGates"),
)


def _immutable_part(new: list, old: list) -> list:
    """``new`` replicatedJobs with what the webhook lets change taken from ``old`` (matched by name), empty
    values left out (Go compares structs: an empty map is no map); compare it with ``_pruned(old)``."""
    olds = {r.get("name"): r for r in old}
    munged = copy.deepcopy(new)
    for rjob in munged:
        before = olds.get(rjob.get("name"))
        if before is None:
            continue
        template = rjob.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
        old_template = ((before.get("template") or {}).get("spec") or {}).get("template") or {}
        for part, key in _MUTABLE_WHILE_SUSPENDED:
            template.setdefault(part, {})[key] = copy.deepcopy((old_template.get(part) or {}).get(key))
    return _pruned(munged)


def _pruned(value):
    """``value`` without None, empty maps and empty lists, at any depth."""
    if isinstance(value, dict):
        kept = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def _matching_rule(rules: list[dict], rjob: str, reason: str, message: str) -> Optional[dict]:
    """The first rule of JobSet's failurePolicy that a failed Job of replicated job ``rjob`` matches (its
    targetReplicatedJobs, onJobFailureReasons, onJobFailureMessagePatterns); None if none does."""
    for rule in rules:
        if rule.get("targetReplicatedJobs") and rjob not in rule["targetReplicatedJobs"]:
            continue
        if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
            continue
        patterns = rule.get("onJobFailureMessagePatterns") or []
        if patterns and not any(re.search(p, message) for p in patterns):
            continue
        return rule
    return None


class TrainerController:
    def __init__(self, store: Store, events: EventRecorder, status_server: Optional[StatusServer] = None):
        self.store, self.events = store, events
        #: The TrainJobStatus feature gate is on: its plugin's part and its status server.
        self.status_server = status_server
        self._queue: queue.Queue = queue.Queue()
        self._timers: list[tuple[float, tuple[str, str]]] = []
        self._states: dict[tuple[str, str], JobSetState] = {}
        self._waiting_for_runtime: set[tuple[str, str]] = set()
        #: Per TrainJob: (the copy the last reconcile saw, the one of the spec change before it).
        self._copies: dict[tuple[str, str], tuple[dict, Optional[dict]]] = {}
        #: TrainJobs whose JobSet, built again, is built from the older copy (``older_copy_next``).
        self._older_copy_next: set[tuple[str, str]] = set()
        #: TrainJobs whose JobSet or a Job the API server refused, and how many times in a row (the back-off)
        self._refused: dict[tuple[str, str], int] = {}
        self._thread = threading.Thread(target=self._loop, name="trainer-controller", daemon=True)
        self._stopped = threading.Event()
        store.add_listener(self._on_change)

    def start(self) -> None:
        for tj in self.store.list(R.TRAINJOBS)[0]:
            self._queue.put((tj["metadata"]["namespace"], tj["metadata"]["name"]))
        self._thread.start()

    def stop(self) -> None:
        self.store.remove_listener(self._on_change)
        self._stopped.set()
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(5.0)

    # -- the work queue --

    def _on_change(self, event: str, rt, obj: dict) -> None:
        meta = obj["metadata"]
        if rt is R.TRAINJOBS or (rt is R.JOBSETS and event == "DELETED"):  # the JobSet is named after its TrainJob
            self._queue.put((meta["namespace"], meta["name"]))
        elif rt is R.PODS and C.JOBSET_NAME_LABEL in (meta.get("labels") or {}):
            self._queue.put((meta["namespace"], meta["labels"][C.JOBSET_NAME_LABEL]))
        elif rt in (R.RUNTIMES, R.CLUSTER_RUNTIMES):
            self._queue.put(_RUNTIMES_CHANGED)

    def _after(self, seconds: float, key: tuple[str, str]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + max(0.0, seconds), key))

    def _loop(self) -> None:
        while not self._stopped.is_set():
            timeout = max(0.0, self._timers[0][0] - time.monotonic()) if self._timers else None
            keys = set()
            try:
                item = self._queue.get(timeout=timeout)
                while True:  # take everything queued: one reconcile per TrainJob per round
                    if item is None:
                        return
                    keys |= set(self._waiting_for_runtime) if item is _RUNTIMES_CHANGED else {item}
                    item = self._queue.get_nowait()
            except queue.Empty:
                pass
            while self._timers and self._timers[0][0] <= time.monotonic():
                keys.add(heapq.heappop(self._timers)[1])
            for key in sorted(keys):
                try:
                    self._reconcile(*key)
                except Exception:  # noqa: BLE001 - a controller keeps going; the error goes to the log
                    logger.exception("reconciling TrainJob %s/%s", *key)

    # -- reconcile --

    def _reconcile(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        tj = self.store.find(R.TRAINJOBS, namespace, name)
        if tj is None or tj["metadata"].get("deletionTimestamp"):
            self._states.pop(key, None)
            self._copies.pop(key, None)
            self._waiting_for_runtime.discard(key)
            return
        if tj["spec"].get("managedBy", C.TRAINJOB_CONTROLLER) != C.TRAINJOB_CONTROLLER:
            return
        current = self._current_state(key, tj)
        if current is None:
            return  # finished
        tj, state = current
        self._note_copy(key, tj)
        state, source = self._after_jobset_delete(key, tj, state)
        suspended = bool(tj["spec"].get("suspend"))
        if not self._apply(tj, source, state, suspended):
            self._write_status(tj, state)
            return
        self._suspend_jobset(tj, state, suspended)
        self._check_deadline(tj, state)
        if state.terminal is None and suspended:
            self._stop_suspended_pods(tj, state)
        elif state.terminal is None:
            self._sync(tj, state)
        self._write_status(tj, state)

    def _current_state(self, key: tuple[str, str], tj: dict) -> Optional[tuple[dict, JobSetState]]:
        """The TrainJob (read again if its Failed condition was cleared) and its JobSet's state, a new one for a
        new TrainJob; None for a finished TrainJob (its JobSet's TTL looked after)."""
        state = self._states.get(key)
        if state is None or state.trainjob_uid != tj["metadata"]["uid"]:
            state = self._states[key] = JobSetState(tj["metadata"]["uid"], _free_port())
        if (
            is_true(tj, "Failed")
            and state.spec is not None
            and not self._jobset_exists(tj, state)
            and (condition(tj, "Failed") or {}).get("reason") != "DeadlineExceeded"
        ):
            # Trainer v2.3.0 clears Failed at the top of every reconcile (removeFailedCondition, all but
            # DeadlineExceeded) and reads it back from the JobSet: with the JobSet gone (its TTL, or a
            # delete) the job looks unfinished and its JobSet is built again, restarts from 0, and the
            # job runs again (trainer#3779; #3891 made Failed terminal after v2.3). Complete stays.
            self._clear_failed(tj)
            state = self._states[key] = JobSetState(tj["metadata"]["uid"], state.master_port)
            tj = self.store.find(R.TRAINJOBS, *key) or tj
        elif is_true(tj, "Complete") or is_true(tj, "Failed"):
            self._expire_after_ttl(tj, state)
            return None
        return tj, state

    def _after_jobset_delete(self, key: tuple[str, str], tj: dict, state: JobSetState) -> tuple[JobSetState, dict]:
        """The JobSet's state and the TrainJob copy to build it from: a new state when someone else deleted the
        JobSet (node_avoidance.py does so) and Trainer builds it again, from the TrainJob as its cache has it
        (runtimePatches included; see older_copy_next); the new JobSet's restarts start at 0."""
        if state.spec is None or state.terminal is not None or self._jobset_exists(tj, state):
            return state, tj
        state = self._states[key] = JobSetState(tj["metadata"]["uid"], state.master_port)
        if key in self._older_copy_next:
            self._older_copy_next.discard(key)
            return state, self._copies[key][1] or tj
        return state, tj

    def _apply(self, tj: dict, source: dict, state: JobSetState, suspended: bool) -> bool:
        """Trainer builds the JobSet (from ``source``) once, and re-applies it only while it is suspended: whether
        the JobSet is there to act on (not when it cannot be built, or when the apply that resumes it is
        refused)."""
        if state.spec is None or (suspended and not any(job.created for job in state.jobs)):
            return self._build(source, state)
        return suspended or self._resume_applies(tj, state)

    def _stop_suspended_pods(self, tj: dict, state: JobSetState) -> None:
        """Suspending a Job deletes its running pods, which end Failed (the kubelet) but are no failure of the
        Job; their tracking finalizers are released once they ended."""
        jobs = {job.name: job for job in state.jobs}
        for pod in self._pods(tj, state):
            if not gone_or_going(pod):
                self._delete_pod(pod)
            job = jobs.get(pod["metadata"]["labels"].get(JOB_NAME_LABEL))
            if job is not None:
                job.suspended_pods.add(pod["metadata"]["uid"])
            if terminal(pod) and JOB_TRACKING_FINALIZER in (pod["metadata"].get("finalizers") or []):
                self._release(pod)

    def _note_copy(self, key: tuple[str, str], tj: dict) -> None:
        """Note ``tj`` as this reconcile sees it, keeping the copy of the spec change before (for
        ``older_copy_next``)."""
        current, _ = self._copies.get(key, (None, None))
        if current is None or current["metadata"].get("generation") != tj["metadata"].get("generation"):
            self._copies[key] = (copy.deepcopy(tj), current)

    def older_copy_next(self, namespace: str, name: str) -> None:
        """The next time the JobSet of TrainJob ``namespace/name`` is built again after a delete, build it
        from the TrainJob as it was before its last spec change, once: what Trainer does when its informer
        cache has the delete of the JobSet before that change (each resource is watched on a stream of its
        own)."""
        self._older_copy_next.add((namespace, name))
        self._queue.put((namespace, name))

    def _resume_applies(self, tj: dict, state: JobSetState) -> bool:
        """Trainer re-applies the whole JobSet while the JobSet is still suspended, ``suspend: false`` with
        it: whether JobSet's webhook lets that through (refused, the JobSet stays suspended)."""
        jobset = self.store.find(R.JOBSETS, tj["metadata"]["namespace"], tj["metadata"]["name"])
        if jobset is None or jobset["metadata"]["uid"] != state.jobset_uid or not jobset["spec"].get("suspend"):
            return True
        spec = self._jobset_spec(tj, state)
        return spec is not None and not self._refused_update(tj, jobset, spec)

    def _jobset_exists(self, tj: dict, state: JobSetState) -> bool:
        jobset = self.store.find(R.JOBSETS, tj["metadata"]["namespace"], tj["metadata"]["name"])
        return jobset is not None and jobset["metadata"]["uid"] == state.jobset_uid

    def _jobset_spec(self, tj: dict, state: JobSetState) -> Optional[dict]:
        """The JobSet spec Trainer builds from ``tj``; None (the event recorded) when it cannot."""
        runtime = self._runtime_snapshot(tj)
        if runtime is None:
            return None
        try:
            spec = default_jobset(build_jobset(tj, runtime, POD_IP, state.master_port))
        except (KeyError, TypeError, AttributeError, ApiError) as error:
            self._creation_failed(tj, f"building the JobSet: {error}")
            return None
        errors = jobset_pod_name_errors(tj["metadata"]["name"], spec)
        if errors:  # the JobSet webhook refuses it: the TrainJob stays, and never starts
            self._jobset_denied(tj, errors)
            return None
        if self.status_server is not None:
            try:
                self.status_server.enforce(
                    tj, spec, [r["name"] for r in spec["replicatedJobs"] if _ancestor(r) == C.ANCESTOR_TRAINER]
                )
            except ApiError as error:  # the namespace is going
                self._creation_failed(tj, f"building the TrainJobStatus components: {error}")
                return None
        return spec

    def _jobset_denied(self, tj: dict, errors: list[FieldError]) -> None:
        denial = invalid(R.JOBSETS, tj["metadata"]["name"], errors).message
        self._creation_failed(tj, f'admission webhook "{JOBSET_WEBHOOK}" denied the request: {denial}')

    def _refused_update(self, tj: dict, existing: dict, spec: dict) -> bool:
        """JobSet's webhook on Trainer's apply to an existing JobSet (suspended, or being suspended): its
        replicatedJobs are immutable but for the pod template's labels, annotations, nodeSelector,
        tolerations and schedulingGates. True (the denial recorded as Trainer's event) when ``spec`` changes
        more: the apply fails whole, its ``suspend`` too."""
        old = (existing.get("spec") or {}).get("replicatedJobs") or []
        if _immutable_part(spec.get("replicatedJobs") or [], old) == _pruned(old):
            return False
        self._jobset_denied(
            tj, [FieldError.invalid("spec.replicatedJobs", spec.get("replicatedJobs"), "field is immutable")]
        )
        return True

    def _build(self, tj: dict, state: JobSetState) -> bool:
        spec = self._jobset_spec(tj, state)
        if spec is None or not self._apply_jobset(tj, state, spec):
            return False
        for rjob in spec["replicatedJobs"]:
            job_name = f"{tj['metadata']['name']}-{rjob['name']}-0"
            policy = _pod_spec(rjob).get("restartPolicy", "OnFailure")
            if policy not in ("OnFailure", "Never"):  # Job validation; JobSet reports it, nothing more happens
                self.events.record(
                    self._jobset_ref(tj, state),
                    "Warning",
                    "JobCreationFailed",
                    f'Job.batch "{job_name}" is invalid: spec.template.spec.restartPolicy: Unsupported '
                    f'value: "{policy}": supported values: "OnFailure", "Never"',
                    JOBSET_COMPONENT,
                )
                return False
            errors = pod_spec_errors(_pod_spec(rjob), "spec.template.spec")
            if errors:  # the Job controller cannot create pods: it says so in an event, nothing more
                self.events.record(
                    self._job_ref(tj, job_name, ""),
                    "Warning",
                    "FailedCreate",
                    f'Error creating: Pod "{job_name}-0" is invalid: {aggregate(errors)}',
                    "job-controller",
                )
                return False
        state.spec = spec
        state.jobs = self._new_jobs(tj, spec)
        return True

    def _runtime_snapshot(self, tj: dict) -> Optional[dict]:
        """The runtime as first seen (ConfigMap `<trainjob>-runtime-snapshot`), taken now if missing."""
        namespace, name, uid = tj["metadata"]["namespace"], tj["metadata"]["name"], tj["metadata"]["uid"]
        snapshot = self.store.find(R.CONFIGMAPS, namespace, name + SNAPSHOT_SUFFIX)
        if snapshot is not None:
            owners = snapshot["metadata"].get("ownerReferences") or []
            if not any(o.get("uid") == uid and o.get("controller") for o in owners):
                self._creation_failed(
                    tj, "invalid runtime snapshot: a snapshot configmap exists but is owned by another object"
                )
                return None
            self._waiting_for_runtime.discard((namespace, name))
            return yaml.safe_load(snapshot["data"]["runtime"])
        runtime, why = admission.resolve_runtime(self.store, tj)
        if runtime is None:
            self._waiting_for_runtime.add((namespace, name))
            self._creation_failed(tj, why)
            return None
        self._waiting_for_runtime.discard((namespace, name))
        try:
            self.store.create(
                R.CONFIGMAPS,
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": name + SNAPSHOT_SUFFIX,
                        "namespace": namespace,
                        "ownerReferences": [self._owner_ref(tj)],
                    },
                    "data": {"runtime": yaml.safe_dump(runtime, sort_keys=False)},
                },
            )
        except ApiError as error:  # someone else's ConfigMap by that name, or the namespace is going
            self._creation_failed(tj, f"creating runtime snapshot: {error}")
            return None
        return runtime

    def _creation_failed(self, tj: dict, error: str) -> None:
        self.events.record(
            tj,
            "Warning",
            "TrainJobResourcesCreationFailed",
            f"TrainJob resources reconciliation failed: {error}"[:1024],
            TRAINER_COMPONENT,
        )

    # -- the JobSet, its Service and the Jobs as objects --

    def _apply_jobset(self, tj: dict, state: JobSetState, spec: dict) -> bool:
        """Create the JobSet (or, rebuilt while suspended, update its spec) and its headless Service."""
        namespace, name = tj["metadata"]["namespace"], tj["metadata"]["name"]
        existing = self.store.find(R.JOBSETS, namespace, name)
        if existing is not None and not owned_by(existing, tj["metadata"]["uid"]):
            self._creation_failed(
                tj, f'jobsets.jobset.x-k8s.io "{name}" already exists and is not owned by this TrainJob'
            )
            return False
        if existing is None:
            if state.spec is not None:
                # This state's JobSet was deleted since the reconcile looked (node avoidance deletes it): not
                # created again under its old uid with its old restarts; the delete's reconcile builds a new one.
                return False
            jobset = {
                "apiVersion": C.JOBSET_API_VERSION,
                "kind": "JobSet",
                "metadata": {"name": name, "namespace": namespace, "ownerReferences": [self._owner_ref(tj)]},
                "spec": spec,
            }
            state.created_suspended = bool(spec.get("suspend"))
            try:
                existing = pod_admission.create_counted(self.store, R.JOBSETS, jobset, uid=state.jobset_uid)
            except ApiError as error:  # a quota on JobSets (Trainer says the server's words and tries again)
                self._creation_failed(tj, error.message if error.code == 403 else f"creating the JobSet: {error}")
                if error.code == 403:
                    self._retry_refused((namespace, name))
                return False
            self._refused.pop((namespace, name), None)
        else:
            if self._refused_update(tj, existing, spec):
                return False
            self.store.mutate(R.JOBSETS, namespace, name, lambda js: {**js, "spec": spec})
        state.jobset_uid = existing["metadata"]["uid"]
        if (spec.get("network") or {}).get("enableDNSHostnames"):
            self._create_service(existing, spec)
        return True

    def _create_service(self, jobset: dict, spec: dict) -> None:
        meta = jobset["metadata"]
        name = spec["network"].get("subdomain") or meta["name"]
        if self.store.find(R.SERVICES, meta["namespace"], name) is not None:
            return
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": meta["namespace"], "ownerReferences": [controller_ref(jobset)]},
            "spec": {
                "clusterIP": "None",
                "clusterIPs": ["None"],
                "internalTrafficPolicy": "Cluster",
                "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack",
                "publishNotReadyAddresses": bool(spec["network"].get("publishNotReadyAddresses")),
                "selector": {C.JOBSET_NAME_LABEL: meta["name"]},
                "sessionAffinity": "None",
                "type": "ClusterIP",
            },
            "status": {"loadBalancer": {}},
        }
        try:
            self.store.create(R.SERVICES, service)
        except ApiError as error:
            logger.warning("creating service %s: %s", name, error)

    def _suspend_jobset(self, tj: dict, state: JobSetState, suspended: bool) -> None:
        def change(jobset: dict) -> Optional[dict]:
            if jobset["metadata"]["uid"] != state.jobset_uid or jobset["spec"].get("suspend") == suspended:
                return None
            jobset["spec"]["suspend"] = suspended
            return jobset

        self.store.mutate(R.JOBSETS, tj["metadata"]["namespace"], tj["metadata"]["name"], change)
        for job in state.jobs:
            if job.obj is not None:
                self.store.mutate(
                    R.JOBS,
                    tj["metadata"]["namespace"],
                    job.name,
                    functools.partial(set_job_suspend, uid=job.uid, suspended=suspended),
                )

    def _create_job(self, tj: dict, state: JobSetState, job: JobState) -> bool:
        """The JobSet controller creates `job` (the first time its pods may start)."""
        jobset = self.store.find(R.JOBSETS, tj["metadata"]["namespace"], tj["metadata"]["name"])
        if jobset is None or jobset["metadata"]["uid"] != state.jobset_uid:
            return False  # going with its TrainJob
        spec = state.built
        rjob = next(r for r in spec["replicatedJobs"] if r["name"] == job.rjob)
        waits = (
            bool(rjob.get("dependsOn"))
            or (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
            and spec["replicatedJobs"].index(rjob) > 0
        )
        job.resumed = state.created_suspended and state.restarts == 0 and not waits
        job.start_time = now_rfc3339()
        try:
            job.obj = pod_admission.create_counted(self.store, R.JOBS, build_job(jobset, state, job), uid=job.uid)
        except ApiError as error:  # a quota on Jobs: JobSet says so on the JobSet and tries again
            self.events.record(
                self._jobset_ref(tj, state),
                "Warning",
                "JobCreationFailed",
                f'job "{job.name}" creation failed with error: {error.message}',
                JOBSET_COMPONENT,
            )
            if error.code == 403:
                self._retry_refused((tj["metadata"]["namespace"], tj["metadata"]["name"]))
            return False
        self._refused.pop((tj["metadata"]["namespace"], tj["metadata"]["name"]), None)
        return True

    def _retry_refused(self, key: tuple[str, str]) -> None:
        """Try a refused JobSet or Job again after a back-off (1 s doubling, at most 10 s)."""
        self._refused[key] = self._refused.get(key, 0) + 1
        self._after(backoff_delay(CREATE_BACKOFF_START_S, CREATE_BACKOFF_MAX_S, self._refused[key]), key)

    def _delete_jobs(self, tj: dict, jobs: list[JobState]) -> None:
        """Delete Job objects; the garbage collector takes their pods."""
        for job in jobs:
            if job.obj is not None:
                self.store.remove(R.JOBS, tj["metadata"]["namespace"], job.name, job.uid)

    def _new_jobs(self, tj: dict, spec: dict) -> list[JobState]:
        jobs = []
        for rjob in spec["replicatedJobs"]:
            job_spec = rjob["template"]["spec"]
            for index in range(rjob.get("replicas", 1)):
                jobs.append(
                    JobState(
                        name=f"{tj['metadata']['name']}-{rjob['name']}-{index}",
                        rjob=rjob["name"],
                        index=index,
                        completions=job_spec.get("completions", 1),
                        backoff_limit=job_spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT),
                    )
                )
        return jobs

    def _pods(self, tj: dict, state: JobSetState) -> list[dict]:
        """The pods of this TrainJob's JobSet (all its Jobs, every restart attempt), as stored: read only."""
        name = tj["metadata"]["name"]
        return self.store.stored_list(
            R.PODS,
            tj["metadata"]["namespace"],
            lambda p: (
                (p["metadata"].get("labels") or {}).get(C.JOBSET_NAME_LABEL) == name
                and p["metadata"]["labels"].get(JOBSET_UID_LABEL) == state.jobset_uid
            ),
        )[0]

    def _release(self, pod: dict) -> None:
        """The Job controller has counted a finished pod: its tracking finalizer goes."""

        def change(obj: dict) -> Optional[dict]:
            finalizers = obj["metadata"].get("finalizers") or []
            if obj["metadata"]["uid"] != pod["metadata"]["uid"] or JOB_TRACKING_FINALIZER not in finalizers:
                return None
            obj["metadata"]["finalizers"] = [f for f in finalizers if f != JOB_TRACKING_FINALIZER]
            if not obj["metadata"]["finalizers"]:
                del obj["metadata"]["finalizers"]
            return obj

        self.store.mutate(R.PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], change)

    def _delete_pod(self, pod: dict) -> None:
        try:
            self.store.delete(R.PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        except ApiError:
            pass  # already gone

    # -- JobSet + Job --

    def _sync(self, tj: dict, state: JobSetState) -> None:
        pods = self._pods(tj, state)
        attempt = str(state.restarts)
        stale = [p for p in pods if p["metadata"]["labels"].get(C.RESTART_ATTEMPT_LABEL) != attempt]
        if stale:  # wait until the previous attempt is gone (processes share ports across attempts)
            for pod in stale:
                if not pod["metadata"].get("deletionTimestamp"):
                    self._delete_pod(pod)
            return
        key = (tj["metadata"]["namespace"], tj["metadata"]["name"])
        now = time.monotonic()
        for job in state.jobs:
            job_pods = [p for p in pods if p["metadata"]["labels"].get(JOB_NAME_LABEL) == job.name]
            self._observe(tj, state, job, job_pods)
            if job.finished or job.stopping or not self._may_start(state, job):
                continue
            if job.obj is None and not self._create_job(tj, state, job):
                return
            job.created = True
            busy = {int(p["metadata"]["labels"][C.COMPLETION_INDEX_LABEL]) for p in job_pods if not gone_or_going(p)}
            for index in range(job.completions):
                if index in job.succeeded or index in busy:
                    continue
                if now < job.retry_at:
                    self._after(job.retry_at - now, key)
                    break
                if not self._create_pod(tj, state, job, index):
                    return  # the TrainJob is gone: nothing more to create
                if job.refused_creates:
                    break  # refused: the next try after the back-off
        failed = sorted((j for j in state.jobs if j.failure), key=lambda j: j.failed_at)
        if failed:
            self._apply_failure_policy(tj, state, failed[0])
        elif self._succeeded(state):
            self._finish(tj, state, "Complete", "AllJobsCompleted", "jobset completed successfully")

    def _observe(self, tj: dict, state: JobSetState, job: JobState, pods: list[dict]) -> None:
        """Job controller bookkeeping: succeeded indexes, failures against backoffLimit."""
        restarts, failed_by_policy = self._count_pods(tj, state, job, pods)
        active = [p for p in pods if not gone_or_going(p)]
        job.active = len(active)
        job.terminating = sum(1 for p in pods if p["metadata"].get("deletionTimestamp") and not terminal(p))
        job.ready_pods = len([p for p in active if pod_ready(p)])
        job.ready = job.ready_pods + len(job.succeeded) >= job.completions
        if failed_by_policy:
            self._stop_failed_job(job, active)
        if job.stopping and not job.terminating:
            job.failure = job.failure_target  # every pod ended: the terminal condition
        if job.finished or job.stopping:
            return
        on_failure = bool(pods) and pods[0]["spec"].get("restartPolicy") == "OnFailure"
        past_on_failure = on_failure and (restarts > 0 if job.backoff_limit == 0 else restarts >= job.backoff_limit)
        if len(job.failed_pods) > job.backoff_limit or past_on_failure:
            job.failure_target = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
            job.failed_at = time.monotonic()
            self.events.record(
                self._job_ref(tj, job.name, job.uid),
                "Warning",
                "BackoffLimitExceeded",
                job.failure_target[1],
                "job-controller",
            )
            self._stop_failed_job(job, active)
        elif len(job.succeeded) >= job.completions:
            job.complete = True
            job.completion_time = now_rfc3339()
            self.events.record(
                self._job_ref(tj, job.name, job.uid), "Normal", "Completed", "Job completed", "job-controller"
            )

    def _count_pods(self, tj: dict, state: JobSetState, job: JobState, pods: list[dict]) -> tuple[int, bool]:
        """The Job's pods counted: succeeded indexes, newly failed pods (with their back-off and the
        podFailurePolicy), ended pods' tracking finalizers released. Returns the running pods' container
        restarts, and whether the podFailurePolicy failed the Job."""
        restarts, failed_by_policy = 0, False
        for pod in pods:
            status = pod.get("status") or {}
            index = int(pod["metadata"]["labels"][C.COMPLETION_INDEX_LABEL])
            if terminal(pod) and JOB_TRACKING_FINALIZER in (pod["metadata"].get("finalizers") or []):
                self._release(pod)
            if status.get("phase") == "Succeeded":
                job.succeeded.add(index)
            elif status.get("phase") == "Failed" and pod["metadata"]["uid"] not in (
                job.failed_pods | job.suspended_pods | job.failed_on_finish
            ):
                job.failed_pods.add(pod["metadata"]["uid"])
                job.retry_at = time.monotonic() + backoff_delay(BACKOFF_START, BACKOFF_MAX, len(job.failed_pods))
                failed_by_policy |= self._apply_pod_failure_policy(tj, state, job, pod)
            elif status.get("phase") in ("Pending", "Running"):
                restarts += sum(
                    s.get("restartCount", 0)
                    for s in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or [])
                )
        return restarts, failed_by_policy

    def _stop_failed_job(self, job: JobState, active: list[dict]) -> None:
        """A failing Job's running pods are deleted (the real Job controller counts them as failed too); it
        fails (``failure``) once none is left terminating: at once when there was none."""
        job.failed_on_finish = {p["metadata"]["uid"] for p in active}
        job.terminating += len(active)
        job.active, job.ready_pods, job.ready = 0, 0, False
        for pod in active:
            self._delete_pod(pod)
        if not job.terminating:
            job.failure = job.failure_target

    def _apply_pod_failure_policy(self, tj: dict, state: JobSetState, job: JobState, pod: dict) -> bool:
        """The Job's ``podFailurePolicy`` for one newly failed pod: FailJob fails the Job at once
        (reason ``PodFailurePolicy``; True), Ignore does not count the failure, Count (or no match) counts it."""
        rjob = next(r for r in state.built["replicatedJobs"] if r["name"] == job.rjob)
        matched = pod_failure_policy_match(rjob["template"]["spec"], pod)
        if matched is None or job.failure_target is not None:
            return False
        action, message = matched
        if action == "Ignore":
            job.failed_pods.discard(pod["metadata"]["uid"])
        elif action in ("FailJob", "FailIndex"):
            job.failure_target = ("PodFailurePolicy", message)
            job.failed_at = time.monotonic()
            self.events.record(
                self._job_ref(tj, job.name, job.uid), "Warning", "PodFailurePolicy", message, "job-controller"
            )
            return True
        return False

    def _may_start(self, state: JobSetState, job: JobState) -> bool:
        """JobSet creates a replicated job's Jobs once its dependsOn (or InOrder startup) is met."""
        rjobs = state.built["replicatedJobs"]
        rjob = next(r for r in rjobs if r["name"] == job.rjob)
        needs = [(d["name"], d.get("status", "Complete")) for d in rjob.get("dependsOn") or []]
        if (state.built.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder":
            position = rjobs.index(rjob)
            needs += [(r["name"], "Ready") for r in rjobs[:position]]
        for dep_name, wanted in needs:
            deps = [j for j in state.jobs if j.rjob == dep_name]
            if not all(j.complete if wanted == "Complete" else (j.ready or j.complete) for j in deps):
                return False
        return True

    def _succeeded(self, state: JobSetState) -> bool:
        policy = state.built.get("successPolicy") or {}
        targets = set(policy.get("targetReplicatedJobs") or [r["name"] for r in state.built["replicatedJobs"]])
        jobs = [j for j in state.jobs if j.rjob in targets]
        if policy.get("operator") == "Any":
            return any(j.complete for j in jobs)
        return bool(jobs) and all(j.complete for j in jobs)

    def _apply_failure_policy(self, tj: dict, state: JobSetState, job: JobState) -> None:
        if job.failure is None:
            return  # only a failed Job comes here
        first = f" (first failed job: {job.name})"
        policy = state.built.get("failurePolicy")
        if policy is None:
            self._finish(tj, state, "Failed", "FailedJobs", "jobset failed due to one or more job failures" + first)
            return
        matched = _matching_rule(policy.get("rules") or [], job.rjob, *job.failure)
        action = matched.get("action", "RestartJobSet") if matched else "RestartJobSet"
        if action == "FailJobSet":
            self._finish(
                tj,
                state,
                "Failed",
                "FailJobSetFailurePolicyAction",
                "applying FailJobSet failure policy action" + first,
            )
            return
        counts = "IgnoreMaxRestarts" not in action
        if counts and state.restarts_towards_max >= policy.get("maxRestarts", 0):
            self._finish(
                tj,
                state,
                "Failed",
                "ReachedMaxRestarts",
                "jobset failed due to reaching max number of restarts" + first,
            )
            return
        state.restarts += 1
        state.restarts_towards_max += int(counts)
        message = (
            "applying RestartJobSet failure policy action"
            if counts
            else "applying RestartJobSetAndIgnoreMaxRestarts failure policy action"
        ) + first
        state.restarting = ("True", f"FailurePolicy_{matched['name']}" if matched else "DefaultFailurePolicy", message)
        self.events.record(
            self._jobset_ref(tj, state),
            "Warning",
            "RestartJobSetFailurePolicyAction",
            "applying RestartJobSet failure policy action" + first,
            JOBSET_COMPONENT,
        )
        self._delete_jobs(tj, state.jobs)  # their pods go with them
        state.jobs = self._new_jobs(tj, state.built)
        for pod in self._pods(tj, state):
            if not pod["metadata"].get("deletionTimestamp"):
                self._delete_pod(pod)

    def _finish(self, tj: dict, state: JobSetState, type_: str, reason: str, message: str) -> None:
        state.terminal = (type_, reason, message)
        self.events.record(
            self._jobset_ref(tj, state),
            "Normal" if type_ == "Complete" else "Warning",
            reason,
            message,
            JOBSET_COMPONENT,
        )
        self._delete_jobs(tj, [job for job in state.jobs if not job.finished])  # a finished JobSet deletes its
        for pod in self._pods(tj, state):  # active Jobs, and with them their pods
            if not gone_or_going(pod):
                self._delete_pod(pod)

    def _check_deadline(self, tj: dict, state: JobSetState) -> None:
        seconds = tj["spec"].get("activeDeadlineSeconds")
        if not seconds or tj["spec"].get("suspend") or state.terminal:
            return
        resumed = condition(tj, "Suspended")
        start = parse(
            resumed["lastTransitionTime"]
            if resumed and resumed["status"] == "False"
            else tj["metadata"]["creationTimestamp"]
        )
        left = start.timestamp() + seconds - time.time()
        if left > 0:
            self._after(left, (tj["metadata"]["namespace"], tj["metadata"]["name"]))
            return
        state.terminal = ("Failed", "DeadlineExceeded", "TrainJob exceeded its active deadline")
        self.store.remove(R.JOBSETS, tj["metadata"]["namespace"], tj["metadata"]["name"], state.jobset_uid)
        for pod in self._pods(tj, state):  # Trainer deletes the whole JobSet (Jobs, pods, Service)
            if not pod["metadata"].get("deletionTimestamp"):
                self._delete_pod(pod)

    def _clear_failed(self, tj: dict) -> None:
        def change(obj: dict) -> Optional[dict]:
            conditions = (obj.get("status") or {}).get("conditions") or []
            kept = [c for c in conditions if c.get("type") != "Failed"]
            if obj["metadata"]["uid"] != tj["metadata"]["uid"] or len(kept) == len(conditions):
                return None
            obj["status"]["conditions"] = kept
            return obj

        self.store.mutate(R.TRAINJOBS, tj["metadata"]["namespace"], tj["metadata"]["name"], change)

    def _expire_after_ttl(self, tj: dict, state: JobSetState) -> None:
        """JobSet's ``ttlSecondsAfterFinished``: that long after it finished, the JobSet is deleted and
        the garbage collector takes its Jobs, pods and Service. For a Complete TrainJob, Trainer builds
        no new JobSet and keeps its conditions and last jobsStatus; a Failed one is built again (the
        reconcile above: Trainer v2.3.0's loop)."""
        ttl = (state.spec or {}).get("ttlSecondsAfterFinished")
        finished = condition(tj, "Complete") if is_true(tj, "Complete") else condition(tj, "Failed")
        if ttl is None or finished is None:
            return
        namespace, name = tj["metadata"]["namespace"], tj["metadata"]["name"]
        left = parse(finished["lastTransitionTime"]).timestamp() + ttl - time.time()
        if left > 0:
            self._after(left, (namespace, name))
            return
        self.store.remove(R.JOBSETS, namespace, name, state.jobset_uid)
        for pod in self._pods(tj, state):  # pods still running their grace period go by their own delete
            if not pod["metadata"].get("deletionTimestamp"):
                self._delete_pod(pod)

    # -- status --

    def _write_status(self, tj: dict, state: JobSetState) -> None:
        suspended = bool(tj["spec"].get("suspend"))

        def change(obj: dict) -> Optional[dict]:
            if obj["metadata"]["uid"] != state.trainjob_uid:
                return None
            status = obj.setdefault("status", {})
            conditions = status.setdefault("conditions", [])
            if suspended:
                set_condition(conditions, "Suspended", "True", "Suspended", "TrainJob is suspended")
            elif is_true(obj, "Suspended"):
                set_condition(conditions, "Suspended", "False", "Resumed", "TrainJob is resumed")
            if state.terminal:
                type_, reason, message = state.terminal
                set_condition(conditions, type_, "True", reason, message)
            # After a deadline Trainer deletes the JobSet, so the last jobsStatus stays.
            if state.spec is not None and (state.terminal is None or state.terminal[1] != "DeadlineExceeded"):
                status["jobsStatus"] = self._jobs_status(state, suspended)
            if not conditions:
                del status["conditions"]
            return obj

        self.store.mutate(R.TRAINJOBS, tj["metadata"]["namespace"], tj["metadata"]["name"], change)
        if state.spec is not None:
            self._write_jobset_status(tj, state, suspended)
            for job in state.jobs:
                if job.obj is not None:
                    self._write_job_status(tj, job)

    def _write_jobset_status(self, tj: dict, state: JobSetState, suspended: bool) -> None:
        """The JobSet controller's status: conditions, restarts, replicatedJobsStatus, terminalState."""

        def fill(jobset: dict, status: dict, conditions: list) -> None:
            if suspended:
                set_condition(conditions, "Suspended", "True", "SuspendedJobs", "jobset is suspended")
            elif is_true(jobset, "Suspended"):
                set_condition(conditions, "Suspended", "False", "ResumeJobs", "jobset is resumed")
            if state.restarting is not None:
                if state.terminal is not None:
                    state.restarting = (
                        ("False", "JobSetCompleted", "jobset completed successfully")
                        if state.terminal[0] == "Complete"
                        else ("False", "JobSetFailed", "jobset failed")
                    )
                elif suspended:
                    state.restarting = ("False", "JobSetSuspended", "jobset is suspended")
                elif state.restarting[0] == "True" and state.jobs and all(j.ready or j.complete for j in state.jobs):
                    state.restarting = ("False", "JobsReady", "all jobs are ready")
                set_condition(conditions, "RestartingJobSet", *state.restarting)
            if state.terminal is not None:
                type_, reason, message = state.terminal
                set_condition(conditions, "Completed" if type_ == "Complete" else type_, "True", reason, message)
                status["terminalState"] = "Completed" if type_ == "Complete" else type_
            status["replicatedJobsStatus"] = self._jobs_status(state, suspended)
            status["restarts"] = state.restarts
            if state.restarts_towards_max:
                status["restartsCountTowardsMax"] = state.restarts_towards_max

        self._fill_status(R.JOBSETS, tj["metadata"]["namespace"], tj["metadata"]["name"], state.jobset_uid, fill)

    def _write_job_status(self, tj: dict, job: JobState) -> None:
        """The Job controller's status of an Indexed Job: conditions, counts, completedIndexes, times."""

        def fill(obj: dict, status: dict, conditions: list) -> None:
            if obj["spec"].get("suspend"):
                set_job_condition(conditions, "Suspended", "True", "JobSuspended", "Job suspended")
            elif job.resumed or any(c["type"] == "Suspended" for c in conditions):
                set_job_condition(conditions, "Suspended", "False", "JobResumed", "Job resumed")
            if job.complete:
                for type_ in ("SuccessCriteriaMet", "Complete"):
                    set_job_condition(
                        conditions, type_, "True", "CompletionsReached", "Reached expected number of succeeded pods"
                    )
                status["completionTime"] = job.completion_time
            elif job.failure_target is not None:
                # Failed only once none of its pods is terminating (``_observe``): FailureTarget alone until then.
                for type_ in ("FailureTarget", "Failed") if job.failure is not None else ("FailureTarget",):
                    set_job_condition(conditions, type_, "True", *job.failure_target)
            if job.start_time and not obj["spec"].get("suspend"):
                status["startTime"] = job.start_time
            counts = {
                "active": 0 if job.finished else job.active,
                "succeeded": len(job.succeeded),
                "failed": len(job.failed_pods | job.failed_on_finish),
            }
            for key, value in counts.items():
                if value:
                    status[key] = value
                else:
                    status.pop(key, None)
            status["terminating"] = job.terminating
            status["ready"] = 0 if job.finished else job.ready_pods
            if job.succeeded:
                status["completedIndexes"] = completed_indexes(job.succeeded)
            status["uncountedTerminatedPods"] = {}

        self._fill_status(R.JOBS, tj["metadata"]["namespace"], job.name, job.uid, fill)

    def _fill_status(self, rt: ResourceType, namespace: str, name: str, uid: str, fill) -> None:
        """Let `fill(obj, status, conditions)` update the status of object `uid`; store it only if it changed."""

        def change(obj: dict) -> Optional[dict]:
            if obj["metadata"]["uid"] != uid:
                return None
            before = copy.deepcopy(obj.get("status"))
            status = obj.setdefault("status", {})
            conditions = status.setdefault("conditions", [])
            fill(obj, status, conditions)
            if not conditions:
                del status["conditions"]
            return None if status == before else obj

        self.store.mutate(rt, namespace, name, change)

    def _jobs_status(self, state: JobSetState, suspended: bool) -> list[dict]:
        result = []
        for rjob in (state.spec or {}).get("replicatedJobs", []):
            jobs = [j for j in state.jobs if j.rjob == rjob["name"] and (j.created or suspended)]
            live = [j for j in jobs if not j.finished]
            result.append(
                {
                    "name": rjob["name"],
                    "ready": sum(1 for j in live if j.ready and not suspended),
                    "succeeded": sum(1 for j in jobs if j.complete),
                    "failed": sum(1 for j in jobs if j.failure),
                    "active": sum(1 for j in live if j.active and not suspended),
                    "suspended": len(live) if suspended else 0,
                }
            )
        return result

    # -- pods --

    def _owner_ref(self, tj: dict) -> dict:
        return {
            "apiVersion": C.TRAINER_API_VERSION,
            "kind": C.TRAINJOB_KIND,
            "name": tj["metadata"]["name"],
            "uid": tj["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _job_ref(self, tj: dict, job_name: str, uid: str) -> dict:
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": job_name, "namespace": tj["metadata"]["namespace"], "uid": uid},
        }

    def _jobset_ref(self, tj: dict, state: JobSetState) -> dict:
        return {
            "apiVersion": C.JOBSET_API_VERSION,
            "kind": "JobSet",
            "metadata": {
                "name": tj["metadata"]["name"],
                "namespace": tj["metadata"]["namespace"],
                "uid": state.jobset_uid,
            },
        }

    def _create_pod(self, tj: dict, state: JobSetState, job: JobState, index: int) -> bool:
        """Create the pod for `index`; False when the TrainJob or the Job went since they were read."""
        if job.obj is None:  # _sync creates the Job first
            raise RuntimeError(f"Job {job.name} is not created")
        pod = build_pod(job.obj, index)
        namespace, name, uid = tj["metadata"]["namespace"], tj["metadata"]["name"], tj["metadata"]["uid"]
        # Checked and created under the store lock: the TrainJob and the Job cannot go in between. (A
        # pod created after they went would be garbage-collected at once; this spares starting it.)
        with self.store.lock:
            current = self.store.find(R.TRAINJOBS, namespace, name)
            if current is None or current["metadata"]["uid"] != uid or current["metadata"].get("deletionTimestamp"):
                return False
            owner = self.store.find(R.JOBS, namespace, job.name)
            if owner is None or owner["metadata"]["uid"] != job.uid:
                return False
            refusal: Optional[ApiError] = None
            try:
                created, _ = pod_admission.create_pod(self.store, pod, random_suffix, mutated=label_priority)
                job.refused_creates = 0
            except ApiError as error:
                refusal = error
        if refusal is not None:
            # The Job controller says so on the Job and tries again, backing off (1 s doubling, at most 10 s
            # here; the real one's goes to 60 s): a quota that frees up lets the pod in.
            job.refused_creates += 1
            job.retry_at = time.monotonic() + backoff_delay(
                CREATE_BACKOFF_START_S, CREATE_BACKOFF_MAX_S, job.refused_creates
            )
            self._after(job.retry_at - time.monotonic(), (namespace, name))
            said = ("Warning", "FailedCreate", f"Error creating: {refusal.message}")
        else:
            said = ("Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")
        self.events.record(self._job_ref(tj, job.name, job.uid), *said, "job-controller")
        return True
