"""The kubelet: pods run as local processes, one back end for where the pods come from.

Two back ends share this kubelet: `StoreBackend`, the local cluster's own node (it also plays the
scheduler, binding every pod to itself), and the node agent's (nodeagent.py), which serves pods a
real kube-scheduler bound to its Nodes on any API server. This module is the pod's life (init containers
and sidecars, restarts, termination, status); a container's environment is environment.py, its volumes and
path remapping volumes.py, its process process.py.

A container is its `command + args` exec'd directly (no shell, like a container runtime) in a new
session, with the container's environment and its volume mounts remapped to directories under
the pod's directory (`<workdir>/pods/<namespace>/<pod>/`), and those directories bind-mounted at their
mount paths in a mount namespace of the container's own (mounts.py). Images are not pulled or used: the
host's tools run, with the directory of this Python first on PATH.
"""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Protocol, Union

from nemo_kubeflow_local import virtual_nodes
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.container_logs import ContainerLog, LogStore
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.constants import BACKOFF_MAX, BACKOFF_START, POD_IP, backoff_delay
from nemo_kubeflow_local.events import NODE_NAME, EventRecorder, Recorder
from nemo_kubeflow_local.kubelet.environment import ContainerConfigError, Objects, container_env, expand
from nemo_kubeflow_local.kubelet.log_emitters import EMITTER_ENV, EmitterRun, EmitterSpecError, LogEmitters
from nemo_kubeflow_local.kubelet.mounts import READ_ONLY_KINDS, Mount, MountRefusal, Mounts, host_paths, refused_by_init
from nemo_kubeflow_local.kubelet.mounts import plan as plan_mounts
from nemo_kubeflow_local.kubelet.process import ContainerRun, MountRefusedError
from nemo_kubeflow_local.kubelet.volumes import MountError, PathMap, Volumes
from nemo_kubeflow_local.timeutil import now_rfc3339

#: (namespace, service account, audience, seconds) -> a token: the TokenRequest API.
TokenSource = Callable[[str, str, str, int], str]

logger = logging.getLogger(__name__)

#: A container run: a process tree, or an emulated log emitter (log_emitters.py) without one.
Run = Union[ContainerRun, EmitterRun]

#: The longest grace period honoured when the cluster stops.
STOP_GRACE = 1.0


# --- the pod worker -------------------------------------------------------------------------------------


