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

Without a ClusterQueue (the LocalQueue's `spec.clusterQueue` not created), every queued job whose
LocalQueue exists and is not stopped is admitted. With one, its quota counts:

* a Workload asks for its pod set's requests times its count (`trainer.resourcesPerNode` x
  `numNodes`), and takes its priority from the WorkloadPriorityClass of the job's
  `kueue.x-k8s.io/priority-class` label (0 without one);
* it is admitted if the nominal quota (summed over the flavors) holds it beside the Workloads that
  hold quota there; otherwise it waits (`QuotaReserved=False`, reason `Pending`, "couldn't assign
  flavors to pod set node: insufficient unused quota for cpu in flavor f, 1 more needed"), or, with
  `preemption.withinClusterQueue: LowerPriority`, lower-priority Workloads are evicted (the lowest,
  then the newest first) until it would fit: `Evicted=True`, `Preempted=True` and `Requeued=True`,
  reasons `Preempted`/`InClusterQueue`/`Preempted`, with Kueue's message, their TrainJobs
  suspended; each keeps its quota until its pods are gone, then `QuotaReserved=False` (reason
  `Pending`) and it queues again;
* the waiting Workloads get another look, the highest priority first, whenever quota is freed (a
  Workload finished, deleted or released); admitted again, `Evicted`/`Preempted` turn `False`.

Not emulated: cohorts and borrowing, fair sharing, flavor fungibility (one quota per resource over
all flavors), `reclaimWithinCohort`, StrictFIFO's head-of-line blocking. `HoldAndDrain` does not
evict admitted jobs, and the runtime patch Kueue writes on admission (node selectors of the flavor)
is not written.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import queue
import threading
from decimal import Decimal
from typing import Callable, Optional

from nemo_kubeflow_local import constants as C
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import ApiError
from nemo_kubeflow_local.apiserver.kueue_visibility import queue_order as _queue_order
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.events import EventRecorder
from nemo_kubeflow_local.quantity import parse_quantity
from nemo_kubeflow_local.timeutil import set_condition

logger = logging.getLogger(__name__)

JOB_UID_LABEL = f"{C.KUEUE_GROUP}/job-uid"
COMPONENT = "kueue-admission"


def workload_name(trainjob_name: str, uid: str) -> str:
    """jobframework.GetWorkloadNameForOwnerWithGVK: `<kind>-<name>-<sha1(kind, group, name, uid)[:5]>`."""
    digest = hashlib.sha1(f"{C.TRAINJOB_KIND}\n{C.TRAINER_GROUP}\n{trainjob_name}\n{uid}".encode()).hexdigest()
    return f"{C.TRAINJOB_KIND.lower()}-{trainjob_name}"[:247] + "-" + digest[:5]


# --- the controller ----------------------------------------------------------------------------------


def _condition(obj: dict, type_: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == type_), {})


def _set_condition(obj: dict, type_: str, status: str, reason: str, message: str) -> None:
    set_condition(
        obj.setdefault("status", {}).setdefault("conditions", []),
        type_,
        status,
        reason,
        message,
        observed_generation=obj["metadata"].get("generation", 1),
    )


def _usage(workload: dict) -> dict[str, Decimal]:
    """What the workload asks of its ClusterQueue: each pod set's requests times its count."""
    total: dict[str, Decimal] = {}
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        for container in ((pod_set.get("template") or {}).get("spec") or {}).get("containers") or []:
            resources = container.get("resources") or {}
            for resource, value in {**(resources.get("limits") or {}), **(resources.get("requests") or {})}.items():
                total[resource] = total.get(resource, Decimal(0)) + (parse_quantity(value) or 0) * pod_set.get(
                    "count", 1
                )
    return total


def _quota(cluster_queue: dict) -> tuple[dict[str, Decimal], dict[str, str]]:
    """The nominal quota of each covered resource over the ClusterQueue's flavors, and the first
    flavor that covers it (named in "insufficient unused quota for cpu in flavor <f>")."""
    quota: dict[str, Decimal] = {}
    flavors: dict[str, str] = {}
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                flavors.setdefault(resource["name"], flavor.get("name", ""))
                quota[resource["name"]] = quota.get(resource["name"], Decimal(0)) + (
                    parse_quantity(resource.get("nominalQuota")) or 0
                )
    return quota, flavors


