"""Rendering the training runtime from its Jinja template.

``runtime_context`` turns a task's resolved executor (``plan.ExecutorFacts``) into template
variables and ``render_runtime`` renders, parses and names the result. Both are pure apart from reading the template
file. Rendered runtimes are named by a hash of their content, so every task with the
same settings shares one runtime (the API server answers 409 to the second create,
which means "reuse").
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import hashlib
import json
import os
import re
import shlex
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import jinja2
import jinja2.bccache
import yaml

from nemo_kubeflow.constants import (
    CLUSTER_RUNTIME_KIND,
    GANG_SCHEDULERS,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    OOM_KILLED_EXIT_CODE,
    RUNTIME_HASH_LABEL,
    USER_ERROR_MESSAGE_PATTERN,
)
from nemo_kubeflow.errors import TemplateError
from nemo_kubeflow.parts import initializers, yamlio
from nemo_kubeflow.parts.escapes import kube_escape, literal_env
from nemo_kubeflow.parts.fabrics import Fabric
from nemo_kubeflow.parts.templates import DEFAULT_TEMPLATE, templates_dir

if TYPE_CHECKING:
    from nemo_kubeflow.build.plan import ExecutorFacts
    from nemo_kubeflow.config.executor import KubeflowExecutor

RUNTIME_NAME_PREFIX = "nemo-kubeflow-"
SHM_VOLUME = "dshm"


#: What JSON leaves as it is but YAML reads otherwise: NEL, LS and PS are YAML line breaks (a double-quoted
#: scalar folds a line break into a space), DEL and the other C1 controls are not printable in YAML (its reader
#: refuses them), nor are a BOM and the noncharacters U+FFFE and U+FFFF. Escaped, they reach the pod as written.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def _tojson(value: Any) -> str:
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()  # a misspelled variable: UndefinedError, not TypeError
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))


#: Where compiled templates are kept between processes (``$XDG_CACHE_HOME``, else ``~/.cache``).
CACHE_DIR_ENV = "NEMO_KUBEFLOW_CACHE_DIR"


class _TemplateCache(jinja2.FileSystemBytecodeCache):
    """Jinja's compiled templates on disk: compiling the runtime template costs the first dry run of every
    process ~60 ms, loading it ~1 ms. Jinja keys each entry by template file and checks the source's
    checksum and its own version, so an edited template or another Jinja recompiles. A cache that
    cannot be read or written (read-only home) only costs the compile."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except (OSError, ValueError, EOFError):
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            os.makedirs(self.directory, exist_ok=True)
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _template_cache() -> _TemplateCache:
    base = os.environ.get(CACHE_DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "nemo-kubeflow"
    )
    return _TemplateCache(os.path.join(base, "templates"))


@functools.lru_cache(maxsize=16)
def _environment(directory: str) -> jinja2.Environment:
    # A runtime_template of your own also finds the packaged files (preflight.sh) after its own.
    loader = jinja2.ChoiceLoader([jinja2.FileSystemLoader(directory), jinja2.FileSystemLoader(str(templates_dir()))])
    env = jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        bytecode_cache=_template_cache(),
    )
    # JSON is valid YAML: any value inserted with tojson is quoted safely. Jinja's own
    # tojson escapes <>&' for HTML, which is still valid, but plain json.dumps reads better.
    env.filters["tojson"] = _tojson
    env.filters["shell_quote"] = lambda value: shlex.quote(str(value))
    env.filters["kube_escape"] = kube_escape
    # Raw text, not a template: a shell script is full of `${#...}` and `{{`-like sequences.
    env.globals["packaged_file"] = lambda name: loader.get_source(env, name)[0]
    return env


def runtime_volumes(
    executor, fabric: Fabric, steps: Sequence[initializers.Step], init_settings: initializers.InitializerSettings
) -> tuple[list[dict], list[dict]]:
    """Volumes and ``node`` mounts the runtime carries: /dev/shm, PVCs, Secret files, the
    initializers' downloads (``steps``), the network fabric's."""
    volumes: list[dict] = []
    mounts: list[dict] = []
    if executor.shm_size is not None:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": str(executor.shm_size)}})
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    volumes_pvc, mounts_pvc = _pvc_volumes(executor)
    volumes += volumes_pvc
    mounts += mounts_pvc
    volumes_secret, mounts_secret = _secret_volumes(executor)
    volumes += volumes_secret
    mounts += mounts_secret
    if initializers.node_mounts(steps):
        volumes.append(initializers.volume(init_settings))
        mounts += initializers.node_mounts(steps)
    volumes += fabric.volumes
    mounts += fabric.mounts
    return volumes, mounts