class PodWorker(threading.Thread):
    """Runs one pod from scheduling to its end (or its deletion)."""

    def __init__(self, kubelet: "Kubelet", pod: dict):
        super().__init__(daemon=True, name=f"pod-{pod['metadata']['name']}")
        self.kubelet = kubelet
        # Its own copy: the worker changes it (the bind sets spec.nodeName), and the pod a store listener
        # hands over is the stored object itself, which a reader may be copying outside the store's lock.
        self.pod = copy.deepcopy(pod)
        self.ns = pod["metadata"].get("namespace", "default")
        self.name = pod["metadata"]["name"]
        self.uid = pod["metadata"]["uid"]
        self.dir = kubelet.workdir / "pods" / self.ns / self.name
        self.terminating = threading.Event()
        self.deleted = False
        self._lock = threading.Lock()
        self._runs: dict[str, Run] = {}
        #: Containers the (emulated) kernel OOM killer ended: their exit reports reason OOMKilled.
        self.oom_killed: set[str] = set()
        self._statuses: dict[str, dict] = {}
        self._start_time: Optional[str] = None
        self._kill_timers: list[threading.Timer] = []
        self._kill_deadline: Optional[float] = None

    # -- status --

    def _set_status(self, change: Callable[[dict], None]) -> None:
        """Apply `change` to this pod's status atomically (nothing if the pod was replaced)."""
        self.kubelet.backend.write_status(self, change)

    def _container_statuses(self, bag: str) -> list[dict]:
        with self._lock:
            return [dict(self._statuses[c["name"]]) for c in self.pod["spec"].get(bag) or []]

    def _publish(self, phase: Optional[str] = None) -> None:
        init = self._container_statuses("initContainers")
        main = self._container_statuses("containers")
        ready = bool(main) and all(s.get("ready") for s in main)
        initialized = all(
            "terminated" in s["state"]
            and s["state"]["terminated"]["exitCode"] == 0
            or s.get("started")
            and self._is_sidecar(s["name"])
            for s in init
        )
        wanted = {
            "PodReadyToStartContainers": True,
            "Initialized": initialized,
            "Ready": ready,
            "ContainersReady": ready,
            "PodScheduled": True,
        }

        def change(status: dict) -> None:
            status["conditions"] = _conditions(status.get("conditions") or [], wanted)
            status.update(
                hostIP=POD_IP,
                hostIPs=[{"ip": POD_IP}],
                podIP=POD_IP,
                podIPs=[{"ip": POD_IP}],
                startTime=self._start_time,
                containerStatuses=main,
            )
            if init:
                status["initContainerStatuses"] = init
            if phase:
                status["phase"] = phase

        self._set_status(change)

    def _is_sidecar(self, name: str) -> bool:
        return any(
            c["name"] == name and c.get("restartPolicy") == "Always"
            for c in self.pod["spec"].get("initContainers") or []
        )

    def _event(
        self, type_: str, reason: str, message: str, component: str = "kubelet", container: Optional[str] = None
    ) -> None:
        field_path = None
        if container:
            bag = (
                "initContainers"
                if any(c["name"] == container for c in self.pod["spec"].get("initContainers") or [])
                else "containers"
            )
            field_path = f"spec.{bag}{{{container}}}"
        self.kubelet.events.record(self.pod, type_, reason, message, component, field_path)

    # -- lifecycle --

    def run(self) -> None:
        try:
            if self._schedule() and self._set_up_volumes():
                self._start_time = now_rfc3339()
                if self._run_init_containers():
                    self._run_main_containers()
        except Exception:  # noqa: BLE001 - a kubelet bug must not leave processes behind
            logger.exception("pod %s/%s", self.ns, self.name)
        finally:
            self.kill_and_wait()  # sidecars too: a deleted pod goes only once nothing of it runs
            with self._lock:
                timers, self._kill_timers = self._kill_timers, []
            for timer in timers:
                timer.cancel()
            self.kubelet.backend.pod_finished(self)
            if self.deleted:
                self.kubelet.backend.remove_pod(self.ns, self.name, self.uid)
            self.kubelet.forget(self)

    def _wait_for_change(self, seen: int) -> int:
        """Block until a ConfigMap/Secret/PVC changed since `seen` (or the pod is deleted)."""
        return self.kubelet.wait_for_change(seen, self.terminating)

    def _schedule(self) -> bool:
        """Wait until the pod is bound to a node (by the back end), then show its containers waiting."""
        if not self.kubelet.backend.bind(self):
            return False
        with self._lock:
            for c in (self.pod["spec"].get("initContainers") or []) + self.pod["spec"].get("containers", []):
                self._statuses[c["name"]] = _waiting_status(
                    c,
                    "PodInitializing"
                    if self.pod["spec"].get("initContainers") and c in self.pod["spec"].get("containers", [])
                    else "ContainerCreating",
                )
        self._publish("Pending")
        return True

    def _set_up_volumes(self) -> bool:
        volumes = Volumes(self.kubelet.backend, self.pod, self.dir, self.kubelet.workdir)
        seen = self.kubelet.generation
        while not self.terminating.is_set():
            try:
                volumes.set_up(self._path_map(None))
                return True
            except MountError as error:
                self._event("Warning", "FailedMount", str(error))
                seen = self._wait_for_change(seen)
        return False

    def _path_map(self, container: Optional[dict]) -> PathMap:
        """Mount paths of `container` (of every container when None, first one wins) -> local paths."""
        containers = (
            [container]
            if container
            else (self.pod["spec"].get("initContainers") or []) + self.pod["spec"].get("containers", [])
        )
        mounts: dict[str, Path] = {}
        for c in containers:
            mounts.setdefault(
                c.get("terminationMessagePath", "/dev/termination-log"),
                self.dir / "containers" / c["name"] / "termination-log",
            )
            for mount in self._mounts(c):
                mounts.setdefault(mount.path, mount.source)
        return PathMap(mounts)

    def _mounts(self, container: dict) -> list[Mount]:
        """The container's volumeMounts, each with its volume's local directory."""
        volumes = Volumes(self.kubelet.backend, self.pod, self.dir, self.kubelet.workdir)
        by_name = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        mounts = []
        for mount in container.get("volumeMounts") or []:
            volume = by_name[mount["name"]]
            local = volumes.local_dir(volume)
            if mount.get("subPath"):
                local = local / mount["subPath"]
            writable = not any(kind in volume for kind in READ_ONLY_KINDS)
            mounts.append(Mount(mount["name"], os.path.normpath(mount["mountPath"]), local, writable))
        return mounts

    def _run_init_containers(self) -> bool:
        for container in self.pod["spec"].get("initContainers") or []:
            if self.terminating.is_set():
                return False
            if container.get("restartPolicy") == "Always":  # a native sidecar: runs beside everything after it
                started = threading.Event()
                threading.Thread(
                    target=self._run_container,
                    args=(container, started),
                    daemon=True,
                    name=f"sidecar-{self.name}-{container['name']}",
                ).start()
                started.wait()
                continue
            if self._run_container(container) != 0:
                if not self.terminating.is_set():
                    self.kill_and_wait()  # its sidecars
                    self.kubelet.backend.pod_finished(self)
                    self._publish("Failed")
                return False
        return not self.terminating.is_set()

    def _run_main_containers(self) -> None:
        threads = [
            threading.Thread(target=self._run_container, args=(c,), daemon=True, name=f"ctr-{self.name}-{c['name']}")
            for c in self.pod["spec"]["containers"]
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.terminating.is_set() and not self.deleted:
            return  # the cluster is stopping
        codes = [s["state"].get("terminated", {}).get("exitCode", 1) for s in self._container_statuses("containers")]
        phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        if self.terminating.is_set():
            # Deleted: as the kubelet does, the pod gets its terminal phase before it goes (the Job
            # controller, with a podFailurePolicy, waits for it before it counts the pod).
            self._publish(phase)
            return
        self._stop_sidecars()
        self.kubelet.backend.pod_finished(self)  # before the scheduler can count them free again
        self._publish(phase)

    def _stop_sidecars(self) -> None:
        sidecars = [
            c["name"] for c in self.pod["spec"].get("initContainers") or [] if c.get("restartPolicy") == "Always"
        ]
        with self._lock:
            runs = [self._runs[name] for name in sidecars if name in self._runs]
        for run in runs:
            self._event(
                "Normal",
                "Killing",
                f"Stopping container {run.log.path.parent.name}",
                container=run.log.path.parent.name,
            )
            run.terminate()
        for run in runs:
            try:
                run.process.wait(timeout=self.pod["spec"].get("terminationGracePeriodSeconds", 30))
            except subprocess.TimeoutExpired:
                run.kill()

    def _should_restart(self, container: dict, code: int) -> bool:
        if self.terminating.is_set():
            return False
        if container.get("restartPolicy") == "Always":  # sidecars restart until the main containers end
            return not self._main_containers_done()
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if not self._is_main(container["name"]):  # init containers run until they succeed, unless Never
            return code != 0 and policy != "Never"
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    def _main_containers_done(self) -> bool:
        return all("terminated" in s["state"] for s in self._container_statuses("containers")) and bool(
            self._container_statuses("containers")
        )

    def _run_container(self, container: dict, started: Optional[threading.Event] = None) -> int:
        """Run a container to its end, restarting it as the restart policy says. Returns its exit code."""
        name = container["name"]
        restarts, code, seen = 0, 1, self.kubelet.generation
        base = self.kubelet.base_env(self.pod)
        remap = self._path_map(container)
        if unpullable(container.get("image", "")):
            self._fail_image_pull(container)
            return 1
        while not self.terminating.is_set():
            try:
                env = container_env(self.kubelet.backend, self.pod, container, base)
            except ContainerConfigError as error:
                self._update(name, state={"waiting": {"reason": "CreateContainerConfigError", "message": str(error)}})
                self._event("Warning", "Failed", f"Error: {error}", container=name)
                seen = self._wait_for_change(seen)
                continue
            code = self._start_and_wait(container, env, remap, restarts, started)
            if not self._should_restart(container, code):
                break
            restarts += 1
            delay = backoff_delay(BACKOFF_START, BACKOFF_MAX, restarts)
            self._update(
                name,
                restartCount=restarts,
                lastState=self._statuses[name]["state"],
                state={
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {delay}s restarting failed container={name} "
                        f"pod={self.name}_{self.ns}({self.uid})",
                    }
                },
            )
            self._event(
                "Warning",
                "BackOff",
                f"Back-off restarting failed container {name} in pod {self.name}_{self.ns}({self.uid})",
                container=name,
            )
            self.terminating.wait(delay)
        if started is not None:
            started.set()
        return code

    def _fail_image_pull(self, container: dict) -> None:
        """What a kubelet does with an image that does not exist: ErrImagePull, then back-off, forever."""
        name, image = container["name"], container.get("image", "")
        error = (
            f'failed to pull and unpack image "{image}": failed to resolve reference "{image}": '
            f"{image.split('/')[0]}: not found"
        )
        self._event("Normal", "Pulling", f'Pulling image "{image}"', container=name)
        self._update(name, state={"waiting": {"reason": "ErrImagePull", "message": error}})
        self._event("Warning", "Failed", f'Failed to pull image "{image}": {error}', container=name)
        self.terminating.wait(IMAGE_PULL_BACKOFF)
        if not self.terminating.is_set():
            self._update(
                name, state={"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}}
            )
            self._event("Normal", "BackOff", f'Back-off pulling image "{image}"', container=name)
        self.terminating.wait()

    def _start_and_wait(
        self, container: dict, env: dict[str, str], remap: PathMap, restarts: int, started: Optional[threading.Event]
    ) -> int:
        name = container["name"]
        argv = [expand(a, env) for a in (container.get("command") or []) + (container.get("args") or [])]
        argv, env = self.kubelet.backend.network(self.pod, container, argv, env)
        argv = [remap.apply(a) for a in argv]
        env = {k: remap.apply(v) for k, v in env.items()}
        cwd = self._working_dir(container, remap)
        log = self.kubelet.logs.start_run(self.uid, name, self.dir / "logs" / name / f"{restarts}.log")
        termination_log = self.dir / "containers" / name / "termination-log"
        termination_log.parent.mkdir(parents=True, exist_ok=True)
        termination_log.write_bytes(b"")
        self._event(
            "Normal",
            "Pulled",
            f'Container image "{container.get("image", "")}" already present on machine and can be accessed by the pod',
            container=name,
        )
        started_at = now_rfc3339()
        try:
            if not argv:
                raise FileNotFoundError("the emulated image has no entrypoint: set command or args")
            if self.terminating.is_set():
                log.finish()
                return 137
            # Started outside the lock (its init takes a moment; the pod's other containers start
            # meanwhile), registered under the lock `terminate` takes: either it sees this run, or
            # this run sees the pod terminating and is killed at once.
            mounts = plan_mounts(
                self._mounts(container),
                host_paths(self.kubelet.workdir),
                self.dir / "containers" / name / "root",
            )
            if mounts.binds:
                mounts.scratch.mkdir(parents=True, exist_ok=True)
            try:
                run = self.kubelet.start_run(argv, env, cwd, log, mounts)
            except MountRefusedError as error:
                raise refused_by_init(mounts, error.errno or 0, error.index) from None
            with self._lock:
                self._runs[name] = run
                late = self.terminating.is_set()
            if late:
                run.kill()
        except (OSError, MountRefusal) as error:
            log.finish()
            message = (
                error.message
                if isinstance(error, MountRefusal)
                else f"failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                f'runc create failed: unable to start container process: exec: "{argv[0] if argv else ""}": '
                f"{_exec_error(error)}: unknown"
            )
            self._update(
                name,
                state={
                    "terminated": {
                        "exitCode": 128,
                        "reason": "StartError",
                        "message": message,
                        "startedAt": started_at,
                        "finishedAt": now_rfc3339(),
                        "containerID": f"local://{self.uid}-{name}-{restarts}",
                    }
                },
                ready=False,
                started=False,
            )
            self._event("Warning", "Failed", f"Error: {message}", container=name)
            if started:
                started.set()
            return 128
        container_id = run.container_id
        self._event("Normal", "Created", f"Created container: {name}", container=name)
        self._event("Normal", "Started", f"Started container {name}", container=name)
        self._update(
            name,
            state={"running": {"startedAt": started_at}},
            ready=True,
            started=True,
            containerID=container_id,
            phase="Running" if self._is_main(name) else None,
        )
        if started:
            started.set()
        code = run.wait()
        reason = "Completed" if code == 0 else "OOMKilled" if name in self.oom_killed and code == 137 else "Error"
        message = _termination_message(termination_log, container, log, code)
        terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": started_at,
            "finishedAt": now_rfc3339(),
            "containerID": container_id,
        }
        if message:
            terminated["message"] = message
        self._update(name, state={"terminated": terminated}, ready=False, started=False)
        return code

    def _is_main(self, name: str) -> bool:
        return any(c["name"] == name for c in self.pod["spec"]["containers"])

    def _working_dir(self, container: dict, remap: PathMap) -> Path:
        if not container.get("workingDir"):
            self.dir.mkdir(parents=True, exist_ok=True)
            return self.dir
        path = Path(remap.apply(container["workingDir"]))
        if not path.is_dir():
            # The runtime creates a missing workingDir; outside a mount it goes in the pod's own tree.
            path = (
                path
                if str(path).startswith(str(self.dir)) or str(path).startswith(str(self.kubelet.workdir))
                else self.dir / "rootfs" / str(path).lstrip("/")
            )
            path.mkdir(parents=True, exist_ok=True)
        return path

    def _update(self, name: str, phase: Optional[str] = None, **fields) -> None:
        with self._lock:
            self._statuses[name].update(fields)
        self._publish(phase)

    # -- termination --

    def terminate(self, grace: float) -> None:
        """The pod is being deleted: SIGTERM every process of every container now, SIGKILL after
        `grace` seconds. Called again with a shorter grace (a forced delete, the cluster stopping),
        the kill comes sooner."""
        with self._lock:
            first = not self.terminating.is_set()
            self.terminating.set()
            names = [name for name, run in self._runs.items() if run.running()]
            deadline = time.monotonic() + grace
            if self._kill_deadline is not None and self._kill_deadline <= deadline:
                return
            self._kill_deadline = deadline
        if first:
            for name in names:
                self._event("Normal", "Killing", f"Stopping container {name}", container=name)
        if grace <= 0:
            self._kill_all(True)
        else:
            if first:
                self._kill_all(False)
            timer = threading.Timer(grace, self._kill_all, args=(True,))
            timer.daemon = True
            with self._lock:
                self._kill_timers.append(timer)
            timer.start()
        self.kubelet.wake()

    def kill(self) -> None:
        """SIGKILL every container now, as when the node under the pod dies; the pod then ends
        as its containers' exit codes say (Failed, with restartPolicy Never)."""
        self._kill_all(True)

    def oom_kill(self, container: str) -> bool:
        """What the kernel does to a container over its memory limit: SIGKILL to all its processes,
        reported as OOMKilled. False if the container is not running."""
        with self._lock:
            run = self._runs.get(container)
            if run is None or not run.running():
                return False
            self.oom_killed.add(container)
        run.kill()
        return True

    def _kill_all(self, kill: bool) -> None:
        """SIGKILL (`kill`) or SIGTERM every process of every container still running."""
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            if run.running():
                run.kill() if kill else run.terminate()

    def kill_and_wait(self) -> None:
        """SIGKILL everything now and return once every process of the pod is gone."""
        self.terminating.set()
        self._kill_all(True)
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.process.wait()