def _used(usages: list[dict[str, Decimal]]) -> dict[str, Decimal]:
    """What workloads of these usages hold together, per resource."""
    total: dict[str, Decimal] = {}
    for usage in usages:
        for resource, value in usage.items():
            total[resource] = total.get(resource, Decimal(0)) + value
    return total


def _quantity(value: Decimal) -> str:
    """A quantity as Kueue prints it in its messages ("1", "500m", "2Gi")."""
    if value == value.to_integral_value():
        whole = int(value)
        for suffix, size in (("Gi", 2**30), ("Mi", 2**20)):
            if whole >= size and whole % size == 0:
                return f"{whole // size}{suffix}"
        return str(whole)
    return f"{int(value * 1000)}m"


def _fits(wanted: dict[str, Decimal], quota: dict[str, Decimal], used: dict[str, Decimal]) -> bool:
    return all(r in quota and used.get(r, Decimal(0)) + wanted[r] <= quota[r] for r in wanted)


def _in_queue(name: str) -> Callable[[dict], bool]:
    """Whether a TrainJob names LocalQueue ``name`` (its ``kueue.x-k8s.io/queue-name`` label)."""
    return lambda obj: (obj["metadata"].get("labels") or {}).get(C.QUEUE_LABEL) == name


class KueueController:
    def __init__(self, store: Store, events: EventRecorder):
        self.store, self.events = store, events
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="kueue-controller", daemon=True)
        #: Each Workload's usage by (uid, resourceVersion): a pass over a thousand waiting Workloads
        #: compares each with those ahead of it, so each is parsed once, not once per comparison.
        self._usages: dict[tuple[str, str], dict[str, Decimal]] = {}
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
            if event == "DELETED" or _condition(obj, "Finished").get("status") == "True":
                self._queue.put(("pending", "", ""))  # its quota is free: the waiting ones get another look
        elif rt is R.CLUSTERQUEUES:
            if event != "DELETED":
                self._queue.put(("cluster-queue", "", meta["name"]))
            self._queue.put(("pending", "", ""))
        elif rt is R.RESOURCEFLAVORS:
            self._queue.put(("cluster-queue", "", ""))  # "": every ClusterQueue
        elif rt is R.PODS and (event == "DELETED" or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")):
            if trainjob := (meta.get("labels") or {}).get(C.JOBSET_NAME_LABEL):  # a preempted job's pods stop
                self._queue.put(("job", meta["namespace"], trainjob))

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
                        for tj in self.store.list(
                            R.TRAINJOBS,
                            namespace,
                            _in_queue(name),
                        )[0]:
                            self._reconcile(namespace, tj["metadata"]["name"])
                    elif kind == "cluster-queue":
                        for cq in (
                            [name]
                            if name
                            else [o["metadata"]["name"] for o in self.store.list(R.CLUSTERQUEUES, None)[0]]
                        ):
                            self._set_active(cq)
                    elif kind == "pending":  # every job not admitted, the highest priority first
                        for workload in sorted(self.store.stored_list(R.WORKLOADS, None)[0], key=_queue_order):
                            owner = next(
                                (
                                    r["name"]
                                    for r in workload["metadata"].get("ownerReferences") or []
                                    if r.get("kind") == C.TRAINJOB_KIND
                                ),
                                None,
                            )
                            if owner and _condition(workload, "Admitted").get("status") != "True":
                                self._reconcile(workload["metadata"]["namespace"], owner)
                    else:
                        self._reconcile(namespace, name)
                except Exception:  # noqa: BLE001 - a controller keeps going; the error goes to the log
                    logger.exception("kueue: reconciling %s %s/%s", kind, namespace, name)

    # -- reconcile --

    def _set_active(self, name: str) -> None:
        """The ClusterQueue's `Active` condition, as Kueue's ClusterQueue controller words it: active when
        every ResourceFlavor it names exists, else `FlavorNotFound` (stopPolicy and admission checks aside)."""

        def change(cq: dict) -> Optional[dict]:
            flavors = sorted(
                {
                    f.get("name", "")
                    for group in (cq.get("spec") or {}).get("resourceGroups") or []
                    for f in group.get("flavors") or []
                }
            )
            missing = [f for f in flavors if self.store.find(R.RESOURCEFLAVORS, "", f) is None]
            before = copy.deepcopy((cq.get("status") or {}).get("conditions"))
            if missing:
                _set_condition(
                    cq,
                    "Active",
                    "False",
                    "FlavorNotFound",
                    f"Can't admit new workloads: references missing ResourceFlavor(s): {missing}.",
                )
            else:
                _set_condition(cq, "Active", "True", "Ready", "Can admit new workloads")
            return cq if cq["status"]["conditions"] != before else None

        self.store.mutate(R.CLUSTERQUEUES, "", name, change)

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
        if (
            _condition(workload, "Evicted").get("status") == "True"
            and _condition(workload, "QuotaReserved").get("status") == "True"
        ):
            self._set_suspend(tj, True)  # preempted: stopped, and its quota released once its pods are gone
            if not self._active_pods(tj):
                self._release(workload)
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
            cluster_queue_name = (local_queue.get("spec") or {}).get("clusterQueue", "")
            cluster_queue = self.store.find(R.CLUSTERQUEUES, "", cluster_queue_name)
            if cluster_queue is None:  # none made: the LocalQueue alone admits
                self._admit(tj, workload, cluster_queue_name)
            else:
                self._admit_within_quota(tj, workload, cluster_queue)

    def _workload(self, tj: dict) -> Optional[dict]:
        uid = tj["metadata"]["uid"]
        found = self.store.list(
            R.WORKLOADS,
            tj["metadata"]["namespace"],
            lambda o: any(
                ref.get("uid") == uid and ref.get("controller") for ref in o["metadata"].get("ownerReferences") or []
            ),
        )[0]
        return found[0] if found else None

    def _create_workload(self, tj: dict, queue_name: str) -> Optional[dict]:
        meta, spec = tj["metadata"], tj.get("spec") or {}
        trainer = spec.get("trainer") or {}
        container = {
            "name": C.TRAINER_NODE,
            "image": trainer.get("image", ""),
            "resources": copy.deepcopy(trainer.get("resourcesPerNode") or {}),
        }
        priority_class = (meta.get("labels") or {}).get(C.PRIORITY_CLASS_LABEL)
        found_class = self.store.find(R.WORKLOAD_PRIORITY_CLASSES, "", priority_class) if priority_class else None
        workload_spec = {
            "queueName": queue_name,
            "active": True,
            "priority": (found_class or {}).get("value", 0),
            "podSets": [
                {
                    "name": C.TRAINER_NODE,
                    "count": trainer.get("numNodes") or 1,
                    "template": {"spec": {"containers": [container], "restartPolicy": "Never"}},
                }
            ],
        }
        if priority_class:
            workload_spec["priorityClassRef"] = {
                "group": C.KUEUE_GROUP,
                "kind": "WorkloadPriorityClass",
                "name": priority_class,
            }
        workload = {
            "apiVersion": R.WORKLOADS.api_version,
            "kind": C.WORKLOAD_KIND,
            "metadata": {
                "name": workload_name(meta["name"], meta["uid"]),
                "namespace": meta["namespace"],
                "labels": {JOB_UID_LABEL: meta["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": C.TRAINER_API_VERSION,
                        "kind": C.TRAINJOB_KIND,
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": workload_spec,
        }
        try:
            created = self.store.create(R.WORKLOADS, workload)
        except ApiError as error:  # the namespace is going, or a leftover of the same name
            logger.warning("kueue: creating workload for %s/%s: %s", meta["namespace"], meta["name"], error)
            return None
        self.events.record(
            tj,
            "Normal",
            "CreatedWorkload",
            f"Created Workload: {meta['namespace']}/{created['metadata']['name']}",
            "kueue",
        )
        return created

    def _mutate_workload(self, workload: dict, change) -> None:
        uid = workload["metadata"]["uid"]

        def apply(obj: dict) -> Optional[dict]:
            if obj["metadata"]["uid"] != uid:
                return None
            change(obj)
            return obj

        self.store.mutate(R.WORKLOADS, workload["metadata"]["namespace"], workload["metadata"]["name"], apply)

    def _inadmissible(self, workload: dict, message: str, reason: str = "Inadmissible") -> None:
        def hold(w: dict) -> None:
            _set_condition(w, "QuotaReserved", "False", reason, message)
            w["status"].pop("admission", None)

        self._mutate_workload(workload, hold)

    def _admit(self, tj: dict, workload: dict, cluster_queue: str) -> None:
        count = workload["spec"]["podSets"][0].get("count", 1)

        def admit(w: dict) -> None:
            w.setdefault("status", {})["admission"] = {
                "clusterQueue": cluster_queue,
                "podSetAssignments": [{"name": C.TRAINER_NODE, "count": count, "flavors": {}, "resourceUsage": {}}],
            }
            _set_condition(
                w, "QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cluster_queue}"
            )
            _set_condition(w, "Admitted", "True", "Admitted", "The workload is admitted")
            for type_ in ("Evicted", "Preempted"):  # admitted again after a preemption
                if _condition(w, type_).get("status") == "True":
                    _set_condition(
                        w, type_, "False", "QuotaReserved", f"Previously: {_condition(w, type_).get('message', '')}"
                    )

        self._mutate_workload(workload, admit)
        self.events.record(
            workload,
            "Normal",
            "QuotaReserved",
            f"Quota reserved in ClusterQueue {cluster_queue}, wait time since queued was 0s",
            COMPONENT,
        )
        self.events.record(
            workload,
            "Normal",
            "Admitted",
            f"Admitted by ClusterQueue {cluster_queue}, wait time since reservation was 0s",
            COMPONENT,
        )
        self._set_suspend(tj, False)

    # -- quota and preemption (a ClusterQueue that exists) --

    def _admit_within_quota(self, tj: dict, workload: dict, cluster_queue: dict) -> None:
        """Admit the workload if the ClusterQueue's quota holds it beside the workloads holding quota
        there; else, with `preemption.withinClusterQueue: LowerPriority`, evict lower-priority ones
        (the lowest, then the newest first) until it would fit (it is admitted once their pods are
        gone and their quota released); else say why it waits, as Kueue does."""
        name = cluster_queue["metadata"]["name"]
        quota, flavors = _quota(cluster_queue)
        wanted = self._usage(workload)
        uncovered = sorted(set(wanted) - set(quota))
        if uncovered:
            self._inadmissible(
                workload,
                f"couldn't assign flavors to pod set {C.TRAINER_NODE}: resource "
                f"{uncovered[0]} unavailable in ClusterQueue",
                reason="Pending",
            )
            return
        holding = [w for w in self._holding_quota(name) if w["metadata"]["uid"] != workload["metadata"]["uid"]]
        used = _used([self._usage(w) for w in holding])
        ahead = [w for w in self._waiting(name) if _queue_order(w) < _queue_order(workload)]
        if any(_fits(self._usage(w), quota, used) for w in ahead):
            return  # the queue's order: those go first (the look at the waiting ones admits them)
        if _fits(wanted, quota, used):
            self._admit(tj, workload, name)
            return
        priority = workload["spec"].get("priority", 0)
        policy = ((cluster_queue.get("spec") or {}).get("preemption") or {}).get("withinClusterQueue", "Never")
        evicting = [w for w in holding if _condition(w, "Evicted").get("status") == "True"]
        if policy in ("LowerPriority", "LowerOrNewerEqualPriority") and not evicting:
            victims, kept = [], list(holding)
            lower = sorted(
                (w for w in holding if w["spec"].get("priority", 0) < priority),
                key=lambda w: w["metadata"].get("creationTimestamp", ""),
                reverse=True,
            )
            for candidate in sorted(lower, key=lambda w: w["spec"].get("priority", 0)):
                victims.append(candidate)
                kept = [w for w in kept if w is not candidate]
                if _fits(wanted, quota, _used([self._usage(w) for w in kept])):
                    for victim in victims:
                        self._evict(victim, workload, name)
                    break
        more = next(
            f"{r} in flavor {flavors[r]}, {_quantity(used.get(r, Decimal(0)) + wanted[r] - quota[r])} more needed"
            for r in wanted
            if used.get(r, Decimal(0)) + wanted[r] > quota[r]
        )
        self._inadmissible(
            workload,
            f"couldn't assign flavors to pod set {C.TRAINER_NODE}: insufficient unused quota for {more}",
            reason="Pending",
        )

    # The looks below read the stored Workloads without copying them (they are never modified in place; a
    # write goes through `_mutate_workload` by name): one reconcile among a thousand waiting ones reads each once.

    def _usage(self, workload: dict) -> dict[str, Decimal]:
        key = (workload["metadata"]["uid"], workload["metadata"].get("resourceVersion", ""))
        found = self._usages.get(key)
        if found is None:
            if len(self._usages) > 100_000:  # kept versions of Workloads long gone
                self._usages.clear()
            found = self._usages[key] = _usage(workload)
        return found

    def _holding_quota(self, cluster_queue: str) -> list[dict]:
        return self.store.stored_list(
            R.WORKLOADS,
            None,
            lambda w: (
                _condition(w, "QuotaReserved").get("status") == "True"
                and ((w.get("status") or {}).get("admission") or {}).get("clusterQueue") == cluster_queue
                and _condition(w, "Finished").get("status") != "True"
            ),
        )[0]

    def _waiting(self, cluster_queue: str) -> list[dict]:
        """The Workloads waiting for this ClusterQueue through an active LocalQueue, not yet admitted."""
        found = []
        queues: dict[tuple[str, str], dict] = {}
        for w in self.store.stored_list(R.WORKLOADS, None)[0]:
            if any(_condition(w, t).get("status") == "True" for t in ("QuotaReserved", "Finished")):
                continue
            key = (w["metadata"]["namespace"], w["spec"].get("queueName", ""))
            if key not in queues:
                queues[key] = (self.store.find(R.LOCALQUEUES, *key) or {}).get("spec") or {}
            spec = queues[key]
            if spec.get("clusterQueue") == cluster_queue and spec.get("stopPolicy", "None") == "None":
                found.append(w)
        return found

    def _evict(self, victim: dict, preemptor: dict, cluster_queue: str) -> None:
        message = (
            f"Preempted to accommodate a workload (UID: {preemptor['metadata']['uid']}, JobUID: "
            f"{(preemptor['metadata'].get('labels') or {}).get(JOB_UID_LABEL, '')}) due to prioritization "
            f"in the ClusterQueue; preemptor path: /{cluster_queue}; preemptee path: /{cluster_queue}"
        )

        def evict(w: dict) -> None:
            _set_condition(w, "Evicted", "True", "Preempted", message)
            _set_condition(w, "Preempted", "True", "InClusterQueue", message)
            _set_condition(w, "Requeued", "True", "Preempted", message)

        self._mutate_workload(victim, evict)
        self.events.record(victim, "Normal", "Preempted", message, COMPONENT)
        for ref in victim["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == C.TRAINJOB_KIND:
                self._queue.put(("job", victim["metadata"]["namespace"], ref["name"]))

    def _active_pods(self, tj: dict) -> bool:
        return any(
            (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            for p in self.store.list(
                R.PODS,
                tj["metadata"]["namespace"],
                lambda p: (p["metadata"].get("labels") or {}).get(C.JOBSET_NAME_LABEL) == tj["metadata"]["name"],
            )[0]
        )

    def _release(self, workload: dict) -> None:
        """The evicted job has stopped: its quota is free, and it waits to be admitted again."""
        message = _condition(workload, "Evicted").get("message", "")

        def release(w: dict) -> None:
            _set_condition(w, "QuotaReserved", "False", "Pending", message)
            _set_condition(w, "Admitted", "False", "NoReservation", "The workload has no reservation")
            w["status"].pop("admission", None)

        self._mutate_workload(workload, release)
        self._queue.put(("pending", "", ""))

    def _finish(self, tj: dict, workload: dict) -> None:
        if _condition(workload, "Finished").get("status") == "True":
            return
        succeeded = _condition(tj, "Complete").get("status") == "True"
        message = _condition(tj, "Complete" if succeeded else "Failed").get("message", "")
        self._mutate_workload(
            workload, lambda w: _set_condition(w, "Finished", "True", "Succeeded" if succeeded else "Failed", message)
        )

    def _set_suspend(self, tj: dict, suspend: bool) -> None:
        uid = tj["metadata"]["uid"]

        def change(obj: dict) -> Optional[dict]:
            if obj["metadata"]["uid"] != uid or bool(obj["spec"].get("suspend")) == suspend:
                return None
            obj["spec"]["suspend"] = suspend
            return obj

        self.store.mutate(R.TRAINJOBS, tj["metadata"]["namespace"], tj["metadata"]["name"], change)
