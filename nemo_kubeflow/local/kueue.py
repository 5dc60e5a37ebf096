"""A tiny Kueue: LocalQueues, and a Workload per queued TrainJob that is admitted at once unless
its queue is missing or stopped.

What it does, after Kueue's TrainJob integration (`pkg/controller/jobs/trainjob`, the generic job
reconciler and the Workload controller):

* the mutating webhook: a TrainJob created with the `kueue.x-k8s.io/queue-name` label is
  created suspended;
* a Workload `trainjob-<name>-<hash>` owned by the TrainJob (`controller: true`), with the queue,
  the `kueue.x-k8s.io/priority-class` label as its priority class, and one pod set `node`;
* while the job is not admitted it stays suspended (Kueue suspends it again if someone resumes it),
  and the Workload says why in `QuotaReserved=False`: reason `Inadmissible`, "LocalQueue <q>
  doesn't exist" or "LocalQueue <q> is inactive" (`spec.stopPolicy: Hold` or `HoldAndDrain`);
* otherwise it is admitted: `status.admission`, `QuotaReserved=True` ("Quota reserved in
  ClusterQueue <cq>"), `Admitted=True` ("The workload is admitted"), and the TrainJob is
  unsuspended; when the TrainJob ends, `Finished=True`.

There are no ClusterQueues, ResourceFlavors, quotas, priorities or preemption: every queued job
whose LocalQueue exists and is not stopped is admitted. `HoldAndDrain` does not evict admitted
jobs, and the runtime patch Kueue writes on admission (node selectors of the flavor) is not written.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import queue
import threading
from typing import Optional

from nemo_kubeflow import constants as C
from nemo_kubeflow.local import resources as R
from nemo_kubeflow.local.apierrors import ApiError, FieldError, bad_request
from nemo_kubeflow.local.events import EventRecorder
from nemo_kubeflow.local.resources import ResourceType
from nemo_kubeflow.local.store import Store
from nemo_kubeflow.local.timeutil import set_condition

logger = logging.getLogger(__name__)

JOB_UID_LABEL = f"{C.KUEUE_GROUP}/job-uid"
STOP_POLICIES = ("None", "Hold", "HoldAndDrain")
COMPONENT = "kueue-admission"

#: Fields of the two CRDs' `spec` (v1beta1); anything else is an unknown field.
_SPEC_FIELDS = {
    R.LOCALQUEUES.key: {"clusterQueue", "stopPolicy", "fairSharing"},
    R.WORKLOADS.key: {"podSets", "queueName", "priorityClassName", "priority", "priorityClassSource", "active",
                      "maximumExecutionTimeSeconds"},
}
_TOP_FIELDS = {"apiVersion", "kind", "metadata", "spec", "status"}


# --- the API side -----------------------------------------------------------------------------------


def unknown_fields(rt: ResourceType, obj: dict) -> list[tuple]:
    """Decode a LocalQueue or Workload: the paths of unknown fields (the CRD schema would prune them)."""
    unknown = [(key,) for key in obj if key not in _TOP_FIELDS]
    spec = obj.get("spec", {})
    if not isinstance(spec, dict):
        raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: json: cannot '
                          f"unmarshal {type(spec).__name__} into Go struct field {rt.kind}.spec of type object")
    unknown += [("spec", key) for key in spec if key not in _SPEC_FIELDS[rt.key]]
    return sorted(unknown)


def crd_errors(rt: ResourceType, obj: dict) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors = []
    if rt is R.LOCALQUEUES and spec.get("stopPolicy", "None") not in STOP_POLICIES:
        errors.append(FieldError("spec.stopPolicy", "Unsupported value", "supported values: " +
                                 ", ".join(f'"{p}"' for p in STOP_POLICIES), spec.get("stopPolicy")))
    if rt is R.WORKLOADS and not spec.get("podSets"):
        errors.append(FieldError.required("spec.podSets"))
    return errors


def default_trainjob(obj: dict) -> None:
    """Kueue's mutating webhook (on create): a job that names a queue starts suspended."""
    if (obj.get("metadata", {}).get("labels") or {}).get(C.QUEUE_LABEL) and isinstance(obj.get("spec"), dict):
        obj["spec"]["suspend"] = True


