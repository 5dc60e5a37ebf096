"""A node agent: our kubelet (kubelet.py) serving Nodes of ANY Kubernetes API server.

    python -m nemo_kubeflow_local node-agent --kubeconfig K --workdir D --node n1 --node n2:cpu=8,memory=32Gi,gpus=1

It registers each Node (allocatable cpu, memory, pods, optionally nvidia.com/gpu; Ready, and a
Lease in kube-node-lease when the server serves them) and keeps the heartbeat fresh, watches the
pods bound to its Nodes (`spec.nodeName`, set by the real kube-scheduler), runs them as local
processes exactly as the local cluster's kubelet does, reports their status through `pods/status`,
deletes a deleted pod (grace 0, uid precondition) once its processes are gone, and serves
`GET /containerLogs/<ns>/<pod>/<container>` over HTTPS on 127.0.0.1 at the port in each Node's
`status.daemonEndpoints.kubeletEndpoint`, so that the API server's `pods/log` works.

The API server must reach it: the Nodes' only address is `InternalIP 127.0.0.1` (start
kube-apiserver with `--kubelet-preferred-address-types=InternalIP`, the default order has it), and
its certificate is self-signed, so leave `--kubelet-certificate-authority` unset (the API server then
does not verify the kubelet's certificate). Client certificates are not checked: the endpoint
listens on loopback only.

Pods share the host's network here. Two rewrites stand in for what the cluster's network gives
(see `PodNetwork`): the pod DNS names of a pod's subdomain (the JobSet's headless Service,
`<job>-node-0-0.<job>[.<ns>[.svc[.cluster.local]]]`) are replaced by 127.0.0.1 in the container's
env values and args, and each declared `containerPort` is moved to a free host port chosen per
subdomain (per JobSet: all its pods agree), in env values that are that port (`PET_MASTER_PORT`)
and in `host:port` strings of the mapped names.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Optional, Sequence

from nemo_kubeflow_local.apiserver.apierrors import ApiError
from nemo_kubeflow_local.apiserver.container_logs import LogStore, stream
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.apiserver.tls import make_credentials
from nemo_kubeflow_local.constants import HOSTNAME_LABEL, KUBELET_VERSION, POD_IP
from nemo_kubeflow_local.kubelet.apiclient import ApiClient, ApiRequestError, NotFound
from nemo_kubeflow_local.kubelet.kubelet import Kubelet, PodWorker
from nemo_kubeflow_local.names import DNS1123_LABEL_FORMAT
from nemo_kubeflow_local.quantity import parse_quantity
from nemo_kubeflow_local.timeutil import now_micro, now_rfc3339

logger = logging.getLogger(__name__)

#: Seconds between heartbeats (the kubelet's nodeStatusUpdateFrequency and lease renewal).
HEARTBEAT_SECONDS = 10.0
LEASE_DURATION = 40
LEASE_NAMESPACE = "kube-node-lease"
#: A watch is restarted after this long, as client-go's reflector does.
WATCH_TIMEOUT = 300


@dataclass(frozen=True)
class NodeSpec:
    """One Node the agent registers: its name and what it offers the scheduler."""

    name: str
    cpu: str = str(os.cpu_count() or 1)
    memory: str = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // 2**20}Mi"
    gpus: int = 0
    pods: int = 110
    labels: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> "NodeSpec":
        """`name[:cpu=N,memory=Q,gpus=N,pods=N]`."""
        name, _, options = text.partition(":")
        values: dict = {}
        for item in filter(None, options.split(",")):
            key, sep, value = item.partition("=")
            if not sep or key not in ("cpu", "memory", "gpus", "pods"):
                raise ValueError(f"--node {text!r}: {item!r} is not one of cpu=, memory=, gpus=, pods=")
            values[key] = int(value) if key in ("gpus", "pods") else value
        return cls(name, **values)

    def resources(self) -> dict[str, str]:
        found = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods), "ephemeral-storage": "100Gi"}
        if self.gpus:
            found["nvidia.com/gpu"] = str(self.gpus)
        return found


# --- the network the pods share ---------------------------------------------------------------------------


class PodNetwork:
    """Stand-ins for pod DNS and per-pod ports on one host network (see the module's docstring)."""

    def __init__(self, service_hosts: Sequence[str] = ()) -> None:
        self._lock = threading.Lock()
        self._ports: dict[tuple[str, str, int], int] = {}
        hosts = "|".join(re.escape(h) for h in service_hosts)
        self._services = re.compile(rf"(?<![\w.-])({hosts})(\.cluster\.local)?(?![\w.-])") if hosts else None

    def host_port(self, namespace: str, group: str, port: int) -> int:
        """The free host port standing for `port` of every pod of `group` (a subdomain)."""
        with self._lock:
            key = (namespace, group, port)
            if key not in self._ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    self._ports[key] = s.getsockname()[1]
            return self._ports[key]

    def rewrite(self, pod: dict, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        spec, namespace = pod["spec"], pod["metadata"].get("namespace", "default")
        group = spec.get("subdomain") or pod["metadata"]["name"]
        ports = {
            p["containerPort"]: self.host_port(namespace, group, p["containerPort"])
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if p.get("containerPort")
        }
        names = None
        if spec.get("subdomain"):
            sub, ns = re.escape(spec["subdomain"]), re.escape(namespace)
            names = re.compile(
                rf"(?<![\w.-]){DNS1123_LABEL_FORMAT}\.{sub}"
                rf"(\.{ns}(\.svc(\.cluster\.local)?)?)?(?![\w.-])(:(?P<port>\d+))?"
            )

        def text(value: str) -> str:
            if self._services is not None:
                value = self._services.sub(POD_IP, value)
            if names is None:
                return value

            def host(m: re.Match) -> str:
                port = m.group("port")
                if port is None:
                    return POD_IP
                return f"{POD_IP}:{ports.get(int(port), int(port))}"

            return names.sub(host, value)

        def variable(name: str, value: str) -> str:
            if "PORT" in name and value.isdigit() and int(value) in ports:
                return str(ports[int(value)])
            return text(value)

        return [text(a) for a in argv], {k: variable(k, v) for k, v in env.items()}


class GpuDevices:
    """The device plugin's part: each Node's GPUs are host device indices (the first node's first,
    in the order the nodes are given), and a container that asks for `nvidia.com/gpu` gets that
    many of its node's free ones, the same on a restart, until its pod ends."""

    def __init__(self, nodes: Sequence[NodeSpec]):
        self._lock = threading.Lock()
        self._free: dict[str, list[int]] = {}
        self._node_of: dict[int, str] = {}
        first = 0
        for node in nodes:
            self._free[node.name] = list(range(first, first + node.gpus))
            self._node_of.update({device: node.name for device in self._free[node.name]})
            first += node.gpus
        self._held: dict[str, dict[str, list[int]]] = {}  # pod uid -> container -> devices

    def assign(self, pod: dict, container: dict) -> Optional[list[int]]:
        """The container's devices; None when no Node of this agent has GPUs (the environment is
        then left alone: a CPU-only setup on a machine with GPUs)."""
        if not self._node_of:
            return None
        node = pod["spec"].get("nodeName", "")
        limits = (container.get("resources") or {}).get("limits") or {}
        wanted = int(parse_quantity(str(limits.get("nvidia.com/gpu", 0))) or 0)
        with self._lock:
            held = self._held.setdefault(pod["metadata"]["uid"], {})
            if container["name"] not in held:
                # The scheduler counted them against allocatable: they are free unless pods were
                # bound by hand beyond it (then the container gets fewer).
                free = self._free.get(node, [])
                held[container["name"]], self._free[node] = free[:wanted], free[wanted:]
            return held[container["name"]]

    def release(self, uid: str) -> None:
        with self._lock:
            for devices in self._held.pop(uid, {}).values():
                for device in devices:
                    node = self._node_of[device]
                    self._free[node] = sorted(self._free[node] + [device])


# --- the back end: an API server through the kubernetes client ---------------------------------------------


class ApiEvents:
    """Events as a kubelet records them (core/v1, source = kubelet on the node)."""

    def __init__(self, api: ApiClient):
        self.api = api

    def record(
        self, involved: dict, type_: str, reason: str, message: str, component: str, field_path: Optional[str] = None
    ) -> None:
        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"
        node = (involved.get("spec") or {}).get("nodeName", "")
        ref = {"kind": "Pod", "apiVersion": "v1", "namespace": namespace, "name": meta["name"], "uid": meta.get("uid")}
        if field_path:
            ref["fieldPath"] = field_path
        stamp = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": ref,
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": component, "host": node},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": component,
            "reportingInstance": node,
        }
        try:
            self.api.call("POST", f"/api/v1/namespaces/{namespace}/events", body=event, retry=False)
        except ApiRequestError as error:
            logger.debug("event %s on %s/%s not recorded: %s", reason, namespace, meta["name"], error)


class ApiBackend:
    """The kubelet's back end on a real API server: reads, status writes and deletes over HTTP."""

    def __init__(self, api: ApiClient, network: PodNetwork, gpus: "GpuDevices"):
        self.api, self.pod_network, self.gpus = api, network, gpus
        self.events = ApiEvents(api)
        self.api_url = api.host
        self._lock = threading.Lock()
        self._status: dict[str, tuple[threading.Lock, dict]] = {}

    def find(self, rt: ResourceType, namespace: str, name: str) -> Optional[dict]:
        try:
            return self.api.call("GET", f"/api/v1/namespaces/{namespace}/{rt.plural}/{name}")
        except NotFound:
            return None

    def service_account_token(self, namespace: str, service_account: str, audience: str, seconds: int) -> str:
        """The TokenRequest API, as the kubelet uses it for a projected token."""
        answer = self.api.call(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"audiences": [audience], "expirationSeconds": seconds},
            },
        )
        return str(answer["status"]["token"])

    def bind(self, worker: PodWorker) -> bool:
        return True  # the scheduler bound it: that is how it got here

    def write_status(self, worker: PodWorker, change: Callable[[dict], None]) -> None:
        with self._lock:
            lock, status = self._status.setdefault(
                worker.uid, (threading.Lock(), copy.deepcopy(worker.pod.get("status") or {}))
            )
        # One write at a time per pod, in order: the last one written is the newest state.
        with lock:
            change(status)
            body = {"metadata": {"uid": worker.uid}, "status": status}
            try:
                # A strategic merge, as the kubelet's: conditions merge by type, so those of other
                # components (DisruptionTarget from the taint-eviction controller) stay.
                self.api.call(
                    "PATCH",
                    f"/api/v1/namespaces/{worker.ns}/pods/{worker.name}/status",
                    body=body,
                    content_type="application/strategic-merge-patch+json",
                )
            except ApiRequestError as error:
                if getattr(error, "status", 0) not in (404, 409, 422):  # gone, or replaced by another uid
                    logger.warning("pod %s/%s: %s", worker.ns, worker.name, error)

    def remove_pod(self, namespace: str, name: str, uid: str) -> None:
        with self._lock:
            self._status.pop(uid, None)
        try:
            self.api.call(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
            )
        except ApiRequestError as error:
            if getattr(error, "status", 0) not in (404, 409):
                logger.warning("pod %s/%s: %s", namespace, name, error)

    def network(
        self, pod: dict, container: dict, argv: list[str], env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        argv, env = self.pod_network.rewrite(pod, argv, env)
        devices = self.gpus.assign(pod, container)
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = env["NVIDIA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        return argv, env

    def pod_finished(self, worker: PodWorker) -> None:
        self.gpus.release(worker.uid)


# --- the kubelet endpoint: container logs over HTTPS ------------------------------------------------------


class _LogHandler(BaseHTTPRequestHandler):
    server: "_KubeletServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        logger.debug("kubelet endpoint: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if parts == ["healthz"]:
            return self._answer(200, b"ok")
        if len(parts) != 4 or parts[0] != "containerLogs":
            return self._answer(404, b"404 page not found\n")
        _, namespace, pod_name, container = parts
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        query["container"] = container
        pod = self.server.find_pod(namespace, pod_name)
        if pod is None:
            return self._answer(404, f'pod "{pod_name}" in namespace "{namespace}" not found on this node\n'.encode())
        try:
            log = self.server.logs.select_for(pod, query)
        except ApiError as error:
            return self._answer(error.code, error.message.encode())
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in stream(log, query, self.server.stopping):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
        self.close_connection = True

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _KubeletServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, find_pod: Callable[[str, str], Optional[dict]], logs: LogStore, serving_cert: Optional[tuple[Path, Path]]
    ):
        super().__init__((POD_IP, 0), _LogHandler)
        self.find_pod, self.logs = find_pod, logs
        self.stopping = threading.Event()
        if serving_cert is None:
            # The API server is told not to verify kubelets (no --kubelet-certificate-authority).
            context = make_credentials("nemo-kubeflow-node-agent").server_context()
        else:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*serving_cert)
        self.socket = context.wrap_socket(self.socket, server_side=True)