def _pvc_volumes(executor: KubeflowExecutor) -> tuple[list[dict], list[dict]]:
    volumes: list[dict] = []
    mounts: list[dict] = []
    for i, pvc in enumerate(executor.pvc_mounts):
        name = f"pvc-{i}"
        claim: dict[str, Any] = {"claimName": pvc.claim_name}
        mount: dict[str, Any] = {"name": name, "mountPath": pvc.mount_path}
        if pvc.read_only:
            claim["readOnly"] = mount["readOnly"] = True
        volumes.append({"name": name, "persistentVolumeClaim": claim})
        if pvc.sub_path:
            mount["subPath"] = pvc.sub_path
        mounts.append(mount)
    return volumes, mounts


def _secret_volumes(executor: KubeflowExecutor) -> tuple[list[dict], list[dict]]:
    """The volumes of ``secret_mounts`` and their read-only mounts."""
    volumes: list[dict] = []
    mounts: list[dict] = []
    for i, sm in enumerate(executor.secret_mounts):
        name = f"secret-{i}"
        secret: dict[str, Any] = {"secretName": sm.secret_name, "defaultMode": sm.default_mode}
        if sm.keys:
            secret["items"] = [{"key": k, "path": k} for k in sm.keys]
        volumes.append({"name": name, "secret": secret})
        mounts.append({"name": name, "mountPath": sm.mount_path, "readOnly": True})
    return volumes, mounts


def pod_security_context(executor: KubeflowExecutor) -> dict[str, Any]:
    ctx: dict[str, Any] = {}
    if executor.restricted_security:
        ctx["runAsNonRoot"] = True
        ctx["seccompProfile"] = {"type": "RuntimeDefault"}
    if executor.run_as_user is not None:
        ctx["runAsUser"] = executor.run_as_user
    if executor.fs_group is not None:
        ctx["fsGroup"] = executor.fs_group
    return ctx


def container_security_context(executor: KubeflowExecutor) -> dict[str, Any]:
    if not executor.restricted_security:
        return {}
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def node_security_context(executor: KubeflowExecutor, fabric: Fabric) -> dict[str, Any]:
    """The training container's: the restricted settings, or the capabilities the fabric adds
    (``validate`` refuses both at once)."""
    if fabric.capabilities:
        return {"capabilities": {"add": list(fabric.capabilities)}}
    return container_security_context(executor)


def existing_runtime_pod(facts: ExecutorFacts) -> dict[str, Any]:
    """With ``runtime_name``: the pod settings a rendered runtime would carry, as ``manifests.runtime_patch``
    keyword arguments for the ``node`` pod (what a runtime patch can carry; config/landing.py declares the
    rest refused). Only what the executor sets: the admin's runtime keeps everything else."""
    executor = facts.executor
    pod: dict[str, Any] = {"volumes": list(facts.volumes), "volumeMounts": list(facts.mounts)} if facts.volumes else {}
    settings = {
        "tolerations": [dict(t) for t in executor.tolerations],
        "nodeSelector": dict(sorted(executor.node_selector.items())),
        "serviceAccountName": executor.service_account,
        "imagePullSecrets": [{"name": s} for s in executor.image_pull_secrets],
        "securityContext": pod_security_context(executor),
    }
    # Empty is unset for these (a grace period of 0 is not).
    pod.update({key: value for key, value in settings.items() if value})
    if executor.termination_grace_period_seconds is not None:
        pod["terminationGracePeriodSeconds"] = executor.termination_grace_period_seconds
    return {"pod": pod, "metadata": _pod_metadata(executor), "node_security": container_security_context(executor)}


def _pod_metadata(executor: KubeflowExecutor) -> dict[str, dict[str, str]]:
    """The pod template's labels and annotations that the executor sets (``pod_labels``, ``pod_annotations``)."""
    return {
        k: dict(sorted(v.items()))
        for k, v in (("labels", executor.pod_labels), ("annotations", executor.pod_annotations))
        if v
    }