def workload_name(trainjob_name: str, uid: str) -> str:
    """jobframework.GetWorkloadNameForOwnerWithGVK: `<kind>-<name>-<sha1(kind, group, name, uid)[:5]>`."""
    digest = hashlib.sha1(f"{C.TRAINJOB_KIND}\n{C.TRAINER_GROUP}\n{trainjob_name}\n{uid}".encode()).hexdigest()
    return f"{C.TRAINJOB_KIND.lower()}-{trainjob_name}"[:247] + "-" + digest[:5]


# --- the controller ----------------------------------------------------------------------------------


def _condition(obj: dict, type_: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == type_), {})


def _set_condition(obj: dict, type_: str, status: str, reason: str, message: str) -> None:
    set_condition(obj.setdefault("status", {}).setdefault("conditions", []), type_, status, reason, message,
                  observed_generation=obj["metadata"].get("generation", 1))


class KueueController:
    def __init__(self, store: Store, events: EventRecorder):
        self.store, self.events = store, events
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="kueue-controller", daemon=True)
        store.add_listener(self._on_change)

    def start(self) -> None:
        for tj in self.store.list(R.TRAINJOBS)[0]:
            self._queue.put(("job", tj["metadata"]["namespace"], tj["metadata"]["name"]))
        self._thread.start()

    def stop(self) -> None:
        self.store.remove_listener(self._on_change)
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _on_change(self, event: str, rt: ResourceType, obj: dict) -> None:
        meta = obj["metadata"]
        if rt is R.TRAINJOBS and (meta.get("labels") or {}).get(C.QUEUE_LABEL):
            self._queue.put(("job", meta["namespace"], meta["name"]))
        elif rt is R.LOCALQUEUES:
            self._queue.put(("queue", meta["namespace"], meta["name"]))
        elif rt is R.WORKLOADS:
            for ref in meta.get("ownerReferences") or []:
                if ref.get("kind") == C.TRAINJOB_KIND:
                    self._queue.put(("job", meta["namespace"], ref.get("name")))

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            keys = set()
            while True:  # take everything queued: one reconcile per TrainJob per round
                if item is None:
                    return
                keys.add(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            for kind, namespace, name in sorted(keys):
                try:
                    if kind == "queue":  # every job of that queue gets another look
                        for tj in self.store.list(R.TRAINJOBS, namespace, lambda o, q=name: (
                                o["metadata"].get("labels") or {}).get(C.QUEUE_LABEL) == q)[0]:
                            self._reconcile(namespace, tj["metadata"]["name"])
                    else:
                        self._reconcile(namespace, name)
                except Exception:  # noqa: BLE001 - a controller keeps going; the error goes to the log
                    logger.exception("kueue: reconciling %s %s/%s", kind, namespace, name)

    # -- reconcile --

    def _reconcile(self, namespace: str, name: str) -> None:
        tj = self.store.find(R.TRAINJOBS, namespace, name)
        if tj is None or tj["metadata"].get("deletionTimestamp"):
            return  # its Workload goes with it (ownerReference)
        queue_name = (tj["metadata"].get("labels") or {}).get(C.QUEUE_LABEL)
        if not queue_name:
            return
        workload = self._workload(tj) or self._create_workload(tj, queue_name)
        if workload is None:
            return
        if any(_condition(tj, t).get("status") == "True" for t in ("Complete", "Failed")):
            self._finish(tj, workload)
            return
        if _condition(workload, "Admitted").get("status") == "True":
            self._set_suspend(tj, False)
            return
        self._set_suspend(tj, True)  # not admitted: it must not run
        local_queue = self.store.find(R.LOCALQUEUES, namespace, queue_name)
        if local_queue is None:
            self._inadmissible(workload, f"LocalQueue {queue_name} doesn't exist")
        elif (local_queue.get("spec") or {}).get("stopPolicy", "None") != "None":
            self._inadmissible(workload, f"LocalQueue {queue_name} is inactive")
        else:
            self._admit(tj, workload, (local_queue.get("spec") or {}).get("clusterQueue", ""))

    def _workload(self, tj: dict) -> Optional[dict]:
        uid = tj["metadata"]["uid"]
        found = self.store.list(R.WORKLOADS, tj["metadata"]["namespace"], lambda o: any(
            ref.get("uid") == uid and ref.get("controller") for ref in o["metadata"].get("ownerReferences") or []))[0]
        return found[0] if found else None

    def _create_workload(self, tj: dict, queue_name: str) -> Optional[dict]:
        meta, spec = tj["metadata"], tj.get("spec") or {}
        trainer = spec.get("trainer") or {}
        container = {"name": C.TRAINER_NODE, "image": trainer.get("image", ""),
                     "resources": copy.deepcopy(trainer.get("resourcesPerNode") or {})}
        workload_spec = {
            "queueName": queue_name,
            "active": True,
            "priority": 0,
            "podSets": [{"name": C.TRAINER_NODE, "count": trainer.get("numNodes") or 1,
                         "template": {"spec": {"containers": [container], "restartPolicy": "Never"}}}],
        }
        priority_class = (meta.get("labels") or {}).get(C.PRIORITY_CLASS_LABEL)
        if priority_class:
            workload_spec.update(priorityClassName=priority_class,
                                 priorityClassSource="kueue.x-k8s.io/workloadpriorityclass")
        workload = {
            "apiVersion": R.WORKLOADS.api_version, "kind": C.WORKLOAD_KIND,
            "metadata": {
                "name": workload_name(meta["name"], meta["uid"]), "namespace": meta["namespace"],
                "labels": {JOB_UID_LABEL: meta["uid"]},
                "ownerReferences": [{"apiVersion": C.TRAINER_API_VERSION, "kind": C.TRAINJOB_KIND,
                                     "name": meta["name"], "uid": meta["uid"], "controller": True,
                                     "blockOwnerDeletion": True}],
            },
            "spec": workload_spec,
        }
        try:
            created = self.store.create(R.WORKLOADS, workload)
        except ApiError as error:  # the namespace is going, or a leftover of the same name
            logger.warning("kueue: creating workload for %s/%s: %s", meta["namespace"], meta["name"], error)
            return None
        self.events.record(tj, "Normal", "CreatedWorkload",
                           f"Created Workload: {meta['namespace']}/{created['metadata']['name']}", "kueue")
        return created

    def _mutate_workload(self, workload: dict, change) -> None:
        uid = workload["metadata"]["uid"]

        def apply(obj: dict) -> Optional[dict]:
            if obj["metadata"]["uid"] != uid:
                return None
            change(obj)
            return obj

        self.store.mutate(R.WORKLOADS, workload["metadata"]["namespace"], workload["metadata"]["name"], apply)

    def _inadmissible(self, workload: dict, message: str) -> None:
        def hold(w: dict) -> None:
            _set_condition(w, "QuotaReserved", "False", "Inadmissible", message)
            w["status"].pop("admission", None)

        self._mutate_workload(workload, hold)

    def _admit(self, tj: dict, workload: dict, cluster_queue: str) -> None:
        count = workload["spec"]["podSets"][0].get("count", 1)

        def admit(w: dict) -> None:
            w.setdefault("status", {})["admission"] = {
                "clusterQueue": cluster_queue,
                "podSetAssignments": [{"name": C.TRAINER_NODE, "count": count, "flavors": {}, "resourceUsage": {}}],
            }
            _set_condition(w, "QuotaReserved", "True", "QuotaReserved",
                           f"Quota reserved in ClusterQueue {cluster_queue}")
            _set_condition(w, "Admitted", "True", "Admitted", "The workload is admitted")

        self._mutate_workload(workload, admit)
        self.events.record(workload, "Normal", "QuotaReserved",
                           f"Quota reserved in ClusterQueue {cluster_queue}, wait time since queued was 0s", COMPONENT)
        self.events.record(workload, "Normal", "Admitted",
                           f"Admitted by ClusterQueue {cluster_queue}, wait time since reservation was 0s", COMPONENT)
        self._set_suspend(tj, False)

    def _finish(self, tj: dict, workload: dict) -> None:
        if _condition(workload, "Finished").get("status") == "True":
            return
        succeeded = _condition(tj, "Complete").get("status") == "True"
        message = _condition(tj, "Complete" if succeeded else "Failed").get("message", "")
        self._mutate_workload(workload, lambda w: _set_condition(
            w, "Finished", "True", "Succeeded" if succeeded else "Failed", message))

    def _set_suspend(self, tj: dict, suspend: bool) -> None:
        uid = tj["metadata"]["uid"]

        def change(obj: dict) -> Optional[dict]:
            if obj["metadata"]["uid"] != uid or bool(obj["spec"].get("suspend")) == suspend:
                return None
            obj["spec"]["suspend"] = suspend
            return obj

        self.store.mutate(R.TRAINJOBS, tj["metadata"]["namespace"], tj["metadata"]["name"], change)