# --- the agent ---------------------------------------------------------------------------------------------


class NodeAgent:
    """Registers `nodes` on the API server of `kubeconfig` and runs the pods bound to them.

    Args:
        kubeconfig: the API server to attach to (its credentials must allow the kubelet's verbs:
            nodes and nodes/status, pods and pods/status, events, leases, configmaps/secrets get).
        nodes: the Nodes to serve.
        workdir: where pod directories, PVC directories and logs go.
        unregister: delete the Nodes when the agent stops (their pods are then garbage-collected).
        serving_cert: (certificate, key) files of the kubelet endpoint, for an API server started
            with `--kubelet-certificate-authority` (the certificate must name IP 127.0.0.1). None: a
            self-signed one, for an API server that does not verify kubelets.
        service_hosts: Service DNS names (``<service>.<namespace>.svc``) of servers that run on this host,
            such as Trainer's status server: the pods' env and args name 127.0.0.1 instead (same port).
    """

    def __init__(
        self,
        kubeconfig: str | Path,
        nodes: Sequence[NodeSpec],
        workdir: str | Path,
        *,
        context: Optional[str] = None,
        unregister: bool = True,
        serving_cert: Optional[tuple[str | Path, str | Path]] = None,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        service_hosts: Sequence[str] = (),
    ):
        self.heartbeat_seconds = heartbeat_seconds
        self.serving_cert = (Path(serving_cert[0]), Path(serving_cert[1])) if serving_cert else None
        if not nodes:
            raise ValueError("a node agent needs at least one node")
        self.nodes = list(nodes)
        self.workdir = Path(workdir).resolve()
        self.unregister = unregister
        self.api = ApiClient(str(kubeconfig), context)
        self.logs = LogStore()
        backend = ApiBackend(self.api, PodNetwork(service_hosts), GpuDevices(self.nodes))
        self.kubelet = Kubelet(backend, self.workdir, self.logs)
        self.kubelet.recheck_seconds = 1.0  # no watch on ConfigMaps/Secrets/claims: look again soon
        self._server: Optional[_KubeletServer] = None
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._leases = True
        self._ran: set[str] = set()  # uids of the pods this agent started (kept: they never run twice)
        #: The pods bound here as last seen, by (namespace, name): their logs stay readable until deleted.
        self._pods: dict[tuple[str, str], dict] = {}
        self._pods_lock = threading.Lock()

    @property
    def port(self) -> int:
        """The kubelet endpoint's port (daemonEndpoints.kubeletEndpoint.Port of every Node)."""
        assert self._server is not None, "the agent is not started"
        return self._server.server_address[1]

    def start(self) -> "NodeAgent":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._server = _KubeletServer(self._pod, self.logs, self.serving_cert)
        self._spawn(self._server.serve_forever, "kubelet-endpoint")
        for node in self.nodes:
            self._register(node)
        self._spawn(self._heartbeats, "node-heartbeat")
        for node in self.nodes:
            self._spawn(functools.partial(self._follow_pods, node.name), f"pods-of-{node.name}")
        return self

    def stop(self) -> None:
        """Kill every pod's processes (returns once none is left); unregister the Nodes."""
        self._stopping.set()
        self.kubelet.stop()
        if self._server is not None:
            self._server.stopping.set()
            self._server.shutdown()
            self._server.server_close()
        if self.unregister:
            for node in self.nodes:
                try:
                    self.api.call("DELETE", f"/api/v1/nodes/{node.name}", retry=False)
                except ApiRequestError as error:
                    logger.info("node %s: %s", node.name, error)

    def __enter__(self) -> "NodeAgent":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- the Nodes --

    def _register(self, node: NodeSpec) -> None:
        labels = {
            HOSTNAME_LABEL: node.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine),
            **node.labels,
        }
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "labels": labels}, "spec": {}}
        try:
            self.api.call("POST", "/api/v1/nodes", body=body)
        except ApiRequestError as error:
            if getattr(error, "status", 0) != 409:
                raise
            self.api.call(
                "PATCH",
                f"/api/v1/nodes/{node.name}",
                body={"metadata": {"labels": labels}},
                content_type="application/merge-patch+json",
            )
        self._report(node, first=True)

    def _report(self, node: NodeSpec, first: bool = False) -> None:
        now = now_rfc3339()
        conditions = [
            {
                "type": kind,
                "status": "False",
                "reason": f"KubeletHas{reason}",
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            for kind, reason, message in (
                ("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"),
            )
        ]
        conditions.append(
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "nemo-kubeflow node agent is posting ready status",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        )
        status: dict = {"conditions": conditions}
        if first:
            status.update(
                capacity=node.resources(),
                allocatable=node.resources(),
                addresses=[{"type": "InternalIP", "address": POD_IP}, {"type": "Hostname", "address": node.name}],
                daemonEndpoints={"kubeletEndpoint": {"Port": self.port}},
                nodeInfo={
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                    "kernelVersion": os.uname().release,
                    "osImage": "nemo-kubeflow node agent",
                    "containerRuntimeVersion": "local://processes",
                    "kubeletVersion": f"v{KUBELET_VERSION}",
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            )
        else:  # keep each condition's transition time: only the heartbeat moves
            current = self.api.call("GET", f"/api/v1/nodes/{node.name}")
            before = {c["type"]: c for c in (current.get("status") or {}).get("conditions") or []}
            for condition in conditions:
                old = before.get(condition["type"])
                if old and old.get("status") == condition["status"] and old.get("lastTransitionTime"):
                    condition["lastTransitionTime"] = old["lastTransitionTime"]
        self.api.call(
            "PATCH",
            f"/api/v1/nodes/{node.name}/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )
        self._renew_lease(node.name)

    def _renew_lease(self, name: str) -> None:
        if not self._leases:
            return
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION, "renewTime": now_micro()}
        try:
            try:
                self.api.call(
                    "PATCH", f"{path}/{name}", body={"spec": spec}, content_type="application/merge-patch+json"
                )
            except NotFound:
                self.api.call(
                    "POST",
                    path,
                    body={
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": name, "namespace": LEASE_NAMESPACE},
                        "spec": spec,
                    },
                )
        except NotFound:
            self._leases = False  # no kube-node-lease (or no Lease API): the Ready heartbeat alone
            logger.info("no Lease API or %s namespace: node heartbeats go through status only", LEASE_NAMESPACE)

    def _heartbeats(self) -> None:
        while not self._stopping.wait(self.heartbeat_seconds):
            for node in self.nodes:
                try:
                    self._report(node)
                except ApiRequestError as error:
                    logger.warning("node %s heartbeat: %s", node.name, error)

    # -- the pods --

    def _follow_pods(self, node: str) -> None:
        """List and watch the pods bound to `node`, handing each change to the kubelet."""
        selector = f"spec.nodeName={node}"
        known: set[str] = set()
        while not self._stopping.is_set():
            try:
                listed = self.api.call("GET", "/api/v1/pods", query=[("fieldSelector", selector)])
                seen = set()
                for pod in listed.get("items") or []:
                    seen.add(pod["metadata"]["uid"])
                    self._dispatch("ADDED" if pod["metadata"]["uid"] not in known else "MODIFIED", pod, known)
                for uid in known - seen:  # deleted while we were not watching
                    self._dispatch("DELETED", {"metadata": {"uid": uid}}, known)
                self._watch(selector, listed["metadata"]["resourceVersion"], known)
            except ApiRequestError as error:
                if self._stopping.is_set():
                    return
                logger.warning("pods of node %s: %s; listing again", node, error)
                self._stopping.wait(1.0)
            except Exception:  # noqa: BLE001 - keep following: a dropped watch must not end the agent
                if self._stopping.is_set():
                    return
                logger.exception("pods of node %s", node)
                self._stopping.wait(1.0)

    def _watch(self, selector: str, resource_version: str, known: set[str]) -> None:
        resp = self.api.call(
            "GET",
            "/api/v1/pods",
            stream=True,
            retry=False,
            query=[
                ("fieldSelector", selector),
                ("watch", "true"),
                ("resourceVersion", resource_version),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", str(WATCH_TIMEOUT)),
            ],
        )
        pending = b""
        try:
            for chunk in resp.stream(64 * 1024, decode_content=True):
                if self._stopping.is_set():
                    return
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in filter(None, lines):
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        return  # 410 Gone and the like: list again
                    if event["type"] != "BOOKMARK":
                        self._dispatch(event["type"], event["object"], known)
        finally:
            resp.release_conn()

    def _pod(self, namespace: str, name: str) -> Optional[dict]:
        with self._pods_lock:
            return self._pods.get((namespace, name))

    def _dispatch(self, event: str, pod: dict, known: set[str]) -> None:
        uid = pod["metadata"]["uid"]
        with self._pods_lock:
            key = (pod["metadata"].get("namespace"), pod["metadata"].get("name"))
            if event == "DELETED":
                self._pods = {k: v for k, v in self._pods.items() if v["metadata"]["uid"] != uid}
            else:
                self._pods[key] = pod
        if event == "DELETED":
            known.discard(uid)
            if self.kubelet.knows(uid):
                self.kubelet.pod_changed("DELETED", pod)
            return
        known.add(uid)
        if self.kubelet.knows(uid) or pod["metadata"].get("deletionTimestamp"):
            self.kubelet.pod_changed("MODIFIED", pod)  # deletion of one running, or of one nothing runs
            return
        if uid in self._ran:
            return  # it ran here and finished: later events are our own status writes
        status = pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return  # finished before this agent started
        if status.get("startTime"):
            self._lost(pod)  # it ran before this agent started: its processes are gone
            return
        self._ran.add(uid)
        self.kubelet.pod_changed("ADDED", pod)

    def _lost(self, pod: dict) -> None:
        meta = pod["metadata"]
        body = {
            "metadata": {"uid": meta["uid"]},
            "status": {
                "phase": "Failed",
                "reason": "NodeAgentRestarted",
                "message": "the node agent that ran this pod's processes stopped; they are gone",
            },
        }
        try:
            self.api.call(
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                body=body,
                content_type="application/merge-patch+json",
            )
        except ApiRequestError as error:
            logger.warning("pod %s/%s: %s", meta["namespace"], meta["name"], error)
