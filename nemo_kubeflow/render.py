"""Rendering the training runtime from its Jinja template.

``runtime_context`` turns an executor into template variables and ``render_runtime``
renders, parses and names the result. Both are pure apart from reading the template
file. Rendered runtimes are named by a hash of their content, so every task with the
same settings shares one runtime (the API server answers 409 to the second create,
which means "reuse").
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import shlex
from pathlib import Path
from typing import Any, Mapping

import jinja2
import yaml

from nemo_kubeflow.constants import (
    CLUSTER_RUNTIME_KIND,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    RUNTIME_HASH_LABEL,
)
from nemo_kubeflow.errors import TemplateError

DEFAULT_TEMPLATE = "training_runtime.yaml.j2"
RUNTIME_NAME_PREFIX = "nemo-kubeflow-"
SHM_VOLUME = "dshm"


def templates_dir() -> Path:
    """The packaged templates (inside the wheel), or the repository's ``templates/``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / DEFAULT_TEMPLATE).is_file():
            return candidate
    raise TemplateError(
        f"the runtime templates are missing (looked in {here / 'templates'} and "
        f"{here.parent / 'templates'}); reinstall nemo-kubeflow"
    )


def _tojson(value: Any) -> str:
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()  # a misspelled variable: UndefinedError, not TypeError
    return json.dumps(value, ensure_ascii=False)


