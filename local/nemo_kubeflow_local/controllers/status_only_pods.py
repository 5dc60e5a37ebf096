"""Status-only pods: a node's kubelet that runs no process, for measuring what clients cost the API
server at sizes this machine cannot run (1,024 nodes, one pod each).

`LocalCluster(status_only_pods=True)` runs this instead of the local kubelet. The API stays as it is
with processes: the Trainer, JobSet and Job emulation create the same pods, the scheduler's part binds
each to a virtual node (``virtual_nodes.choose``, nodeSelector and node affinity honoured, the least
loaded first, FailedScheduling while none fits), and the kubelet's part writes the status a kubelet
writes for a started pod (phase Running, every condition True, init containers terminated with 0,
sidecars and main containers running and ready, the events Scheduled, Pulled, Created, Started). What
is missing is only what a process would add: no container ever runs, so no log line is written and a
pod never ends by itself. ``end_pods`` ends pods as their containers would (exit code 0: Succeeded;
otherwise Failed, reason Error), which the Job emulation then counts as usual. A deleted pod goes at
once (nothing to stop).
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from typing import Callable, Optional

from nemo_kubeflow_local import virtual_nodes
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.selectors import label_matcher
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.events import NODE_NAME, EventRecorder
from nemo_kubeflow_local.timeutil import now_rfc3339

#: The address every status-only pod reports (no network of its own).
POD_IP = "127.0.0.1"
_TERMINAL = ("Succeeded", "Failed")


class StatusOnlyKubelet:
    """Binds and "starts" the pods of the store without processes (module docstring)."""

    def __init__(self, store: Store, events: EventRecorder):
        self.store, self.events = store, events
        self._queue: queue.Queue = queue.Queue()
        self._nodes: Optional[list[dict]] = None  # virtual nodes, read again after a Node changed
        self._load: Counter = Counter()  # node -> pods bound there and not finished
        self._bound: dict[str, str] = {}  # pod uid -> node, while it counts in _load
        self._unscheduled: dict[str, tuple[str, str]] = {}  # pod uid -> (namespace, name): no node fits yet
        self._thread = threading.Thread(target=self._loop, name="status-only-kubelet", daemon=True)
        self._stopped = threading.Event()

    def start(self) -> None:
        self.store.add_listener(self._on_change)
        self._thread.start()

    def stop(self) -> None:
        self.store.remove_listener(self._on_change)
        self._stopped.set()
        self._queue.put(None)
        self._thread.join(5.0)

    def idle(self) -> bool:
        """Nothing left to bind or start (the pods wanting a node that fits none wait on)."""
        return self._queue.unfinished_tasks == 0

    # -- events of the store (under its lock: only queue the work) --

    def _on_change(self, event: str, rt, obj: dict) -> None:
        if rt is R.PODS:
            meta = obj["metadata"]
            self._queue.put((event, meta.get("namespace", ""), meta["name"], meta["uid"]))
        elif rt is R.NODES:
            self._queue.put(("NODES", "", "", ""))

    def _loop(self) -> None:
        while not self._stopped.is_set():
            item = self._queue.get()
            try:
                if item is not None:
                    self._handle(*item)
            except Exception:  # noqa: BLE001 - one pod's trouble must not stop the others
                import logging

                logging.getLogger(__name__).exception("status-only pod %s", item)
            finally:
                self._queue.task_done()

    def _handle(self, event: str, namespace: str, name: str, uid: str) -> None:
        if event == "NODES":
            self._nodes = None
            for waiting_uid, (ns, pod_name) in list(self._unscheduled.items()):
                self._handle("MODIFIED", ns, pod_name, waiting_uid)
            return
        if event == "DELETED":
            self._unbind(uid)
            self._unscheduled.pop(uid, None)
            return
        pod = self.store.find(R.PODS, namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        if pod["metadata"].get("deletionTimestamp"):
            self.store.remove(R.PODS, namespace, name, uid)  # no container to stop
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in _TERMINAL:
            self._unbind(uid)
            return
        if not pod["spec"].get("nodeName"):
            self._schedule(pod)
        elif phase in (None, "Pending") and uid in self._bound:
            self._start(pod)

    # -- the scheduler's part --

    def _virtual_nodes(self) -> list[dict]:
        if self._nodes is None:
            self._nodes = [n for n in self.store.list(R.NODES, None)[0] if virtual_nodes.is_virtual(n)]
        return self._nodes

    def _schedule(self, pod: dict) -> None:
        meta = pod["metadata"]
        nodes = self._virtual_nodes()
        node, why = virtual_nodes.choose(pod, nodes, self._load) if nodes else (NODE_NAME, "")
        if node is None:
            first = meta["uid"] not in self._unscheduled
            self._unscheduled[meta["uid"]] = (meta["namespace"], meta["name"])
            if first:
                self._write(
                    pod,
                    lambda status: status.update(
                        phase="Pending",
                        conditions=[
                            {
                                "type": "PodScheduled",
                                "status": "False",
                                "reason": "Unschedulable",
                                "message": why,
                                "lastTransitionTime": now_rfc3339(),
                            }
                        ],
                    ),
                )
                self.events.record(pod, "Warning", "FailedScheduling", why, "default-scheduler")
            return
        self._unscheduled.pop(meta["uid"], None)

        def bind(stored: dict) -> Optional[dict]:
            if stored["metadata"]["uid"] != meta["uid"] or stored["spec"].get("nodeName"):
                return None
            stored["spec"]["nodeName"] = node
            return stored

        if self.store.mutate(R.PODS, meta["namespace"], meta["name"], bind) is None:
            return
        self._bound[meta["uid"]] = node
        self._load[node] += 1
        self.events.record(
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
            "default-scheduler",
        )
        # The MODIFIED event of the binding starts it (_handle).

    def _unbind(self, uid: str) -> None:
        node = self._bound.pop(uid, None)
        if node is not None:
            self._load[node] -= 1

    # -- the kubelet's part --

    def _start(self, pod: dict) -> None:
        now = now_rfc3339()
        spec = pod["spec"]
        for container in spec.get("containers") or []:
            image = container.get("image", "")
            field_path = f"spec.containers{{{container['name']}}}"
            self.events.record(
                pod,
                "Normal",
                "Pulled",
                f'Container image "{image}" already present on machine and can be accessed by the pod',
                "kubelet",
                field_path,
            )
            self.events.record(
                pod, "Normal", "Created", f"Created container: {container['name']}", "kubelet", field_path
            )
            self.events.record(
                pod, "Normal", "Started", f"Started container {container['name']}", "kubelet", field_path
            )
        init = [_init_status(c, now, pod["metadata"]["uid"]) for c in spec.get("initContainers") or []]
        main = [_running(c, now, pod["metadata"]["uid"]) for c in spec.get("containers") or []]

        def start(status: dict) -> None:
            status.update(
                phase="Running",
                hostIP=POD_IP,
                hostIPs=[{"ip": POD_IP}],
                podIP=POD_IP,
                podIPs=[{"ip": POD_IP}],
                startTime=now,
                containerStatuses=main,
                qosClass="BestEffort",
                conditions=[
                    {"type": t, "status": "True", "lastTransitionTime": now}
                    for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
                ]
                + [c for c in status.get("conditions") or [] if c.get("type") == "DisruptionTarget"],
            )
            if init:
                status["initContainerStatuses"] = init

        self._write(pod, start)

    def _write(self, pod: dict, change: Callable[[dict], None]) -> None:
        uid = pod["metadata"]["uid"]

        def apply(stored: dict) -> Optional[dict]:
            if stored["metadata"]["uid"] != uid:
                return None
            change(stored.setdefault("status", {}))
            return stored

        self.store.mutate(R.PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], apply)

    def end_pods(self, namespace: str, label_selector: str, exit_code: int = 0) -> list[str]:
        """End the running pods matching ``label_selector`` as if each main container exited with ``exit_code``
        (0: Succeeded; otherwise Failed, reason Error). Returns their names."""
        matches = label_matcher(label_selector)
        ended = []
        for pod in self.store.list(R.PODS, namespace, matches)[0]:
            if (pod.get("status") or {}).get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
                continue
            now = now_rfc3339()

            def end(status: dict, now: str = now) -> None:
                status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
                for cs in status.get("containerStatuses") or []:
                    started = ((cs.get("state") or {}).get("running") or {}).get("startedAt", now)
                    cs.update(
                        ready=False,
                        started=False,
                        state={
                            "terminated": {
                                "exitCode": exit_code,
                                "reason": "Completed" if exit_code == 0 else "Error",
                                "startedAt": started,
                                "finishedAt": now,
                                "containerID": cs.get("containerID", ""),
                            }
                        },
                    )
                for condition in status.get("conditions") or []:
                    if condition.get("type") in ("Ready", "ContainersReady"):
                        condition.update(
                            status="False",
                            reason="PodCompleted" if exit_code == 0 else "PodFailed",
                            lastTransitionTime=now,
                        )

            self._write(pod, end)
            ended.append(pod["metadata"]["name"])
        return ended


def _running(container: dict, now: str, uid: str) -> dict:
    return {
        "name": container["name"],
        "state": {"running": {"startedAt": now}},
        "lastState": {},
        "ready": True,
        "restartCount": 0,
        "image": container.get("image", ""),
        "imageID": "",
        "started": True,
        "containerID": f"local://{uid}-{container['name']}",
    }


def _init_status(container: dict, now: str, uid: str) -> dict:
    if container.get("restartPolicy") == "Always":  # a native sidecar runs beside the main containers
        return _running(container, now, uid)
    return {
        "name": container["name"],
        "state": {
            "terminated": {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": now,
                "finishedAt": now,
                "containerID": f"local://{uid}-{container['name']}",
            }
        },
        "lastState": {},
        "ready": True,
        "restartCount": 0,
        "image": container.get("image", ""),
        "imageID": "",
        "started": False,
    }