def preflight_context(executor: KubeflowExecutor, fabric: Fabric) -> Optional[dict[str, Any]]:
    """The ``preflight`` init container's settings, or ``None`` when it is off.

    It requests the GPUs and fabric devices of the training container (the kubelet hands the same
    devices to the training container afterwards), so that it sees what training will see.
    """
    if not executor.preflight:
        return None
    devices = _preflight_devices(executor, fabric)
    _, pvc_mounts = _pvc_volumes(executor)
    return {
        "command": executor.preflight if isinstance(executor.preflight, str) else None,
        "env": _preflight_env(executor, fabric),
        "resources": {"requests": devices, "limits": dict(devices)} if devices else {},
        "volume_mounts": pvc_mounts + list(fabric.mounts),
    }


def _preflight_env(executor: KubeflowExecutor, fabric: Fabric) -> list[dict]:
    """The preflight checks' settings (the GPUs to find, the claims to write) and the fabric's variables."""
    writable = [p.mount_path for p in executor.pvc_mounts if not p.read_only]
    return [
        literal_env("PREFLIGHT_EXPECTED_GPUS", executor.gpus_per_node),
        literal_env("PREFLIGHT_WRITABLE_PATHS", " ".join(writable)),
    ] + [literal_env(k, v) for k, v in sorted(fabric.env.items())]


def _preflight_devices(executor: KubeflowExecutor, fabric: Fabric) -> dict[str, str]:
    """The devices the preflight container requests: the GPUs, then the fabric's."""
    devices = dict(fabric.resources)
    if executor.gpus_per_node > 0:
        devices = {executor.gpu_resource_name: str(executor.gpus_per_node), **devices}
    return devices


def pod_group_policy(executor: KubeflowExecutor) -> Optional[dict[str, Any]]:
    """The runtime's ``spec.podGroupPolicy`` (gang scheduling), or ``None`` when off."""
    policy = getattr(executor, "pod_group_policy", "none") or "none"
    if policy == "none":
        return None
    settings: dict[str, Any] = {}
    if policy == "coscheduling" and executor.schedule_timeout_seconds is not None:
        settings["scheduleTimeoutSeconds"] = executor.schedule_timeout_seconds
    return {policy: settings}


def scheduler_name(executor: KubeflowExecutor) -> Optional[str]:
    """The pods' ``schedulerName``: the executor's, else the gang scheduler's, else none (the default)."""
    return executor.scheduler_name or GANG_SCHEDULERS.get(executor.pod_group_policy)


def runtime_context(facts: ExecutorFacts) -> dict[str, Any]:
    """The template variables of a task's executor (``plan.resolve``); templates/training_runtime.yaml.j2
    shows how each is used."""
    executor, fabric, steps = facts.executor, facts.fabric, facts.initializer_steps
    return {
        "kind": executor.runtime_kind,
        "name": "placeholder",  # replaced by the content hash after rendering
        "namespace": executor.namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
        "nodes": executor.nodes,
        "image": executor.container_image,
        "max_restarts": executor.retries,
        "pod_labels": dict(executor.pod_labels),
        # The user's sorted first, then the fabric's (validate() refuses keys set by both).
        "pod_annotations": {**dict(sorted(executor.pod_annotations.items())), **fabric.annotations},
        "service_account": executor.service_account,
        "image_pull_secrets": list(executor.image_pull_secrets),
        "node_selector": dict(executor.node_selector),
        "tolerations": [dict(t) for t in executor.tolerations],
        "env_from_secrets": list(executor.secret_env_from),
        "pod_security_context": pod_security_context(executor),
        "container_security_context": container_security_context(executor),
        "node_security_context": node_security_context(executor, fabric),
        "node_env": [literal_env(k, v) for k, v in sorted(fabric.env.items())] + initializers.node_env(steps),
        "volumes": list(facts.volumes),
        "volume_mounts": list(facts.mounts),
        "sidecars": list(fabric.sidecars),
        "preflight": preflight_context(executor, fabric),
        "initializers": list(steps),
        "initializer_volume": initializers.volume(facts.initializer_settings),
        "pod_group_policy": pod_group_policy(executor),
        "scheduler_name": scheduler_name(executor),
        "priority_class_name": executor.priority_class_name,
        "fail_fast_exit_codes": fail_fast_exit_codes(executor),
        "user_error_message_pattern": USER_ERROR_MESSAGE_PATTERN,
        "termination_grace_period_seconds": executor.termination_grace_period_seconds,
    }