@functools.lru_cache(maxsize=16)
def _environment(directory: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    # JSON is valid YAML: any value inserted with tojson is quoted safely. Jinja's own
    # tojson escapes <>&' for HTML, which is still valid, but plain json.dumps reads better.
    env.filters["tojson"] = _tojson
    env.filters["shell_quote"] = lambda value: shlex.quote(str(value))
    return env


def tcpxo_context(executor) -> dict[str, Any]:
    """Template values for GKE GPUDirect-TCPXO (A3 Mega)."""
    cfg = executor.tcpxo
    networks = cfg.networks()
    gpus = executor.gpus_per_node
    devices = [f"/dev/nvidia{i}" for i in range(gpus)] + [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/dmabuf_import_helper",
    ]
    interfaces = [{"interfaceName": "eth0", "network": cfg.default_network}] + [
        {"interfaceName": f"eth{i}", "network": net} for i, net in enumerate(networks, start=1)
    ]
    gpu_nics = ",".join(f"eth{i}" for i in range(1, len(networks) + 1))
    # NCCL settings from GKE's TCPXO guide; the library path is extended in the
    # launch script (not replaced here) so the image's own LD_LIBRARY_PATH survives.
    nccl_env = {
        "NCCL_FASTRAK_CTRL_DEV": "eth0",
        "NCCL_FASTRAK_IFNAME": gpu_nics,
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_CROSS_NIC": "0",
        "NCCL_ALGO": "Ring,Tree",
        "NCCL_PROTO": "Simple,LL128",
        "NCCL_MIN_NCHANNELS": "4",
        "NCCL_TUNER_PLUGIN": "libnccl-tuner.so",
        "NCCL_TUNER_CONFIG_PATH": "/usr/local/nvidia/lib64/a3plus_tuner_config.textproto",
        "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE": "/usr/local/nvidia/lib64/a3plus_guest_config.textproto",
        "NCCL_DYNAMIC_CHUNK_SIZE": "524288",
        "NCCL_P2P_NET_CHUNKSIZE": "524288",
        "NCCL_P2P_PCI_CHUNKSIZE": "524288",
        "NCCL_P2P_NVL_CHUNKSIZE": "1048576",
        "NCCL_FASTRAK_NUM_FLOWS": "2",
        "NCCL_FASTRAK_USE_SNAP": "1",
        "NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS": "600000",
        "NCCL_FASTRAK_ENABLE_CONTROL_CHANNEL": "0",
        "NCCL_BUFFSIZE": "8388608",
        "NCCL_NET_GDR_LEVEL": "PIX",
        "NCCL_FASTRAK_ENABLE_HOTPATH_LOGGING": "0",
        "NCCL_FASTRAK_USE_LLCM": "1",
        "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": "/dev/aperture_devices",
        "NCCL_NVLS_ENABLE": "0",
        **cfg.nccl_env,
    }
    return {
        "daemon_image": cfg.daemon_image,
        "nic_count": len(networks),
        "device_annotation": "".join(f"- path: {d}\n" for d in devices),
        "interfaces_annotation": json.dumps(interfaces, indent=2),
        "nccl_env": nccl_env,
    }


def runtime_volumes(executor) -> tuple[list[dict], list[dict]]:
    """Volumes and ``node`` mounts the runtime carries: /dev/shm, PVCs, Secret files, TCPXO."""
    volumes: list[dict] = []
    mounts: list[dict] = []
    if executor.shm_size is not None:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": str(executor.shm_size)}})
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    for i, pvc in enumerate(executor.pvc_mounts):
        name = f"pvc-{i}"
        claim: dict[str, Any] = {"claimName": pvc.claim_name}
        mount = {"name": name, "mountPath": pvc.mount_path}
        if pvc.read_only:
            claim["readOnly"] = mount["readOnly"] = True
        volumes.append({"name": name, "persistentVolumeClaim": claim})
        if pvc.sub_path:
            mount["subPath"] = pvc.sub_path
        mounts.append(mount)
    for i, sm in enumerate(executor.secret_mounts):
        name = f"secret-{i}"
        secret: dict[str, Any] = {"secretName": sm.secret_name, "defaultMode": sm.default_mode}
        if sm.keys:
            secret["items"] = [{"key": k, "path": k} for k in sm.keys]
        volumes.append({"name": name, "secret": secret})
        mounts.append({"name": name, "mountPath": sm.mount_path, "readOnly": True})
    if executor.enable_tcpxo:
        host = executor.tcpxo.nvidia_host_path
        volumes += [
            {"name": "tcpxo-nvidia", "hostPath": {"path": host}},
            {"name": "tcpxo-sys", "hostPath": {"path": "/sys"}},
            {"name": "tcpxo-proc-sys", "hostPath": {"path": "/proc/sys"}},
            {"name": "tcpxo-aperture", "hostPath": {"path": "/dev/aperture_devices"}},
        ]
        mounts += [
            {"name": "tcpxo-nvidia", "mountPath": "/usr/local/nvidia"},
            {"name": "tcpxo-aperture", "mountPath": "/dev/aperture_devices"},
        ]
    return volumes, mounts


def pod_security_context(executor) -> dict[str, Any]:
    ctx: dict[str, Any] = {}
    if executor.restricted_security:
        ctx["runAsNonRoot"] = True
        ctx["seccompProfile"] = {"type": "RuntimeDefault"}
    if executor.run_as_user is not None:
        ctx["runAsUser"] = executor.run_as_user
    if executor.fs_group is not None:
        ctx["fsGroup"] = executor.fs_group
    return ctx


def container_security_context(executor) -> dict[str, Any]:
    if not executor.restricted_security:
        return {}
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def runtime_context(executor) -> dict[str, Any]:
    """The template variables for ``executor`` (documented in docs/templates.md)."""
    volumes, mounts = runtime_volumes(executor)
    return {
        "kind": executor.runtime_kind,
        "name": "placeholder",  # replaced by the content hash after rendering
        "namespace": executor.namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
        "nodes": executor.nodes,
        "image": executor.container_image,
        "max_restarts": executor.retries,
        "pod_labels": dict(executor.pod_labels),
        "pod_annotations": dict(executor.pod_annotations),
        "service_account": executor.service_account,
        "image_pull_secrets": list(executor.image_pull_secrets),
        "node_selector": dict(executor.node_selector),
        "tolerations": [dict(t) for t in executor.tolerations],
        "env_from_secrets": list(executor.secret_env_from),
        "pod_security_context": pod_security_context(executor),
        "container_security_context": container_security_context(executor),
        "volumes": volumes,
        "volume_mounts": mounts,
        "tcpxo": tcpxo_context(executor) if executor.enable_tcpxo else None,
    }


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


def render_runtime(context: Mapping[str, Any], template_path: str | None = None) -> dict[str, Any]:
    """Render, parse and name a runtime. Raises ``TemplateError`` with the template's line."""
    if template_path:
        path = Path(template_path).expanduser()
        if not path.is_file():
            raise TemplateError(f"runtime_template {template_path!r} does not exist")
        directory, name = str(path.resolve().parent), path.name
    else:
        directory, name = str(templates_dir()), DEFAULT_TEMPLATE
    try:
        text = _environment(directory).get_template(name).render(**context)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"{e.filename or name}, line {e.lineno}: template syntax error: {e.message}") from None
    except jinja2.UndefinedError as e:
        raise TemplateError(
            f"{name}: {e.message}; the template uses a variable the executor does not provide "
            "(see docs/templates.md for the variables)"
        ) from None
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at rendered line {mark.line + 1}" if mark else ""
        raise TemplateError(f"{name} rendered invalid YAML{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(obj, dict) or obj.get("kind") not in (CLUSTER_RUNTIME_KIND, "TrainingRuntime"):
        raise TemplateError(
            f"{name} must render one ClusterTrainingRuntime or TrainingRuntime, got "
            f"{type(obj).__name__ if not isinstance(obj, dict) else obj.get('kind')!r}"
        )
    obj = copy.deepcopy(obj)
    digest = runtime_hash(obj)
    metadata = obj.setdefault("metadata", {})
    metadata["name"] = RUNTIME_NAME_PREFIX + digest
    metadata.setdefault("labels", {})[RUNTIME_HASH_LABEL] = digest
    return obj