def _waiting_status(container: dict, reason: str) -> dict:
    return {
        "name": container["name"],
        "state": {"waiting": {"reason": reason}},
        "lastState": {},
        "ready": False,
        "restartCount": 0,
        "image": container.get("image", ""),
        "imageID": "",
        "started": False,
    }


def _conditions(old: list[dict], wanted: dict[str, bool]) -> list[dict]:
    """Pod conditions; lastTransitionTime only moves when a condition's status changes."""
    previous = {c["type"]: c for c in old}
    result = []
    for type_, value in wanted.items():
        status = "True" if value else "False"
        before = previous.get(type_)
        since = before["lastTransitionTime"] if before and before.get("status") == status else now_rfc3339()
        result.append({"type": type_, "status": status, "lastTransitionTime": since})
    # Conditions other components own (DisruptionTarget, set by the taint manager or an eviction) stay.
    return result + [c for c in old if c["type"] not in wanted]


def _exec_error(error: OSError) -> str:
    if isinstance(error, FileNotFoundError) and not error.filename or isinstance(error, EmitterSpecError):
        return str(error)
    if isinstance(error, PermissionError):
        return "permission denied"
    return "executable file not found in $PATH"


def _termination_message(path: Path, container: dict, log: ContainerLog, code: int) -> str:
    message = path.read_text(errors="replace")[:4096] if path.exists() else ""
    if not message and code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        message = log.tail(80)[-2048:]
    return message


