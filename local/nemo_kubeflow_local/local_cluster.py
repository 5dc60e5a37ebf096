"""`LocalCluster`: the API server, the Trainer controller and the kubelet, wired together."""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

import yaml

from nemo_kubeflow_local import virtual_nodes
from nemo_kubeflow_local.apiserver import persistence
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.container_logs import LogStore
from nemo_kubeflow_local.apiserver.faults import (
    USER,
    ApiCount,
    Fault,
    FaultHandle,
    Hooks,
    RequestRecord,
    lose_node,
    oom_kill,
)
from nemo_kubeflow_local.apiserver.registry import Registry
from nemo_kubeflow_local.apiserver.server import ApiServer
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.apiserver.tls import ServerCredentials, make_credentials
from nemo_kubeflow_local.apiserver.versions import KUEUE_SERVED_DEFAULT
from nemo_kubeflow_local.controllers import trainjob_status
from nemo_kubeflow_local.controllers.kueue import KueueController
from nemo_kubeflow_local.controllers.quota import QuotaController
from nemo_kubeflow_local.controllers.status_only_pods import StatusOnlyKubelet
from nemo_kubeflow_local.controllers.trainer import TrainerController
from nemo_kubeflow_local.events import EventRecorder
from nemo_kubeflow_local.kubelet.kubelet import LocalKubelet

T = TypeVar("T")

