"""Run the real upstream control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and the Kubeflow Trainer, JobSet and Kueue controller managers, as local processes.

    with RealControlPlane(build_info, workdir) as cp:
        cp.kubeconfig_path      # token kubeconfig (user in system:masters), CA embedded
        cp.create_namespace()   # a fresh namespace
        cp.register_node("n1", cpu="8", memory="32Gi")

Every process is started in its own process group (and dies with the test process through
PR_SET_PDEATHSIG), and `stop()` (also run by `__exit__` and at interpreter exit) sends SIGTERM to each
group, then SIGKILL after a grace period, by PID: nothing it started is left running.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import datetime
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

try:  # imported as the package `controlplane` (tests) or run from this folder
    from . import manifests
except ImportError:  # pragma: no cover
    import manifests

#: service CIDR the API server allocates ClusterIPs from (nothing routes it: there is no kube-proxy)
SERVICE_CIDR = "10.96.0.0/16"
KUEUE_NAMESPACE = "kueue-system"
#: Kueue v0.19 loads a metrics certificate from this fixed path whenever its internal certificate
#: management is off (cmd/kueue/main.go), even with metrics disabled: it must exist.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
#: the Kueue integrations enabled (their CRDs are installed, their webhooks registered)
KUEUE_FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob")
#: Set to `unserved` to install Kueue's CRDs with v1beta1 `served: false`, as Kueue v0.20 ships them
#: (kueue#14558): the real stage's Kueue then serves only v1beta2.
KUEUE_V1BETA1_ENV = "NEMO_KUBEFLOW_REAL_KUEUE_V1BETA1"
#: The ConfigMap where Trainer's manifests publish its version, readable by every authenticated user.
TRAINER_NAMESPACE = "kubeflow-system"
TRAINER_PUBLIC = "kubeflow-trainer-public"
#: Trainer's alpha feature gates the stage turns on: TrainJobStatus runs its status server (pkg/statusserver),
#: whose URL in the pods names the webhook Service (the node agent maps it to this host: TRAINER_SERVICE_HOST).
TRAINER_FEATURE_GATES = {"TrainJobStatus": True}
TRAINER_SERVICE_HOST = f"kubeflow-trainer-controller-manager.{TRAINER_NAMESPACE}.svc"
#: The TrainJobStatus plugin copies the status server's CA from this Secret into each TrainJob's namespace.
TRAINER_WEBHOOK_SECRET = "kubeflow-trainer-webhook-cert"
#: Fixed paths of Trainer v2.3.0's status server: it serves the certificate of this directory (not the webhook
#: server's $TMPDIR one), and finds the cluster's OIDC issuer in the `iss` of this token (its own, in a pod).
TRAINER_STATUS_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
POD_SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
#: Those paths are one per machine: a second control plane started beside the first would overwrite its status
#: server's certificate and token (each has its own CA). Each running control plane holds this lock.
FIXED_PATHS_LOCK = Path("/tmp/nemo-kubeflow-real-control-plane.lock")
#: Kueue v0.19's visibility API (feature gate VisibilityOnDemand) is an aggregated API server inside its controller
#: manager; with Kueue's own certificate management off it serves the pair in this fixed folder
#: (pkg/visibility/server.go `certDir`). Its APIServices skip TLS verification (insecureSkipTLSVerify, as upstream
#: installs them), so any pair will do, another control plane's too.
KUEUE_VISIBILITY_CERTS = Path("/visibility")
#: The name in the client certificate kube-apiserver's aggregator proxies with (--proxy-client-cert-file): the one
#: name an aggregated API server takes the request headers (X-Remote-User...) from (--requestheader-allowed-names).
FRONT_PROXY_CLIENT = "front-proxy-client"


class _MachineLock:
    """``FIXED_PATHS_LOCK``, held by this process while any of its control planes runs (counted: the control
    planes of one process are started and stopped by its own fixtures, one after another). A child process of
    the holder (a test that starts a second control plane beside the session's) does not wait for it: its
    control planes run without Trainer's status server, whose paths stay the holder's (``HOLDER_ENV``)."""

    #: The holder's pid, in its environment and so in its children's.
    HOLDER_ENV = "NEMO_KUBEFLOW_REAL_CONTROL_PLANE_LOCK_HOLDER"

    def __init__(self, path: Path) -> None:
        self.path, self.holders, self._file = path, 0, None
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        """Hold the lock (waiting for another process's control plane, saying so); False, without waiting, in
        a child process of the holder."""
        with self._lock:
            holder = os.environ.get(self.HOLDER_ENV)
            if self.holders == 0 and holder and holder != str(os.getpid()):
                return False
            if self.holders == 0:
                lock = open(self.path, "a+")
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    lock.seek(0)
                    print(
                        f"waiting for the real control plane of another process on this machine (lock "
                        f"{self.path}, held by {lock.read().strip() or 'an unknown process'}): Trainer's status "
                        "server reads fixed paths, one control plane at a time",
                        file=sys.stderr,
                        flush=True,
                    )
                    fcntl.flock(lock, fcntl.LOCK_EX)
                lock.seek(0)
                lock.truncate()
                lock.write(f"pid {os.getpid()}")
                lock.flush()
                self._file = lock
                os.environ[self.HOLDER_ENV] = str(os.getpid())
            self.holders += 1
            return True

    def release(self) -> None:
        with self._lock:
            if self.holders == 0:
                return
            self.holders -= 1
            if self.holders == 0 and self._file is not None:
                self._file.close()  # closing the descriptor releases the flock
                self._file = None
                os.environ.pop(self.HOLDER_ENV, None)


_machine_lock = _MachineLock(FIXED_PATHS_LOCK)


def _write_private(path: Path, data: bytes) -> None:
    """``data`` to ``path`` (mode 0600), whole or not at all: written aside, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}"
    tmp.write_bytes(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class ControlPlaneError(RuntimeError):
    """A component did not start or did not become ready; the message names it and its log."""


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that are free now. Each probe socket stays bound until all are chosen: the kernel
    may hand a closed probe's port out again, and two components given one port fail to start. Another
    process can still take a port before its component binds it; `RealControlPlane` starts again then."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def _port_taken(error: BaseException) -> bool:
    """Whether a start failed only because a component's port was taken meanwhile (its log says so)."""
    return isinstance(error, ControlPlaneError) and "address already in use" in str(error)


def _die_with_parent() -> None:
    """preexec_fn: own process group, and SIGKILL when the process that started us dies."""
    os.setpgrp()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # pragma: no cover - not glibc
        pass


class Certificates:
    """A throw-away CA, a serving certificate for 127.0.0.1/localhost and the service-account key pair."""

    def __init__(self, directory: Path):
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc)
        self._not_before = now - datetime.timedelta(minutes=5)
        self._not_after = now + datetime.timedelta(days=2)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nemo-kubeflow-test-ca")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        self._ca_key, self._ca_cert = ca_key, ca_cert
        self.ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
        self.ca_crt = self._write("ca.crt", self.ca_pem)
        self.serving_crt, self.serving_key = self.issue("serving", "127.0.0.1", server=True)
        # the aggregator's client certificate towards aggregated API servers (Kueue's visibility API)
        self.front_proxy_client_crt, self.front_proxy_client_key = self.issue(
            "front-proxy-client", FRONT_PROXY_CLIENT, server=False
        )
        # the API server's client certificate towards kubelets (pods/log, exec) of the node agent
        self.kubelet_client_crt, self.kubelet_client_key = self.issue(
            "kubelet-client", "kube-apiserver-kubelet-client", organization="system:masters", server=False
        )
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key = self._write(
            "sa.key",
            sa_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )
        self.sa_pub = self._write(
            "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )

    def issue(
        self,
        name: str,
        common_name: str,
        organization: str | None = None,
        server: bool = True,
        hosts: tuple = ("127.0.0.1", "localhost"),
    ) -> tuple[Path, Path]:
        """A certificate signed by the CA; server certificates cover `hosts`. Returns (crt, key) paths."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            sans = []
            for host in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    sans.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        crt = self._write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM))
        keyfile = self._write(
            f"{name}.key",
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )
        return crt, keyfile

    def _write(self, name: str, data: bytes) -> Path:
        path = self.dir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path


class RealControlPlane:
    """The upstream control plane, started from the binaries of `build.ensure_built()`."""

    #: seconds each component gets to become ready (the first start of Kueue on 2 busy cores is slow)
    READY_TIMEOUT = 180.0
    #: seconds a component gets to exit after SIGTERM
    STOP_GRACE = 5.0

    def __init__(
        self, build_info: dict, workdir: Path, kueue_v1beta1_served: bool | None = None, *, audit: bool = False
    ):
        self.build_info = build_info
        #: Whether kube-apiserver writes an audit log of the reads a client of a job makes (``audit_events``).
        self.audit = audit
        #: Whether Kueue's CRDs serve v1beta1 (default: yes, unless $NEMO_KUBEFLOW_REAL_KUEUE_V1BETA1=unserved).
        self.kueue_v1beta1_served = (
            os.environ.get(KUEUE_V1BETA1_ENV, "") != "unserved"
            if kueue_v1beta1_served is None
            else kueue_v1beta1_served
        )
        self.binaries = {k: Path(v) for k, v in build_info["binaries"].items()}
        self.module_dirs = {k: Path(v["module_dir"]) for k, v in build_info["components"].items()}
        self.workdir = Path(workdir)
        self.processes: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.token = secrets.token_hex(16)
        self._stopped = False
        self._holds_machine_lock = False

    # ------------------------------------------------------------------ lifecycle
    #: Starts tried when a port chosen free was taken by another process before its component bound it.
    START_ATTEMPTS = 3

    def __enter__(self) -> "RealControlPlane":
        atexit.register(self.stop)
        for attempt in range(1, self.START_ATTEMPTS + 1):
            try:
                self.start()
                return self
            except BaseException as error:
                if attempt < self.START_ATTEMPTS and _port_taken(error):
                    self._discard_start(attempt)
                    continue
                self.stop()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _discard_start(self, attempt: int) -> None:
        """Undo a start that lost a port: stop what it started and keep its logs (renamed by attempt); the
        next start chooses new ports and a new etcd data directory."""
        for _, proc in list(self.processes.items())[::-1]:
            self._stop_process(proc)
        self.processes.clear()
        for log in getattr(self, "_logs", []):
            log.close()
        self._logs = []
        logs = self.workdir / "logs"
        if logs.exists():
            logs.rename(self.workdir / f"logs-attempt-{attempt}")
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        # the next start makes a new CA: a TLS context made during this one trusts the old CA only
        self.__dict__.pop("_ctx", None)

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if not self._holds_machine_lock:
            self._holds_machine_lock = _machine_lock.acquire()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.certs = Certificates(self.workdir / "pki")
        names = (
            "etcd",
            "etcd-peer",
            "apiserver",
            "controller-manager",
            "scheduler",
            "trainer-webhook",
            "trainer-health",
            "trainer-status",
            "jobset-webhook",
            "jobset-health",
            "kueue-webhook",
            "kueue-health",
        )
        self.ports = dict(zip(names, free_ports(len(names))))
        self.kueue_visibility = kueue_visibility_endpoint()
        if self.kueue_visibility is None:
            print(
                "the real control plane runs Kueue without its visibility API (no place in a waiting task's "
                "status): this machine has no non-loopback IPv4 address for its Endpoints (kube-apiserver refuses "
                "loopback ones), through which kube-apiserver's aggregator would reach it",
                file=sys.stderr,
                flush=True,
            )
        self._start_etcd()
        self._start_apiserver()
        self._write_kubeconfig()
        self._wait(lambda: self._get("/readyz") == "ok", "kube-apiserver", "/readyz")
        self._start_controller_manager()
        self._start_scheduler()
        self._install_crds()
        self._ensure_namespace(KUEUE_NAMESPACE)
        self._publish_trainer_version()
        self._start_trainer()
        self._start_jobset()
        self._start_kueue()
        for name in ("trainer", "jobset", "kueue"):
            port = self.ports[f"{name}-health"]
            self._wait(lambda port=port: _http_ok(f"http://127.0.0.1:{port}/readyz"), name, "/readyz")
        self._register_webhooks()
        for name in ("trainer", "jobset", "kueue"):
            port = self.ports[f"{name}-webhook"]
            self._wait(lambda port=port: self._webhook_answers(port), name, "its webhook server")
        if self.kueue_visibility is not None:
            self._register_kueue_visibility()
        self._wait(
            lambda: self._default_service_account_exists(), "kube-controller-manager", "the `default` ServiceAccount"
        )

    def stop(self) -> None:
        """Stop every process group we started, in reverse order (controllers before the API server,
        the API server before etcd, so none waits on a dead dependency): SIGTERM, then SIGKILL after
        STOP_GRACE seconds."""
        if self._stopped:
            return
        self._stopped = True
        for _, proc in list(self.processes.items())[::-1]:
            self._stop_process(proc)
        for log in getattr(self, "_logs", []):
            log.close()
        if self._holds_machine_lock:
            _machine_lock.release()
            self._holds_machine_lock = False
        atexit.unregister(self.stop)

    def _stop_process(self, proc: subprocess.Popen) -> None:
        """SIGTERM to its group, SIGKILL after STOP_GRACE seconds (and to whatever the process itself started)."""
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.STOP_GRACE)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass

    @contextlib.contextmanager
    def trainer_feature_gates(self, gates: dict):
        """Trainer's controller manager restarted with these feature gates for the block, and with the stage's
        own (TRAINER_FEATURE_GATES) again after it, even when the block fails: for a test of a Trainer that
        runs without one (TrainJobStatus off: no status server, no env in the pods)."""
        self.restart_trainer(gates)
        try:
            yield self
        finally:
            self.restart_trainer(TRAINER_FEATURE_GATES)

    def restart_trainer(self, gates: dict) -> None:
        """Stop Trainer's controller manager, start it with ``gates``, and wait until it is ready and its
        webhook answers (TrainJobs are refused meanwhile: its webhooks fail closed)."""
        self._stop_process(self.processes["trainer-controller-manager"])
        self._start_trainer(gates)
        port = self.ports["trainer-health"]
        self._wait(lambda: _http_ok(f"http://127.0.0.1:{port}/readyz"), "trainer", "/readyz")
        self._wait(lambda: self._webhook_answers(self.ports["trainer-webhook"]), "trainer", "its webhook server")

    def pids(self) -> dict:
        return {name: proc.pid for name, proc in self.processes.items()}

    # ------------------------------------------------------------------ public helpers
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "kubeconfig"

    def log_path(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"

    def request(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json"):
        """One authenticated call to the API server; returns the decoded JSON (or text)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
        )
        with urllib.request.urlopen(req, context=self._ssl_context(), timeout=30) as resp:
            text = resp.read().decode()
        try:
            return json.loads(text)
        except ValueError:
            return text

    def create_namespace(self, prefix: str = "real") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self._ensure_namespace(name)
        self._wait(
            lambda: self._default_service_account_exists(name),
            "kube-controller-manager",
            f"the `default` ServiceAccount in {name}",
        )
        return name

    def delete_namespace(self, name: str) -> None:
        try:
            self.request("DELETE", f"/api/v1/namespaces/{name}")
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise

    def register_node(
        self,
        name: str,
        cpu: str = "8",
        memory: str = "32Gi",
        gpus: int = 0,
        labels: dict | None = None,
        kubelet_port: int | None = None,
        ready: bool = True,
    ) -> dict:
        """Create a Node with this capacity (and `nvidia.com/gpu` when gpus > 0) and mark it Ready.

        This only registers the object (what `kubelet --register-node` does first); a node agent must
        keep its Lease renewed and run the pods bound to it. `kubelet_port` is the agent's HTTPS port
        (daemonEndpoints), through which the API server reaches `pods/log`.
        """
        capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
        if gpus:
            capacity["nvidia.com/gpu"] = str(gpus)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **(labels or {}),
                },
            },
        }
        created = self.request("POST", "/api/v1/nodes", node)
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady",
                    "message": "registered by the test control plane",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
        if kubelet_port:
            status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": kubelet_port}}
        return (
            self.request(
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                {"status": status},
                content_type="application/strategic-merge-patch+json",
            )
            or created
        )

    def install_trainer_runtimes(self, names: tuple = ("torch_distributed.yaml",)) -> list:
        """Install Trainer's own ClusterTrainingRuntimes from its module (through its webhook)."""
        created = []
        for doc in manifests.runtimes(self.module_dirs["trainer"], names):
            created.append(self._apply(doc, "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"))
        return created

    # ------------------------------------------------------------------ components
    def _spawn(self, name: str, argv: list, env: dict | None = None) -> subprocess.Popen:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path(name), "ab")
        self._logs = getattr(self, "_logs", []) + [log]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=self.workdir,
            preexec_fn=_die_with_parent,
        )
        self.processes[name] = proc
        return proc

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                str(self.binaries["etcd"]),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self) -> None:
        tokens = self.workdir / "pki" / "tokens.csv"
        fd = os.open(tokens, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f'{self.token},test-admin,test-admin,"system:masters"\n')
        c = self.certs
        self._spawn(
            "kube-apiserver",
            [
                str(self.binaries["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports['apiserver']}",
                f"--tls-cert-file={c.serving_crt}",
                f"--tls-private-key-file={c.serving_key}",
                f"--client-ca-file={c.ca_crt}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                f"--service-account-key-file={c.sa_pub}",
                f"--service-account-signing-key-file={c.sa_key}",
                # The first issuer signs and is discovered (/.well-known/openid-configuration): Trainer's status
                # server verifies the pods' tokens through it, so it is this server's own address.
                f"--service-account-issuer={self.server}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-jwks-uri={self.server}/openid/v1/jwks",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # loopback is not a valid Endpoints address: no `kubernetes` Service endpoints
                "--endpoint-reconciler-type=none",
                f"--kubelet-client-certificate={c.kubelet_client_crt}",
                f"--kubelet-client-key={c.kubelet_client_key}",
                f"--kubelet-certificate-authority={c.ca_crt}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--cert-dir={self.workdir / 'pki' / 'apiserver'}",
                "--profiling=false",
                # the aggregation layer (Kueue's visibility API): the aggregator proxies with this client
                # certificate and the user in request headers, and reaches the APIService's Service through its
                # endpoints (no kube-proxy routes its ClusterIP here)
                f"--requestheader-client-ca-file={c.ca_crt}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={c.front_proxy_client_crt}",
                f"--proxy-client-key-file={c.front_proxy_client_key}",
                "--enable-aggregator-routing=true",
                *self._audit_flags(),
            ],
        )

    #: The audit policy of ``audit=True``: one event per request as it is received (so a watch or a log stream
    #: counts from its start, as the local server counts), with who sent it, for the reads a client of a job
    #: makes and ``/version``; nothing else.
    AUDIT_POLICY = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["ResponseStarted", "ResponseComplete", "Panic"],
        "rules": [
            {
                "level": "Metadata",
                "verbs": ["get", "list", "watch"],
                "resources": [
                    {"group": "", "resources": ["pods", "pods/log", "events"]},
                    {"group": "trainer.kubeflow.org", "resources": ["trainjobs"]},
                    {"group": "jobset.x-k8s.io", "resources": ["jobsets"]},
                    {"group": "batch", "resources": ["jobs"]},
                    {"group": "kueue.x-k8s.io", "resources": ["workloads"]},
                ],
            },
            {"level": "Metadata", "nonResourceURLs": ["/version"]},
            {"level": "None"},
        ],
    }

    def _audit_flags(self) -> list[str]:
        if not self.audit:
            return []
        policy = self.workdir / "audit-policy.json"  # JSON is YAML
        policy.write_text(json.dumps(self.AUDIT_POLICY))
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.workdir / 'audit.log'}",
            "--audit-log-format=json",
        ]

    def audit_events(self) -> list[dict]:
        """The audit log's events so far (``audit=True``): one per request received, with its ``verb``,
        ``objectRef`` or ``requestURI``, ``userAgent`` and ``requestReceivedTimestamp``."""
        path = self.workdir / "audit.log"
        if not self.audit:
            raise RuntimeError("this control plane was started without audit=True")
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    def _component_flags(self, port_name: str) -> list:
        kubeconfig = str(self.kubeconfig_path)
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports[port_name]}",
            f"--cert-dir={self.workdir / 'pki' / port_name}",
            "--profiling=false",
        ]

    def _start_controller_manager(self) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries["kube-controller-manager"]),
                *self._component_flags("controller-manager"),
                f"--service-account-private-key-file={self.certs.sa_key}",
                f"--root-ca-file={self.certs.ca_crt}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*",
            ],
        )

    def _start_scheduler(self) -> None:
        self._spawn("kube-scheduler", [str(self.binaries["kube-scheduler"]), *self._component_flags("scheduler")])

    def _serving_cert_dir(self, component: str) -> Path:
        """controller-runtime's webhook server reads tls.crt/tls.key from its CertDir."""
        cert_dir = self.workdir / "pki" / component
        cert_dir.mkdir(parents=True, exist_ok=True)
        for name, src in (("tls.crt", self.certs.serving_crt), ("tls.key", self.certs.serving_key)):
            (cert_dir / name).write_bytes(src.read_bytes())
            os.chmod(cert_dir / name, 0o600)
        return cert_dir

    def _write_config(self, component: str, config: dict) -> Path:
        path = self.workdir / f"{component}-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _controller_env(self, component: str) -> dict:
        # Trainer's configuration has no certDir: controller-runtime then looks in
        # $TMPDIR/k8s-webhook-server/serving-certs, so each controller gets its own TMPDIR.
        tmp = self.workdir / "tmp" / component
        (tmp / "k8s-webhook-server").mkdir(parents=True, exist_ok=True)
        serving = tmp / "k8s-webhook-server" / "serving-certs"
        cert_dir = self._serving_cert_dir(component)  # written again on each start: a start again has a new CA
        if not serving.exists():
            serving.symlink_to(cert_dir)
        return {"KUBECONFIG": str(self.kubeconfig_path), "TMPDIR": str(tmp)}

    def _start_trainer(self, gates: dict = TRAINER_FEATURE_GATES) -> None:
        if not self._holds_machine_lock:
            # A second control plane in a child of the lock's holder: the status server's fixed paths are the
            # holder's (``_MachineLock``), so this Trainer runs without it.
            gates = {**gates, "TrainJobStatus": False}
        config = self._write_config(
            "trainer",
            {
                "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
                "kind": "Configuration",
                "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports['trainer-health']}"},
                "metrics": {"bindAddress": "0"},
                "webhook": {"port": self.ports["trainer-webhook"], "host": "127.0.0.1"},
                "leaderElection": {"leaderElect": False},
                "certManagement": {"enable": False},
                "statusServer": {"port": self.ports["trainer-status"]},
                "featureGates": gates,
            },
        )
        if gates.get("TrainJobStatus"):
            self._trainer_status_server_prerequisites()
        self._spawn(
            "trainer-controller-manager",
            [str(self.binaries["trainer-controller-manager"]), f"--config={config}"],
            self._controller_env("trainer"),
        )

    def _trainer_status_server_prerequisites(self) -> None:
        """What a Trainer install gives its status server: its serving certificate at the fixed path, a
        service-account token of its own (for the issuer), and the webhook Secret with the CA."""
        account = "kubeflow-trainer-controller-manager"
        self._apply(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
            f"/api/v1/namespaces/{TRAINER_NAMESPACE}/serviceaccounts",
        )
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{TRAINER_NAMESPACE}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}},
        )
        try:
            self._write_serving_pair(TRAINER_STATUS_CERT_DIR)
            _write_private(POD_SERVICE_ACCOUNT_TOKEN, answer["status"]["token"].encode())
        except OSError as e:
            raise ControlPlaneError(
                f"Trainer's status server (gate TrainJobStatus) reads fixed paths, {TRAINER_STATUS_CERT_DIR} and "
                f"{POD_SERVICE_ACCOUNT_TOKEN}, which cannot be written: {e}; make them writable by this user"
            ) from None
        self._apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": TRAINER_WEBHOOK_SECRET},
                "data": {"ca.crt": base64.b64encode(self.certs.ca_pem).decode()},
            },
            f"/api/v1/namespaces/{TRAINER_NAMESPACE}/secrets",
        )

    def _write_serving_pair(self, directory: Path) -> None:
        """Our serving certificate and key as tls.crt and tls.key in ``directory`` (a fixed path a component reads)."""
        for name, src in (("tls.crt", self.certs.serving_crt), ("tls.key", self.certs.serving_key)):
            _write_private(directory / name, src.read_bytes())

    def _start_jobset(self) -> None:
        config = self._write_config(
            "jobset",
            {
                "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
                "kind": "Configuration",
                "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports['jobset-health']}"},
                "metrics": {"bindAddress": "0"},
                "webhook": {
                    "port": self.ports["jobset-webhook"],
                    "host": "127.0.0.1",
                    "certDir": str(self._serving_cert_dir("jobset")),
                },
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
            },
        )
        self._spawn(
            "jobset-controller-manager",
            [str(self.binaries["jobset-controller-manager"]), f"--config={config}"],
            self._controller_env("jobset"),
        )

    def _kueue_metrics_certs(self) -> None:
        if (KUEUE_METRICS_CERTS / "tls.crt").is_file() and (KUEUE_METRICS_CERTS / "tls.key").is_file():
            return  # another run's; never served (metrics are off), only loaded
        try:
            self._write_serving_pair(KUEUE_METRICS_CERTS)
        except OSError as e:
            raise ControlPlaneError(
                f"Kueue needs a certificate pair in {KUEUE_METRICS_CERTS} (a fixed path in Kueue v0.19 when its "
                f"own certificate management is off) and it cannot be written: {e}; create that folder writable "
                "by this user (any tls.crt/tls.key pair will do: metrics are not served)"
            ) from None

    def _start_kueue(self) -> None:
        self._kueue_metrics_certs()
        config = self._write_config(
            "kueue",
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "namespace": KUEUE_NAMESPACE,
                "manageJobsWithoutQueueName": False,
                "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports['kueue-health']}"},
                "metrics": {"bindAddress": "0"},
                "webhook": {
                    "port": self.ports["kueue-webhook"],
                    "host": "127.0.0.1",
                    "certDir": str(self._serving_cert_dir("kueue")),
                },
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
                "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
                # the visibility API (an aggregated API server in the controller manager), where it can be reached
                "featureGates": {"VisibilityOnDemand": self.kueue_visibility is not None},
                **(
                    {
                        "visibilityServer": {
                            "bindAddress": self.kueue_visibility[0],
                            "bindPort": self.kueue_visibility[1],
                        }
                    }
                    if self.kueue_visibility
                    else {}
                ),
            },
        )
        if self.kueue_visibility is not None:
            self._kueue_visibility_certs()
        self._spawn(
            "kueue-controller-manager",
            # --kubeconfig: the visibility server's delegated authentication and authorization read it (the flag,
            # not $KUBECONFIG; without it they look for an in-cluster config)
            [
                str(self.binaries["kueue-controller-manager"]),
                f"--config={config}",
                f"--kubeconfig={self.kubeconfig_path}",
            ],
            self._controller_env("kueue"),
        )

    def _kueue_visibility_certs(self) -> None:
        try:
            self._write_serving_pair(KUEUE_VISIBILITY_CERTS)
        except OSError as e:
            raise ControlPlaneError(
                f"Kueue's visibility server reads its certificate pair from {KUEUE_VISIBILITY_CERTS} (a fixed path in "
                f"Kueue v0.19 when its own certificate management is off), which cannot be written: {e}; create that "
                "folder writable by this user"
            ) from None

    def _register_kueue_visibility(self) -> None:
        """Register Kueue's visibility API with the aggregator as Kueue's install does (its APIServices and
        `visibility-server` Service, from its module), the Service without a selector and with endpoints of
        our own, the address the visibility server listens on: an Endpoints (what the aggregator of Kubernetes
        1.32 reads) and an EndpointSlice (what it reads since 1.33); then wait until each APIService is
        Available."""
        address, port = self.kueue_visibility
        api_services = []
        for doc in manifests.kueue_visibility(self.module_dirs["kueue"]):
            if doc["kind"] == "APIService":
                api_services.append(doc)
                continue
            service = {**doc, "spec": {k: v for k, v in doc["spec"].items() if k != "selector"}}
            name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
            self._apply(service, f"/api/v1/namespaces/{namespace}/services")
            port_names = [p["name"] for p in service["spec"]["ports"]]
            self._apply(
                {
                    "apiVersion": "v1",
                    "kind": "Endpoints",
                    # mirrored into an EndpointSlice by kube-controller-manager unless told not to: ours is below
                    "metadata": {"name": name, "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
                    "subsets": [
                        {"addresses": [{"ip": address}], "ports": [{"name": n, "port": port} for n in port_names]}
                    ],
                },
                f"/api/v1/namespaces/{namespace}/endpoints",
            )
            self._apply(
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {"name": name, "labels": {"kubernetes.io/service-name": name}},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
                    "ports": [{"name": n, "port": port, "protocol": "TCP"} for n in port_names],
                },
                f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            )
        for api_service in api_services:
            self._apply(api_service, "/apis/apiregistration.k8s.io/v1/apiservices")
        for api_service in api_services:
            name, said = api_service["metadata"]["name"], {}
            try:
                self._wait(
                    lambda name=name: self._api_service_available(name, said), "kueue", f"APIService {name} Available"
                )
            except ControlPlaneError as e:
                raise ControlPlaneError(
                    f"Kueue's visibility API (APIService {name}) is not Available: {said.get('condition', 'no condition yet')}"
                    f"; {e}"
                ) from None

    def _api_service_available(self, name: str, said: dict) -> bool:
        """Whether the APIService's Available condition is True; its reason and message put in ``said``."""
        api_service = self.request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{name}")
        for condition in (api_service.get("status") or {}).get("conditions") or []:
            if condition["type"] == "Available":
                said["condition"] = f"{condition.get('reason')}: {condition.get('message')}"
                return condition["status"] == "True"
        return False

    # ------------------------------------------------------------------ objects
    def _install_crds(self) -> None:
        names = []
        for component, upstream in manifests.UPSTREAMS.items():
            port = self.ports[f"{component}-webhook"]
            for crd in manifests.crds(self.module_dirs[component], upstream, port, self.certs.ca_pem):
                if component == "kueue" and not self.kueue_v1beta1_served:
                    for version in crd["spec"]["versions"]:
                        if version["name"] == "v1beta1":
                            version["served"] = False
                self._apply(crd, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
                names.append(crd["metadata"]["name"])
        for name in names:
            self._wait(lambda name=name: self._crd_established(name), "kube-apiserver", f"CRD {name} Established")

    def _publish_trainer_version(self) -> None:
        """What Trainer's manifests install beside the controller (manifests/overlays/manager and
        base/rbac/public_configmap_*): the `kubeflow-trainer-public` ConfigMap with its version, which
        the `system:authenticated` group may read."""
        self._ensure_namespace(TRAINER_NAMESPACE)
        base = f"/api/v1/namespaces/{TRAINER_NAMESPACE}"
        self._apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": TRAINER_PUBLIC},
                "data": {"kubeflow_trainer_version": self.build_info["components"]["trainer"]["version"]},
            },
            f"{base}/configmaps",
        )
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{TRAINER_NAMESPACE}"
        self._apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": TRAINER_PUBLIC},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["configmaps"],
                        "resourceNames": [TRAINER_PUBLIC],
                        "verbs": ["get"],
                    }
                ],
            },
            f"{rbac}/roles",
        )
        self._apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": TRAINER_PUBLIC},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TRAINER_PUBLIC},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}
                ],
            },
            f"{rbac}/rolebindings",
        )

    def _register_webhooks(self) -> None:
        for component, upstream in manifests.UPSTREAMS.items():
            port = self.ports[f"{component}-webhook"]
            for config in manifests.webhook_configurations(
                self.module_dirs[component], upstream, port, self.certs.ca_pem
            ):
                plural = config["kind"].lower() + "s"
                self._apply(config, f"/apis/admissionregistration.k8s.io/v1/{plural}")

    def _apply(self, obj: dict, collection: str) -> dict:
        """Create, or replace when it exists (a restarted fixture on the same etcd never happens, but a
        CRD re-read is cheap)."""
        try:
            return self.request("POST", collection, obj)
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise ControlPlaneError(
                    f"cannot create {obj['kind']} {obj['metadata']['name']}: {e.code} {e.read().decode()[:500]}"
                ) from None
        current = self.request("GET", f"{collection}/{obj['metadata']['name']}")
        obj = dict(obj, metadata={**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]})
        return self.request("PUT", f"{collection}/{obj['metadata']['name']}", obj)

    def _ensure_namespace(self, name: str) -> None:
        try:
            self.request(
                "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            )
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise

    def _crd_established(self, name: str) -> bool:
        crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        )

    def _default_service_account_exists(self, namespace: str = "default") -> bool:
        try:
            self.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            return True
        except urllib.error.HTTPError:
            return False

    def _webhook_answers(self, port: int) -> bool:
        """The webhook server completes a TLS handshake with our CA and answers HTTP."""
        try:
            req = urllib.request.Request(f"https://127.0.0.1:{port}/", method="GET")
            urllib.request.urlopen(req, context=self._ssl_context(), timeout=5)
            return True
        except urllib.error.HTTPError:
            return True  # 404 for `/`: it answers
        except OSError:
            return False

    # ------------------------------------------------------------------ plumbing
    def _ssl_context(self) -> ssl.SSLContext:
        if not hasattr(self, "_ctx"):
            self._ctx = ssl.create_default_context(cafile=str(self.certs.ca_crt))
        return self._ctx

    def _get(self, path: str):
        try:
            return self.request("GET", path)
        except (urllib.error.URLError, OSError):
            return None

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "real",
            "clusters": [
                {
                    "name": "real",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": base64.b64encode(self.certs.ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": "test-admin", "user": {"token": self.token}}],
            "contexts": [
                {"name": "real", "context": {"cluster": "real", "user": "test-admin", "namespace": "default"}}
            ],
        }
        fd = os.open(self.kubeconfig_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(config, f)

    def wait_for(self, predicate, what: str, timeout: float | None = None, component: str = "kube-apiserver"):
        """Poll `predicate` until it returns something true (returned); fail at once, with its log, when
        a component exits, or after `timeout` (READY_TIMEOUT) with the log of `component`."""
        timeout = self.READY_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with code {proc.returncode} while waiting for {what}; "
                        f"last lines of {self.log_path(name)}:\n{_tail(self.log_path(name))}"
                    )
            try:
                value = predicate()
                if value:
                    return value
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.25)
        log = self.log_path(_process_of(component))
        raise ControlPlaneError(
            f"timed out after {timeout:.0f} s waiting for {what}; last lines of {log}:\n{_tail(log)}"
        )

    def _wait(self, predicate, component: str, what: str) -> None:
        self.wait_for(predicate, f"{component}: {what}", component=component)


def kueue_visibility_endpoint() -> tuple[str, int] | None:
    """(address, port) for Kueue's visibility server to listen on: this machine's first IPv4 address an endpoint
    may hold (kube-apiserver refuses loopback, link-local and unspecified ones in Endpoints and EndpointSlices:
    ValidateEndpointIP), found now, and a port free on it; None when the machine has no such address."""
    candidates = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        candidates += subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout.split()
    with contextlib.suppress(OSError):
        candidates += socket.gethostbyname_ex(socket.gethostname())[2]
    for candidate in candidates:
        try:
            ip = ipaddress.ip_address(candidate)
        except ValueError:
            continue
        if ip.version != 4 or ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((str(ip), 0))
            except OSError:
                continue
            return str(ip), probe.getsockname()[1]
    return None


def _process_of(component: str) -> str:
    return {
        "trainer": "trainer-controller-manager",
        "jobset": "jobset-controller-manager",
        "kueue": "kueue-controller-manager",
    }.get(component, component)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