# --- the node -----------------------------------------------------------------------------------------------


class Backend(Objects, Protocol):
    """What the kubelet needs from the cluster it serves."""

    @property
    def events(self) -> Recorder:
        """Records events (`record(involved, type, reason, message, component, field_path)`)."""
        ...

    #: The API server, for the containers' KUBERNETES_SERVICE_HOST/PORT.
    api_url: str

    def bind(self, worker: "PodWorker") -> bool:
        """Wait until the pod is bound (spec.nodeName set on `worker.pod`); False if it went first."""

    def write_status(self, worker: "PodWorker", change: Callable[[dict], None]) -> None:
        """Apply `change` to the pod's status (a no-op if the pod is gone or was replaced)."""

    def remove_pod(self, namespace: str, name: str, uid: str) -> None:
        """The deleted pod's processes are gone: remove the object (grace 0, uid precondition)."""

    def network(
        self, pod: dict, container: dict, argv: list[str], env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """Rewrite what a container is given for the host network all pods share here (and its
        devices: `env` is the container's, `CUDA_VISIBLE_DEVICES` for the GPUs it was given)."""

    def pod_finished(self, worker: "PodWorker") -> None:
        """Nothing of the pod runs any more: free what it held (devices). Called once or more."""


class Kubelet:
    """Runs the pods a back end hands it (`pod_changed`); kills them all on `stop()`."""

    def __init__(self, backend: Backend, workdir: Path, logs: LogStore):
        self.backend, self.workdir, self.logs = backend, workdir, logs
        self.events = backend.events
        self._lock = threading.Lock()
        self._workers: dict[str, PodWorker] = {}
        self._changes = threading.Condition()
        self._generation = 0
        self._stopped = False
        #: Writes the logs of the containers that are emulated log emitters (log_emitters.py).
        self.emitters = LogEmitters()

    def start_run(
        self, argv: list[str], env: dict[str, str], cwd: Path, log: ContainerLog, mounts: Optional[Mounts] = None
    ) -> Run:
        """Start a container run: its program under its init (in a mount namespace of its own with
        ``mounts``), or, with ``EMITTER_ENV`` in its environment, an emulated log emitter that runs no
        process (log_emitters.py)."""
        if EMITTER_ENV in env:
            return EmitterRun(env, log, self.emitters)
        return ContainerRun(argv, env, cwd, log, mounts)

    def base_env(self, pod: dict) -> dict[str, str]:
        """What every container starts with: the image's ENV and the service variables, stood in for."""
        host, port = self.backend.api_url.rsplit("//", 1)[-1].rstrip("/").rsplit(":", 1)
        return {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]),
            "HOME": str(self.workdir / "pods" / pod["metadata"].get("namespace", "default") / pod["metadata"]["name"]),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "HOSTNAME": pod["spec"].get("hostname") or pod["metadata"]["name"],
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
        }

    def pod_changed(self, event: str, pod: dict) -> None:
        """A pod of this kubelet was ADDED, MODIFIED or DELETED. Must not block (it may run under
        the store's lock): it starts threads for the work."""
        uid = pod["metadata"]["uid"]
        with self._lock:
            worker = self._workers.get(uid)
            if event == "ADDED" and worker is None and not self._stopped:
                worker = self._workers[uid] = PodWorker(self, pod)
                worker.start()
                return
        if worker is None:
            if event == "MODIFIED" and pod["metadata"].get("deletionTimestamp"):
                # Nothing runs it any more: finish the deletion.
                threading.Thread(
                    target=self.backend.remove_pod,
                    args=(pod["metadata"]["namespace"], pod["metadata"]["name"], uid),
                    daemon=True,
                ).start()
            return
        if event == "DELETED":
            grace = 0
        elif pod["metadata"].get("deletionTimestamp"):
            worker.deleted = True
            grace = pod["metadata"].get("deletionGracePeriodSeconds", 30)
        else:
            return
        threading.Thread(target=worker.terminate, args=(grace,), daemon=True).start()

    def worker(self, uid: str) -> Optional[PodWorker]:
        with self._lock:
            return self._workers.get(uid)

    def refresh_tokens(self) -> int:
        """Rewrite the projected service-account tokens of every pod this kubelet runs (its rotation, on
        demand); returns how many token files it replaced."""
        with self._lock:
            workers = list(self._workers.values())
        return sum(Volumes(self.backend, worker.pod, worker.dir, self.workdir).refresh_tokens() for worker in workers)

    def knows(self, uid: str) -> bool:
        with self._lock:
            return uid in self._workers

    @property
    def generation(self) -> int:
        """Counts ConfigMap/Secret/PVC changes; read it before checking what a wait is for."""
        with self._changes:
            return self._generation

    def wake(self) -> None:
        with self._changes:
            self._generation += 1
            self._changes.notify_all()

    def wait_for_change(self, seen: int, cancel: threading.Event) -> int:
        with self._changes:
            if seen == self._generation and not cancel.is_set():
                self._changes.wait(self.recheck_seconds)
            return self._generation

    #: How long a waiting pod goes without looking again for what it waits for, if not woken.
    recheck_seconds = 5.0

    def forget(self, worker: PodWorker) -> None:
        with self._lock:
            if self._workers.get(worker.uid) is worker:
                del self._workers[worker.uid]

    def stop(self) -> None:
        """Kill every pod's processes (SIGTERM, then SIGKILL after at most STOP_GRACE); returns
        once none is left."""
        with self._lock:
            self._stopped = True
            workers = list(self._workers.values())
        for worker in workers:
            worker.terminate(min(STOP_GRACE, worker.pod["spec"].get("terminationGracePeriodSeconds", 30)))
        deadline = time.monotonic() + STOP_GRACE + 5.0
        for worker in workers:
            worker.join(max(0.1, deadline - time.monotonic()))
        for worker in workers:
            worker.kill_and_wait()
        self.emitters.stop()
        self.logs.finish_all()