CONTEXT = "nemo-kubeflow-local"
#: What a Trainer v2.3 install publishes for the SDK's version check.
TRAINER_SYSTEM_NAMESPACE = "kubeflow-system"
TRAINER_PUBLIC_CONFIGMAP = "kubeflow-trainer-public"
TRAINER_VERSION = "v2.3.0"
#: The PriorityClasses kube-apiserver makes at start.
SYSTEM_PRIORITY_CLASSES = {
    "system-node-critical": (
        2000001000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    "system-cluster-critical": (
        2000000000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
}


@dataclass
class _Running:
    """The parts of a started cluster: ``LocalCluster._running`` from start() to stop()."""

    workdir: Path
    store: Store
    server: ApiServer
    credentials: ServerCredentials
    controller: TrainerController
    kueue: KueueController
    quota: QuotaController


class LocalCluster:
    """A Kubernetes API server with Kubeflow Trainer v2.3 that runs TrainJobs as local processes.

    Args:
        workdir: where the kubeconfig, pod directories, PVC directories and logs go. None: a
            temporary directory, removed by `stop()`.
        run_kubelet: False: no embedded node; pods stay unscheduled until a node agent
            (nodeagent.py) runs those bound to its Nodes.
        persist: keep the API objects in `workdir` and restore those kept there by a previous run
            (persistence.py: what is kept, and how a TrainJob that was running then reads). Needs a
            `workdir`; `python -m nemo_kubeflow_local serve --workdir DIR` sets it.
        feature_gates: Trainer's alpha feature gates to turn on: ``("TrainJobStatus",)`` runs Trainer's
            status server (controllers/trainjob_status.py) and gives the trainer pods its URL, CA and token.
        status_only_pods: run pods without processes (status_only_pods.py), for measuring the API at
            sizes this machine cannot run: the same objects and statuses, no container output; `end_pods`
            ends them. Replaces the local kubelet (not with `run_kubelet=False`).
    """

    def __init__(
        self,
        workdir: Union[str, Path, None] = None,
        *,
        run_kubelet: bool = True,
        persist: bool = False,
        kueue_versions: tuple[str, ...] = KUEUE_SERVED_DEFAULT,
        feature_gates: tuple[str, ...] = (),
        status_only_pods: bool = False,
        port: int = 0,
    ):
        if persist and workdir is None:
            raise ValueError("persist=True needs a workdir: a temporary one is removed when the cluster stops")
        if status_only_pods and not run_kubelet:
            raise ValueError("status_only_pods=True replaces the local kubelet: it needs run_kubelet=True")
        unknown = sorted(set(feature_gates) - {trainjob_status.FEATURE_GATE})
        if unknown:
            raise ValueError(
                f"feature_gates: {', '.join(unknown)}: the local cluster emulates only {trainjob_status.FEATURE_GATE}"
            )
        self._feature_gates = tuple(feature_gates)
        #: Trainer's status server, with the TrainJobStatus gate on (started with the cluster).
        self.status_server: Optional[trainjob_status.StatusServer] = None
        #: The service-account tokens the kubelet projects into pods (the TokenRequest API's part).
        self.tokens = trainjob_status.TokenIssuer()
        self._run_kubelet = run_kubelet
        self._status_only_pods = status_only_pods
        self._status_only: Optional[StatusOnlyKubelet] = None
        self._persist = persist
        self._saver: Optional[persistence.Saver] = None
        #: What `start()` restored from the workdir (persist=True), None when nothing was kept there.
        self.restored: Optional[persistence.Restored] = None
        #: The Kueue API versions served, preferred first: both by default (Kueue v0.15 to v0.19),
        #: ("v1beta2",) as Kueue v0.20 ships, ("v1beta1",) as Kueue before v0.15.
        self._kueue_versions = tuple(kueue_versions)
        #: The API server's port (0: any free one; a given one: a new server at an address used before).
        self._port = port
        self._given_workdir = Path(workdir).resolve() if workdir is not None else None
        self._token = secrets.token_urlsafe(32)
        self._hooks = Hooks()
        self._running: Optional[_Running] = None
        self._kubelet: Optional[LocalKubelet] = None

    # -- lifecycle --

    def start(self) -> "LocalCluster":
        if self._running is not None:
            return self
        workdir = self._given_workdir or Path(tempfile.mkdtemp(prefix="nemo-kubeflow-local-"))
        workdir.mkdir(parents=True, exist_ok=True)
        store = Store()
        if self._persist:
            self.restored = persistence.restore(store, workdir)
        registry = Registry(store)
        for namespace in ("default", "kube-system", "kube-public", TRAINER_SYSTEM_NAMESPACE):
            if not store.namespace_exists(namespace):
                registry.create(R.NAMESPACES, "", {"metadata": {"name": namespace}}, {})
        for kept in store.stored_objects(R.NAMESPACES):  # restored from a workdir kept before they existed
            registry.default_service_account(kept["metadata"]["name"])
        for name, (value, description) in SYSTEM_PRIORITY_CLASSES.items():
            if store.find(R.PRIORITYCLASSES, "", name) is None:
                registry.create(
                    R.PRIORITYCLASSES, "", {"metadata": {"name": name}, "value": value, "description": description}, {}
                )
        if store.find(R.CONFIGMAPS, TRAINER_SYSTEM_NAMESPACE, TRAINER_PUBLIC_CONFIGMAP) is None:
            registry.create(
                R.CONFIGMAPS,
                TRAINER_SYSTEM_NAMESPACE,
                {"metadata": {"name": TRAINER_PUBLIC_CONFIGMAP}, "data": {"kubeflow_trainer_version": TRAINER_VERSION}},
                {},
            )
        if self._persist:
            self._saver = persistence.Saver(store, workdir)
            self._saver.start()
        events, logs = EventRecorder(store), LogStore(silent_running=self._status_only_pods)
        credentials = make_credentials()
        server = ApiServer(
            store, registry, self._hooks, logs, self._token, credentials, self._kueue_versions, self._port
        )
        server.start()
        if self._status_only_pods:
            self._status_only = StatusOnlyKubelet(store, events)
            self._status_only.start()
        elif self._run_kubelet:
            self._kubelet = LocalKubelet(store, workdir, events, logs, server.url, self.tokens.issue)
        if trainjob_status.FEATURE_GATE in self._feature_gates:
            self.status_server = trainjob_status.StatusServer(store, tokens=self.tokens)
            self.status_server.start()
        controller = TrainerController(store, events, self.status_server)
        controller.start()
        kueue = KueueController(store, events)
        kueue.start()
        quota = QuotaController(store)
        quota.start()
        self._running = _Running(workdir, store, server, credentials, controller, kueue, quota)
        self._write_kubeconfig()
        return self

    def stop(self) -> None:
        """Stop the server, the controller and every pod's processes; remove a temporary workdir."""
        running = self._running
        if running is None:
            return
        running.server.stop()
        running.kueue.stop()
        running.quota.stop()
        running.controller.stop()
        if self.status_server is not None:
            self.status_server.stop()
            self.status_server = None
        if self._saver is not None:  # before the kubelet kills the pods: the TrainJobs they ran are recorded
            self._saver.stop()
            self._saver = None
        if self._kubelet is not None:
            self._kubelet.stop()
        if self._status_only is not None:
            self._status_only.stop()
        self._running = self._kubelet = self._status_only = None
        if self._given_workdir is None:
            shutil.rmtree(running.workdir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- connection --

    @property
    def context(self) -> str:
        return CONTEXT

    @property
    def namespace(self) -> str:
        return "default"

    @property
    def workdir(self) -> Path:
        return self._started().workdir

    @property
    def persists(self) -> bool:
        """Whether the API objects are kept in the workdir for the next start (persist=True)."""
        return self._persist

    @property
    def url(self) -> str:
        return self._started().server.url

    @property
    def ca_pem(self) -> bytes:
        """The CA (PEM) that signed the API server's certificate; the kubeconfig carries it too."""
        return self._started().credentials.ca_pem

    def ssl_context(self):
        """An `ssl.SSLContext` that trusts this cluster's API server (for raw HTTPS clients)."""
        return self._started().credentials.client_context()

    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "kubeconfig"

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "clusters": [
                {
                    "name": CONTEXT,
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(self.ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": USER, "user": {"token": self._token}}],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": USER, "namespace": "default"}}],
            "current-context": CONTEXT,
        }
        # Written aside and renamed: a client that polls for the file never reads half of it.
        fd, partial = tempfile.mkstemp(prefix=".kubeconfig-", dir=self.workdir)  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                yaml.safe_dump(config, f, sort_keys=False)
            os.replace(partial, self.kubeconfig_path)
        except BaseException:
            os.unlink(partial)
            raise

    def configuration(self):
        """A `kubernetes.client.Configuration` for this cluster (e.g. for the Kubeflow SDK)."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(
            config_file=str(self.kubeconfig_path), context=CONTEXT, client_configuration=configuration
        )
        return configuration

    def api_client(self):
        """A `kubernetes.client.ApiClient` for this cluster."""
        from kubernetes import client

        return client.ApiClient(self.configuration())

    # -- inspection --

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request served so far (or since `clear_requests()`), oldest first."""
        return self._hooks.snapshot()

    def clear_requests(self) -> None:
        self._hooks.clear()

    def rotate_service_account_tokens(self) -> int:
        """A service-account token rotation: the tokens' signing key changes, the kubelet rewrites every
        running pod's projected tokens with the new key, and then the old tokens are refused (Trainer's status
        server answers 403 to them). Returns how many token files were rewritten."""
        with self.tokens.rotation():
            return self._kubelet.refresh_tokens() if self._kubelet is not None else 0

    def api_counters(self) -> list[ApiCount]:
        """Requests and response body bytes per verb and resource, as the API server counted them (every
        HTTP request: clients, the node agent; the emulated controllers read the store, not HTTP), since
        the start or `clear_api_counters()`."""
        return self._hooks.counters()

    def clear_api_counters(self) -> None:
        self._hooks.clear_counters()

    def objects(self, resource: str, namespace: Optional[str] = None) -> list[dict]:
        """Copies of the stored objects of `resource` ("configmaps", "trainjobs", ...)."""
        return self._started().store.list(R.by_name(resource), namespace)[0]

    def pod_dir(self, name: str, namespace: str = "default") -> Path:
        """Where a pod's volumes, logs and home directory are."""
        return self.workdir / "pods" / namespace / name

    def wait_for(self, predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.05) -> T:
        """Poll `predicate` until it returns something truthy; return that. TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout}s")
            time.sleep(interval)

    # -- test hooks --

    def inject_fault(
        self,
        *,
        verb: Optional[str] = None,
        resource: Optional[str] = None,
        name: Optional[str] = None,
        nth: Optional[int] = None,
        status: Optional[int] = None,
        reason: Optional[str] = None,
        message: Optional[str] = None,
        retry_after: Optional[int] = None,
        delay: float = 0.0,
        drop_connection: bool = False,
        times: int = 1,
    ) -> FaultHandle:
        """Make matching requests fail. Filters (`verb`, `resource` like "trainjobs" or "pods/log",
        `name`) narrow the requests counted; `nth` (1-based, counting matching requests from now)
        picks which fails first; `times` how many fail. A failure answers a Status with `status`
        (500 unless the fault is only a `delay`), `reason`, `message` and a `Retry-After` header,
        waits `delay` seconds first, or closes the connection without an answer (`drop_connection`: open
        watches that match break too, as when the API server goes away)."""
        return self._hooks.add_fault(
            Fault(verb, resource, name, nth, status, reason, message, retry_after, delay, drop_connection, times)
        )

    def log_streams(self) -> list[str]:
        """The pods (``namespace/name``) of the ``follow`` streams of their logs open now, one entry per
        stream. A stream whose client went away is counted until the server next writes to it (the
        container's next output or its end)."""
        return [f"{h.namespace}/{h.pod}" for h in self._hooks.log_streams()]

    def cut_log_streams(self, pod: Optional[str] = None, *, abrupt: bool = True) -> int:
        """Close the open ``follow`` streams of pods' logs (of the pod named ``pod`` only, if given)
        while their containers run, as an API server or a proxy in between may: ``abrupt`` drops
        the connection without the answer's last chunk (a server going away), otherwise the answer
        ends as if the container had. Returns how many were cut."""
        return self._hooks.cut_log_streams(pod, abrupt)

    def deny(self, verb: str, resource: str, namespace: Optional[str] = None) -> None:
        """RBAC: answer `verb` on `resource` ("configmaps", "pods/log", "*") with 403 Forbidden."""
        self._hooks.deny(verb, resource, namespace)

    def allow_all(self) -> None:
        self._hooks.allow_all()

    def add_virtual_nodes(self, *names: str) -> None:
        """Nodes the local kubelet schedules onto (virtual_nodes.py): from now on each pod is bound to
        one of them that fits its node selector and affinity, instead of the one local node."""
        store = self._started().store
        for name in names:
            store.create(R.NODES, virtual_nodes.node_object(name))

    def end_pods(self, label_selector: str, exit_code: int = 0, namespace: str = "default") -> list[str]:
        """With `status_only_pods`: end the running pods matching `label_selector` as if their containers
        exited with `exit_code` (0: Succeeded, else Failed). Returns their names."""
        self._started()
        if self._status_only is None:
            raise RuntimeError("end_pods needs LocalCluster(status_only_pods=True): other pods end by themselves")
        return self._status_only.end_pods(namespace, label_selector, exit_code)

    def lose_node(self, name: str) -> list[str]:
        """Fault a node the way a lost (then returning) node is handled: its pods are marked
        ``DisruptionTarget`` and deleted (faults.lose_node). Returns the pods' names."""
        kubelet = self._processes("lose_node")
        return lose_node(self._started().store, kubelet.events, kubelet, name)

    def rebuild_from_older_copy(self, name: str, namespace: str = "default") -> None:
        """The next time Trainer builds TrainJob ``name``'s JobSet again after a delete, it builds it from the
        TrainJob as it was before its last spec change, once: as the real Trainer does when its informer
        cache has the JobSet's delete before that change."""
        self._started().controller.older_copy_next(namespace, name)

    def oom_kill(self, pod: str, container: str = "node", namespace: str = "default") -> None:
        """Kill a running container as the kernel's OOM killer does (exit 137, reason OOMKilled)."""
        kubelet = self._processes("oom_kill")
        oom_kill(kubelet, self._started().store, namespace, pod, container)

    def issue_api_token(self, seconds: float = 3600) -> str:
        """A bearer token the API server takes for ``seconds`` (or until ``revoke_api_token``) as the
        kubeconfig's user; then a request with it gets ``401 Unauthorized``, as a revoked or expired bound
        service-account token does on kube-apiserver. Until this server stops."""
        return self._started().server.api_tokens.issue(seconds)

    def revoke_api_token(self, token: str) -> None:
        self._started().server.api_tokens.revoke(token)

    def create_namespace(self, name: str) -> dict:
        return self._started().server.registry.create(R.NAMESPACES, "", {"metadata": {"name": name}}, {}).body

    def _processes(self, hook: str) -> LocalKubelet:
        """The kubelet that runs pods as processes; RuntimeError if the cluster runs none (or is not started)."""
        self._started()
        if self._kubelet is None:
            raise RuntimeError(
                f"{hook} needs pods that run as processes: not with status_only_pods=True or run_kubelet=False"
            )
        return self._kubelet

    def _started(self) -> _Running:
        """The running parts; RuntimeError before start() or after stop()."""
        if self._running is None:
            raise RuntimeError("the local cluster is not started: call start() or use it as a context manager")
        return self._running
