"""The resource quota controller's part (kube-controller-manager): each ResourceQuota's `status.hard` and
`status.used`, computed again when a quota is written and when a pod of its namespace ends or goes. The API
server counts a pod in when it admits it (pod_admission.create_pod), as the real quota admission does."""

from __future__ import annotations

import queue
import threading
from typing import Optional

from nemo_kubeflow_local.apiserver import pod_admission
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.apiserver.store import Store


class QuotaController:
    def __init__(self, store: Store):
        self.store = store
        self._namespaces: queue.Queue[Optional[str]] = queue.Queue()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self.store.add_listener(self._on_change)
        self._thread = threading.Thread(target=self._run, name="quota-controller", daemon=True)
        self._thread.start()
        for quota in self.store.list(R.RESOURCEQUOTAS, None)[0]:  # restored from the workdir
            self._namespaces.put(quota["metadata"]["namespace"])

    def stop(self) -> None:
        self.store.remove_listener(self._on_change)
        self._namespaces.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _on_change(self, event: str, rt: ResourceType, obj: dict) -> None:
        if rt is R.RESOURCEQUOTAS and event != "DELETED":
            self._namespaces.put(obj["metadata"]["namespace"])  # its own status write makes one sync more, a no-op
        elif rt is R.PODS and (event == "DELETED" or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")):
            self._namespaces.put(obj["metadata"]["namespace"])
        elif event == "DELETED" and rt.namespaced and rt is not R.EVENTS:  # an object-count quota's object
            self._namespaces.put(obj["metadata"]["namespace"])

    def _run(self) -> None:
        while True:
            namespace = self._namespaces.get()
            if namespace is None:
                return
            if self.store.namespace_exists(namespace):
                pod_admission.sync_quotas(self.store, namespace)