def fail_fast_exit_codes(executor: KubeflowExecutor) -> list[int]:
    """The exit codes of the FailJob rule: the user's, plus OOMKilled's unless it restarts the gang."""
    codes = set(executor.fail_fast_exit_codes)
    if not executor.restart_on_oom_kill:
        codes.add(OOM_KILLED_EXIT_CODE)
    return sorted(codes)


def runtime_hash(runtime: Mapping[str, Any]) -> str:
    """Hash of what makes a runtime behave differently: its kind, spec and labels."""
    content = {
        "kind": runtime.get("kind"),
        "namespace": runtime.get("metadata", {}).get("namespace"),
        "labels": runtime.get("metadata", {}).get("labels", {}),
        "spec": runtime.get("spec"),
    }
    payload = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:10]


#: Runtimes rendered from the packaged template, by their context as JSON: every task of the same
#: settings renders the same runtime, and Jinja plus YAML parsing were the largest share of a dry run.
#: Not for a template of one's own, which may change while the process runs.
_RENDERED: "collections.OrderedDict[str, dict]" = collections.OrderedDict()
_RENDERED_MAX = 16
_RENDERED_LOCK = threading.Lock()


def _context_key(context: Mapping[str, Any]) -> str:
    """``context`` as JSON, in its own order: equal keys render equal runtimes (the initializer
    ``Step``s are dataclasses, written with their class name)."""

    def encode(value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return [type(value).__qualname__, dataclasses.asdict(value)]
        raise TypeError(f"{type(value).__name__} in the template context")

    return json.dumps(context, default=encode)


def render_runtime(context: Mapping[str, Any], template_path: str | None = None) -> dict[str, Any]:
    """Render, parse and name a runtime. Raises ``TemplateError`` with the template's line."""
    if template_path:
        return _render(context, template_path)
    key = _context_key(context)
    with _RENDERED_LOCK:
        runtime = _RENDERED.get(key)
        if runtime is not None:
            _RENDERED.move_to_end(key)
    if runtime is None:
        runtime = _render(context, None)
        with _RENDERED_LOCK:
            _RENDERED[key] = runtime
            while len(_RENDERED) > _RENDERED_MAX:
                _RENDERED.popitem(last=False)
    return copy.deepcopy(runtime)  # the caller's own, as a fresh render's


def _template_location(template_path: str | None) -> tuple[str, str]:
    """(directory, file name) of the runtime template: ``template_path``, or the packaged one."""
    if not template_path:
        return str(templates_dir()), DEFAULT_TEMPLATE
    path = Path(template_path).expanduser()
    if not path.is_file():
        raise TemplateError(f"runtime_template {template_path!r} does not exist")
    return str(path.resolve().parent), path.name


def _render(context: Mapping[str, Any], template_path: str | None) -> dict[str, Any]:
    directory, name = _template_location(template_path)
    try:
        text = _environment(directory).get_template(name).render(**context)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"{e.filename or name}, line {e.lineno}: template syntax error: {e.message}") from None
    except jinja2.UndefinedError as e:
        raise TemplateError(
            f"{name}: {e.message}; the template uses a variable the executor does not provide "
            "(see docs/templates.md for the variables)"
        ) from None
    obj = _parsed_runtime(text, name)
    digest = runtime_hash(obj)
    metadata = obj.setdefault("metadata", {})
    metadata["name"] = RUNTIME_NAME_PREFIX + digest
    metadata.setdefault("labels", {})[RUNTIME_HASH_LABEL] = digest
    return obj


def _parsed_runtime(text: str, name: str) -> dict[str, Any]:
    """The runtime that template ``name`` rendered as ``text``, parsed (a copy of its own)."""
    try:
        obj = yamlio.load(text)  # libyaml's loader when PyYAML has it
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at rendered line {mark.line + 1}" if mark else ""
        raise TemplateError(f"{name} rendered invalid YAML{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(obj, dict) or obj.get("kind") not in (CLUSTER_RUNTIME_KIND, "TrainingRuntime"):
        raise TemplateError(
            f"{name} must render one ClusterTrainingRuntime or TrainingRuntime, got "
            f"{type(obj).__name__ if not isinstance(obj, dict) else obj.get('kind')!r}"
        )
    return copy.deepcopy(obj)