class StoreBackend:
    """The local cluster's one node: pods from its store, and the scheduler's part too."""

    def __init__(self, store: Store, events: EventRecorder, api_url: str, tokens: Optional[TokenSource] = None):
        self.store, self.events, self.api_url, self.tokens = store, events, api_url, tokens

    def find(self, rt: ResourceType, namespace: str, name: str) -> Optional[dict]:
        return self.store.find(rt, namespace, name)

    def service_account_token(self, namespace: str, service_account: str, audience: str, seconds: int) -> str:
        if self.tokens is None:
            raise RuntimeError("this local cluster issues no service-account tokens")
        return self.tokens(namespace, service_account, audience, seconds)

    def write_status(self, worker: "PodWorker", change: Callable[[dict], None]) -> None:
        def apply(pod: dict) -> Optional[dict]:
            if pod["metadata"]["uid"] != worker.uid:
                return None
            change(pod.setdefault("status", {}))
            return pod

        self.store.mutate(R.PODS, worker.ns, worker.name, apply)

    def remove_pod(self, namespace: str, name: str, uid: str) -> None:
        self.store.remove(R.PODS, namespace, name, uid)

    def network(
        self, pod: dict, container: dict, argv: list[str], env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        return argv, env  # the Trainer emulation already gives 127.0.0.1 and a port per TrainJob

    def pod_finished(self, worker: "PodWorker") -> None:
        pass  # GPUs are only counted here

    def bind(self, worker: "PodWorker") -> bool:
        """kube-scheduler's part: bind to the one node once its claims exist and its extended
        resources fit (Pending, with FailedScheduling events, until then)."""
        volumes = Volumes(self, worker.pod, worker.dir, worker.kubelet.workdir)
        seen = worker.kubelet.generation
        while not worker.terminating.is_set():
            missing = volumes.missing_claims()
            short = insufficient_resources(worker.pod, node_capacity())
            if not missing and not short:
                break
            if short:
                # Nothing frees capacity on the local node: the pod stays Pending, like on a cluster
                # without GPUs, until it is deleted.
                message = "0/1 nodes are available: " + ", ".join(f"1 Insufficient {r}" for r in short) + "."
            else:
                message = f'0/1 nodes are available: persistentvolumeclaim "{missing[0]}" not found.'
            worker._set_status(_unschedulable(message))
            worker._event(
                "Warning",
                "FailedScheduling",
                f"{message} preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.",
                "default-scheduler",
            )
            seen = worker._wait_for_change(seen)
        node_name = self._choose_virtual_node(worker)
        if worker.terminating.is_set() or node_name is None:
            return False

        def bind(pod: dict) -> Optional[dict]:
            if pod["metadata"]["uid"] != worker.uid:
                return None
            pod["spec"]["nodeName"] = node_name
            return pod

        if self.store.mutate(R.PODS, worker.ns, worker.name, bind) is None:
            return False
        worker.pod["spec"]["nodeName"] = node_name
        worker._event(
            "Normal",
            "Scheduled",
            f"Successfully assigned {worker.ns}/{worker.name} to {node_name}",
            "default-scheduler",
        )
        return True

    def _choose_virtual_node(self, worker: "PodWorker") -> Optional[str]:
        """The local node, or with virtual nodes (virtual_nodes.py) the one the pod fits best; while
        none fits, the pod stays Pending (FailedScheduling), re-checked as nodes change."""
        while not worker.terminating.is_set():
            nodes = [n for n in self.store.list(R.NODES, None)[0] if virtual_nodes.is_virtual(n)]
            if not nodes:
                return NODE_NAME
            load: dict[str, int] = {}
            for pod in self.store.list(R.PODS, None)[0]:
                if pod["spec"].get("nodeName") and (pod.get("status") or {}).get("phase") not in (
                    "Succeeded",
                    "Failed",
                ):
                    load[pod["spec"]["nodeName"]] = load.get(pod["spec"]["nodeName"], 0) + 1
            name, message = virtual_nodes.choose(worker.pod, nodes, load)
            if name is not None:
                return name
            worker._set_status(_unschedulable(message))
            worker._event("Warning", "FailedScheduling", message, "default-scheduler")
            worker.terminating.wait(1.0)
        return None


def _unschedulable(message: str) -> Callable[[dict], None]:
    """The status change of a pod that fits no node: ``PodScheduled=False``, reason ``Unschedulable``."""

    def change(status: dict) -> None:
        status.update(
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": now_rfc3339(),
                }
            ]
        )

    return change


class LocalKubelet(Kubelet):
    """The local cluster's kubelet: follows its store. Pods bound to another node (a node agent's)
    are not its own."""

    def __init__(
        self,
        store: Store,
        workdir: Path,
        events: EventRecorder,
        logs: LogStore,
        api_url: str,
        tokens: Optional[TokenSource] = None,
    ):
        super().__init__(StoreBackend(store, events, api_url, tokens), workdir, logs)
        self.store = store
        store.add_listener(self._on_change)

    def _on_change(self, event: str, rt, obj: dict) -> None:
        if rt is R.PODS:
            if obj["spec"].get("nodeName") not in (None, "", NODE_NAME) and not self.knows(obj["metadata"]["uid"]):
                return
            self.pod_changed(event, obj)
        elif rt in (R.CONFIGMAPS, R.SECRETS, R.PVCS):
            self.wake()

    def stop(self) -> None:
        self.store.remove_listener(self._on_change)
        super().stop()


#: Seconds between ErrImagePull and ImagePullBackOff (a real kubelet starts its back-off at 10 s).
IMAGE_PULL_BACKOFF = 0.5
_CORE_RESOURCES = ("cpu", "memory", "ephemeral-storage", "pods")


def unpullable(image: str) -> bool:
    """Images from a registry under the reserved ``.invalid`` TLD (RFC 2606) cannot be pulled.

    The local cluster runs every image as the host, so this is how tests (and users) see
    what an image pull failure looks like.
    """
    host = image.split("/", 1)[0] if "/" in image else ""
    return host.split(":", 1)[0].endswith(".invalid")


def node_capacity() -> dict[str, int]:
    """Extended resources of the one local node: GPUs from $NEMO_KUBEFLOW_LOCAL_GPUS (default none)."""
    gpus = int(os.environ.get("NEMO_KUBEFLOW_LOCAL_GPUS", "0") or 0)
    return {"nvidia.com/gpu": gpus} if gpus else {}


def insufficient_resources(pod: dict, capacity: dict[str, int]) -> list[str]:
    """Extended resources the pod requests beyond the node's capacity (cpu and memory are not limited)."""
    wanted: dict[str, float] = {}
    for container in pod["spec"].get("containers", []):
        resources = container.get("resources") or {}
        for source in (resources.get("limits") or {}, resources.get("requests") or {}):
            for name, value in source.items():
                if name in _CORE_RESOURCES or name.startswith("hugepages-"):
                    continue
                try:
                    wanted[name] = max(wanted.get(name, 0), float(value))
                except (TypeError, ValueError):
                    continue
    return sorted(name for name, amount in wanted.items() if amount > capacity.get(name, 0))
