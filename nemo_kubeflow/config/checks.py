"""The checks of a ``KubeflowExecutor``'s values, each field's and those across fields.

``problems(executor)`` lists every problem but the fields' types (config/field_types.py checks those
first, and ``KubeflowExecutor.validate()`` runs these on fields of the right types only). Pure: no
file system, no cluster.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from nemo_kubeflow.config.field_types import has_default_value
from nemo_kubeflow.config.landing import LANDINGS, REFUSED, Landing
from nemo_kubeflow.constants import (
    ANNOTATIONS_MAX_BYTES,
    CLUSTER_RUNTIME_KIND,
    OOM_KILLED_EXIT_CODE,
    POD_GROUP_POLICIES,
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    RESERVED_KEY_PREFIX,
    RESERVED_KEYS,
    RUNTIME_KIND,
    STANDARD_RESOURCES,
    TAINT_EFFECTS,
    TOLERATION_FIELDS,
    TOLERATION_OPERATORS,
)
from nemo_kubeflow.parts import naming
from nemo_kubeflow.parts.fabrics import PROFILES, fabric_name, fabric_problems, profile_settings
from nemo_kubeflow.parts.initializers import InitializerSettings, initializer_problems, refused_access_modes
from nemo_kubeflow.quantity import parse_quantity

if TYPE_CHECKING:
    from nemo_kubeflow.config.executor import KubeflowExecutor, PVCMount


def problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """Every problem but the fields' types: ``validate()`` runs these on fields of the right types only,
    which is why no check here looks at a field's type again."""
    yield from _declared_problems(executor)
    for check in (
        _process_problems,
        _container_image_problems,
        _namespace_problems,
        _request_limit_problems,
        _extra_resource_problems,
        _env_name_problems,
        _secret_source_problems,
        _secret_reference_problems,
        _secret_env_from_problems,
        _mount_path_problems,
        _mounted_object_problems,
        _image_problems,
        _name_problems,
        _key_name_problems,
        _reserved_key_problems,
        _node_selector_value_problems,
        _annotation_size_problems,
        _toleration_problems,
        _resource_name_problems,
        _resource_count_problems,
        _runtime_problems,
        _launcher_problems,
        _workspace_problems,
        _label_value_problems,
        _security_problems,
    ):
        yield from check(executor)
    yield from fabric_problems(executor)
    yield from initializer_problems(executor)
    for check in (
        _queue_problems,
        _queueless_priority_problems,
        _pod_group_problems,
        _gang_initializer_problems,
        _scheduler_name_problems,
        _failure_policy_problems,
        _oom_kill_problems,
        _warm_start_problems,
        _ft_launcher_setting_problems,
        _preflight_problems,
    ):
        yield from check(executor)


def _value_problems(executor: "KubeflowExecutor", *fields: str) -> Iterator[str]:
    """``fields`` set to a value their ``_VALUE_RULES`` row refuses (``None`` is unset, never refused)."""
    for fname in fields:
        is_valid, rule = _VALUE_RULES[fname]
        value = getattr(executor, fname)
        if value is not None and not is_valid(value):
            yield f"{fname}={value!r}: {rule}"


def _process_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    if executor.gpus_per_node > 0 and executor.nprocs_per_node > executor.gpus_per_node:
        yield (
            f"nprocs_per_node={executor.nprocs_per_node} exceeds gpus_per_node={executor.gpus_per_node}: "
            "each process needs its own GPU; lower nprocs_per_node or raise gpus_per_node"
        )


def _container_image_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    image = executor.container_image
    if not image or not image.strip():
        yield (
            "container_image is not set: give the image the training pods run, "
            "e.g. container_image='nvcr.io/nvidia/nemo:25.02'"
        )
    elif any(c.isspace() for c in image):
        yield f"container_image={image!r}: must not contain whitespace"
    elif problem := naming.image_reference_problem(image.strip()):
        yield f"container_image={image!r}: {problem}; the kubelet would refuse to pull it"


def _namespace_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    if not naming.is_rfc1123_label(executor.namespace or ""):
        yield (
            f"namespace={executor.namespace!r}: must be a DNS-1123 label "
            "(lowercase letters, digits and '-', at most 63 characters)"
        )


def _request_limit_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    for lo, hi in (("cpu_request", "cpu_limit"), ("memory_request", "memory_limit")):
        a, b = getattr(executor, lo), getattr(executor, hi)
        qa, qb = _optional_quantity(a), _optional_quantity(b)
        if qa is not None and qb is not None and qa > qb:
            yield f"{lo}={a!r} is larger than {hi}={b!r}"


def _extra_resource_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    for res, value in executor.extra_resources.items():
        if parse_quantity(str(value)) is None:
            yield f"extra_resources[{res!r}]={value!r}: not a Kubernetes quantity"
        if res == executor.gpu_resource_name:
            yield f"extra_resources[{res!r}]: set GPUs with gpus_per_node instead"


def _runtime_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    if executor.runtime_kind not in (CLUSTER_RUNTIME_KIND, RUNTIME_KIND):
        yield f"runtime_kind={executor.runtime_kind!r}: must be {CLUSTER_RUNTIME_KIND!r} or {RUNTIME_KIND!r}"
    yield from _value_problems(executor, "runtime_name")
    if executor.runtime_name and executor.runtime_template:
        yield "runtime_name and runtime_template are exclusive: use an existing runtime or render one"


def _launcher_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    if problem := launcher_problem(executor.launcher):
        yield problem


def _workspace_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    path = executor.workspace_mount_path
    if not path.startswith("/") or path == "/" or os.path.normpath(path) != path or "\0" in path:
        yield (
            f"workspace_mount_path={path!r}: must be an absolute path, normalized and other than '/', where "
            "the task's files are mounted, e.g. '/nemo_run'"
        )


def _label_value_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    for key, value in {**executor.labels, **executor.pod_labels}.items():
        if not naming.is_label_value(str(value)):
            yield f"label {key}={value!r}: label values are {naming.LABEL_VALUE_RULE}"


def _security_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    if executor.restricted_security and executor.run_as_user == 0:
        yield "run_as_user=0 with restricted_security: the restricted profile forbids running as root"


def _preflight_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    # True, False or a string: the field's type says so.
    if isinstance(executor.preflight, str) and not executor.preflight.strip():
        yield "preflight='': give a bash command, or True for the packaged checks"


def _image_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """The other images the pods run (initializers, fabric daemons), by the same grammar."""
    for where, image in [*_initializer_images(executor), *_fabric_images(executor)]:
        # Empty or with whitespace: initializer_problems says so already.
        if image and not any(c.isspace() for c in image):
            if problem := naming.image_reference_problem(image):
                yield f"{where}={image!r}: {problem}; the kubelet would refuse to pull it"


def _initializer_images(executor: "KubeflowExecutor") -> list[tuple[str, str]]:
    """``(field, image)`` of each initializer image, with an ``initializer`` (and settings of the right class)."""
    from nemo_kubeflow.parts.initializers import settings

    if executor.initializer is None or not isinstance(init := settings(executor), InitializerSettings):
        return []
    return [
        (f"initializer_settings.{f}", getattr(init, f)) for f in ("dataset_image", "model_image", "data_cache_image")
    ]


def _fabric_images(executor: "KubeflowExecutor") -> list[tuple[str, str]]:
    """``(field, image)`` of each image of the network fabric's daemons (with settings of the right class)."""
    profile = PROFILES.get(fabric_name(executor))
    if profile is None or not isinstance(cfg := profile_settings(executor, profile.name), profile.settings):
        return []
    return [(f"{profile.field}.{f}", getattr(cfg, f)) for f in profile.images]


def _name_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """Names of other objects the pods refer to: a wrong one is not refused by the API server but
    leaves the pod Pending (an absent ServiceAccount, Secret or StorageClass can never be found)."""
    yield from _value_problems(executor, "service_account")
    for i, secret in enumerate(executor.image_pull_secrets):
        if not naming.is_rfc1123_subdomain(secret):
            yield f"image_pull_secrets[{i}]={secret!r}: must be {_SUBDOMAIN}, the name of a Secret"
    yield from _claim_name_problems(executor)
    yield from _secret_mount_name_problems(executor)
    yield from _secret_key_problems(executor)


def _secret_key_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """The keys of well-formed ``secret_key_refs`` (``_secret_reference_problems`` reports the others)."""
    for name, ref in executor.secret_key_refs.items():
        secret, _, key = str(ref).partition("/")
        if key and naming.is_rfc1123_subdomain(secret) and not naming.is_config_key(key):
            yield f"secret_key_refs[{name!r}]={ref!r}: {key!r} is not a Secret key ([-._a-zA-Z0-9], at most 253)"


def _claim_name_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """The names inside ``pvc_mounts``: storage classes and sub-paths."""
    for m in executor.pvc_mounts:
        if m.storage_class is not None and not naming.is_rfc1123_subdomain(m.storage_class):
            yield f"pvc_mounts[{m.claim_name}]: storage_class={m.storage_class!r} must be {_SUBDOMAIN}"
        if m.sub_path is not None and (problem := naming.descending_path_problem(m.sub_path)):
            yield f"pvc_mounts[{m.claim_name}]: sub_path={m.sub_path!r} {problem}"


def _secret_mount_name_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """The names inside ``secret_mounts``: Secret keys, and file modes."""
    for secret_mount in executor.secret_mounts:
        for key in secret_mount.keys:
            if not naming.is_config_key(key):
                yield (
                    f"secret_mounts[{secret_mount.secret_name}]: keys has {key!r}, not a Secret key (at "
                    "most 253 letters, digits, '-', '_' and '.', not starting with '..')"
                )
        if not 0 <= secret_mount.default_mode <= 0o777:
            yield (
                f"secret_mounts[{secret_mount.secret_name}]: default_mode={secret_mount.default_mode!r} "
                "must be a file mode 0o000..0o777"
            )


# Label and annotation keys and values, as the API server checks them.
def _key_name_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    for fname in ("labels", "pod_labels", "annotations", "pod_annotations", "node_selector"):
        for key in getattr(executor, fname):
            if not naming.is_qualified_name(key):
                yield f"{fname}[{key!r}]: not a valid key: {_KEY_RULE}"


def _reserved_key_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    for fname in ("labels", "pod_labels", "annotations", "pod_annotations"):
        if reserved := [key for key in getattr(executor, fname) if _is_reserved_key(key)]:
            yield (
                f"{fname}: {', '.join(map(repr, reserved))} {'is' if len(reserved) == 1 else 'are'} "
                f"nemo_kubeflow's own (it finds, collects and describes its jobs by them): keys "
                f"{', '.join(RESERVED_KEYS)} and {RESERVED_KEY_PREFIX}* are reserved; use a key of your own"
            )


def _node_selector_value_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    for key, value in executor.node_selector.items():
        if not naming.is_label_value(value):
            yield f"node_selector[{key!r}]={value!r}: node label values are {naming.LABEL_VALUE_RULE}"


def _annotation_size_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    for fname in ("annotations", "pod_annotations"):
        size = sum(len(k.encode()) + len(v.encode()) for k, v in getattr(executor, fname).items())
        if size > ANNOTATIONS_MAX_BYTES:
            yield (
                f"{fname}: {size} bytes in all; Kubernetes allows {ANNOTATIONS_MAX_BYTES // 1024} KiB, keys included"
            )


def _toleration_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """Tolerations as the API server validates them (``validateTolerations``): a wrong one would
    be dropped or refused, and the pods would wait forever for an untainted node."""
    for i, tol in enumerate(executor.tolerations):
        yield from _one_toleration_problems(f"tolerations[{i}]", tol)


# Resource names and signs; the quantities' syntax is checked by _extra_resource_problems.
def _resource_name_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    for res in [executor.gpu_resource_name, *executor.extra_resources]:
        where = "gpu_resource_name" if res is executor.gpu_resource_name else f"extra_resources[{res!r}]"
        if not _is_resource_name(res):
            yield (
                f"{where}: {res!r} is not a resource name: extended resources are fully qualified, "
                "e.g. 'nvidia.com/gpu' or 'vpc.amazonaws.com/efa'"
            )


def _resource_count_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    for res, value in executor.extra_resources.items():
        quantity = parse_quantity(value)
        if quantity is not None and (quantity < 0 or quantity != int(quantity)):
            yield f"extra_resources[{res!r}]={value!r}: extended resources are whole, non-negative numbers"


def _warm_start_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    preload, poll = executor.worker_preload, executor.rendezvous_poll_seconds
    if not all(_MODULE_NAME.fullmatch(m) for m in preload):
        yield (
            f"worker_preload={preload!r}: must be a list of module names to import, e.g. ['torch'] "
            "(dotted Python names, no spaces); [] starts every worker as a new Python"
        )
    if poll is not None and not 0.05 <= poll <= 1:
        yield (
            f"rendezvous_poll_seconds={poll!r}: must be a number of seconds from 0.05 to 1, e.g. 0.1; "
            "None keeps ft_launcher's 1 s"
        )


def _ft_launcher_setting_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """``worker_preload`` and ``rendezvous_poll_seconds`` set with a launcher other than ft_launcher."""
    used = _ft_launcher_settings_used(executor)
    if used and not _runs_ft_launcher(executor):
        verb, them = ("tune", "them") if len(used) > 1 else ("tunes", "it")
        yield (
            f"{' and '.join(used)} {verb} how ft_launcher starts and restarts ranks, but launcher="
            f"{executor.launcher!r} is not ft_launcher: set launcher='ft' (or run.FaultTolerance(...)), or leave "
            f"{them} unset"
        )


def _ft_launcher_settings_used(executor: "KubeflowExecutor") -> list[str]:
    """The settings of ft_launcher that are set: ``worker_preload``, ``rendezvous_poll_seconds``."""
    return [
        name for name in ("worker_preload", "rendezvous_poll_seconds") if getattr(executor, name) not in (None, [], ())
    ]


def _runs_ft_launcher(executor: "KubeflowExecutor") -> bool:
    from nemo_run.core.execution.launcher import FaultTolerance

    return executor.launcher == "ft" or isinstance(executor.launcher, FaultTolerance)


def _failure_policy_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    codes = executor.fail_fast_exit_codes
    if any(not 1 <= c <= 255 for c in codes):
        yield (
            f"fail_fast_exit_codes={codes!r}: must be a list of exit codes from 1 to 255 (0 is success; "
            "the Job's podFailurePolicy refuses it), e.g. [1]; [] restarts on every failure"
        )
    elif len(set(codes)) != len(codes):
        yield f"fail_fast_exit_codes={codes!r}: lists an exit code twice; give each once"


def _oom_kill_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    codes = executor.fail_fast_exit_codes
    if executor.restart_on_oom_kill and OOM_KILLED_EXIT_CODE in codes:
        yield (
            f"restart_on_oom_kill=True restarts the gang on exit code {OOM_KILLED_EXIT_CODE} (OOMKilled), but "
            f"fail_fast_exit_codes={codes!r} fails the job at once on it; remove {OOM_KILLED_EXIT_CODE} from "
            "fail_fast_exit_codes, or leave restart_on_oom_kill False"
        )


def _queue_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """Kueue's queue and priority class: fields that also land as labels."""
    for fname, label in (("queue_name", QUEUE_LABEL), ("workload_priority_class", PRIORITY_CLASS_LABEL)):
        yield from _value_problems(executor, fname)
        value = getattr(executor, fname)
        if value is not None and executor.labels.get(label, value) != value:
            yield f"{fname}={value!r} and labels[{label!r}]={executor.labels[label]!r} disagree; set {fname} only"


def _queueless_priority_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    if (
        executor.workload_priority_class is not None
        and executor.queue_name is None
        and QUEUE_LABEL not in executor.labels
    ):
        yield "workload_priority_class needs queue_name: Kueue orders only the jobs of its queues"


def _pod_group_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    if executor.pod_group_policy not in POD_GROUP_POLICIES:
        yield f"pod_group_policy={executor.pod_group_policy!r}: must be one of {', '.join(POD_GROUP_POLICIES)}"
    if executor.schedule_timeout_seconds is not None and executor.pod_group_policy != "coscheduling":
        yield "schedule_timeout_seconds applies to pod_group_policy='coscheduling' only"


def _gang_initializer_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    if executor.pod_group_policy != "none" and executor.initializer is not None:
        yield (
            f"pod_group_policy={executor.pod_group_policy!r} with an initializer: Trainer counts the initializer "
            "pods in the gang, but they must finish before the node pods are created, so the gang can never "
            "be complete; use queue_name (Kueue) instead, or drop the initializer"
        )


def _scheduler_name_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    yield from _value_problems(executor, "priority_class_name", "scheduler_name", "topology_key")


def _env_name_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """The names of the task's environment variables, each set once."""
    seen: set[str] = set()
    for fname in ("env_vars", "secret_env_vars", "secret_key_refs"):
        for name in getattr(executor, fname):
            yield from _env_var_problems(fname, name, seen)
            seen.add(name)


def _secret_source_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    for name, source in executor.secret_env_vars.items():
        kind, _, ref = str(source).partition(":")
        if kind not in ("env", "file") or not ref:
            yield (
                f"secret_env_vars[{name!r}]: give where to read the value, 'env:LOCAL_VAR' or "
                "'file:/path' (literal values are refused because NeMo-Run writes the executor to disk)"
            )


def _secret_reference_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """``secret_key_refs`` of the form ``secret-name/key``."""
    for name, ref in executor.secret_key_refs.items():
        secret, _, key = str(ref).partition("/")
        if not naming.is_rfc1123_subdomain(secret) or not key:
            yield f"secret_key_refs[{name!r}]={ref!r}: expected 'secret-name/key'"


def _secret_env_from_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    for secret in executor.secret_env_from:
        if not naming.is_rfc1123_subdomain(secret):
            yield f"secret_env_from: {secret!r} is not a valid Secret name ({_OBJECT_NAME_RULE})"


def _volume_mounts(executor: "KubeflowExecutor") -> list[tuple[str, str]]:
    """``(entry, mount_path)`` of each entry of ``pvc_mounts`` and ``secret_mounts``."""
    return [(f"pvc_mounts[{m.claim_name}]", m.mount_path) for m in executor.pvc_mounts] + [
        (f"secret_mounts[{m.secret_name}]", m.mount_path) for m in executor.secret_mounts
    ]


def _mount_path_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """Mount paths: absolute, and one mount per path."""
    paths: dict[str, str] = {executor.workspace_mount_path: "workspace_mount_path"}
    if executor.shm_size is not None:
        paths["/dev/shm"] = "shm_size"
    for what, path in _volume_mounts(executor):
        if not str(path).startswith("/"):
            yield f"{what}: mount_path {path!r} must be an absolute path"
        elif path in paths:
            yield f"{what}: mount_path {path!r} is already used by {paths[path]}"
        paths[path] = what


def _mounted_object_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """The claims and Secrets the mounts name."""
    for m in executor.pvc_mounts:
        yield from _claim_problems(m)
    for secret_mount in executor.secret_mounts:
        if not naming.is_rfc1123_subdomain(secret_mount.secret_name):
            yield f"secret_mounts: {secret_mount.secret_name!r} is not a valid Secret name ({_OBJECT_NAME_RULE})"


def _env_var_problems(fname: str, name: str, seen: set[str]) -> Iterator[str]:
    """Problems of environment variable ``name`` of field ``fname``, the names ``seen`` before it set already."""
    if reserved := naming.trainer_env_problem(name):
        yield f"{fname}: environment variable {reserved}; remove it"
    elif not naming.is_env_var_name(name):
        yield f"{fname}: environment variable {name!r}: names are {naming.ENV_VAR_NAME_RULE}"
    if name in seen:
        yield f"environment variable {name} is set twice (env_vars, secret_env_vars, secret_key_refs)"


def _is_reserved_key(key: str) -> bool:
    """Whether label or annotation ``key`` is one nemo_kubeflow finds its own objects by."""
    return key in RESERVED_KEYS or str(key).startswith(RESERVED_KEY_PREFIX)


def _is_resource_name(res: str) -> bool:
    """Whether ``res`` names a resource: a standard one (``cpu``, ``hugepages-*``...) or a fully qualified one."""
    return naming.is_qualified_name(res) and ("/" in res or res in STANDARD_RESOURCES or res.startswith("hugepages-"))


def _is_queue_object_name(value: str) -> bool:
    """Whether ``value`` can name a Kueue object that a label also carries (a label value has at most 63 characters)."""
    return naming.is_rfc1123_subdomain(value) and len(value) <= 63


def _one_toleration_problems(where: str, tol: dict) -> Iterator[str]:
    """What the API server would refuse in one toleration ``tol``."""
    yield from _unknown_toleration_fields(where, tol)
    key, operator = tol.get("key", ""), tol.get("operator", "Equal")
    value, effect = tol.get("value", ""), tol.get("effect", "")
    if not all(isinstance(v, str) for v in (key, operator, value, effect)):
        yield f"{where}={tol!r}: key, operator, value and effect are strings"
        return
    for problem in (
        _toleration_key_problem(key),
        _toleration_operator_problem(key, operator, value),
        _toleration_effect_problem(effect),
        _toleration_seconds_problem(tol.get("tolerationSeconds"), effect),
    ):
        if problem:
            yield f"{where}: {problem}"


def _toleration_key_problem(key: str) -> Optional[str]:
    if key and not naming.is_qualified_name(key):
        return f"key={key!r} is not a taint key (a label key such as 'nvidia.com/gpu')"
    return None


def _toleration_effect_problem(effect: str) -> Optional[str]:
    if effect and effect not in TAINT_EFFECTS:
        return f"effect={effect!r} must be one of {', '.join(TAINT_EFFECTS)} (or unset: any effect)"
    return None


def _unknown_toleration_fields(where: str, tol: dict) -> Iterator[str]:
    unknown = sorted(set(tol) - set(TOLERATION_FIELDS))
    if unknown:
        yield (
            f"{where}: unknown field(s) {', '.join(map(repr, unknown))}: a toleration has "
            f"{', '.join(TOLERATION_FIELDS)}{_toleration_field_hints(unknown)}"
        )


def _toleration_field_hints(unknown: list[str]) -> str:
    """`` (did you mean ...)`` for the ``unknown`` toleration fields close to a real one ('' for none)."""
    close = {u: difflib.get_close_matches(u, TOLERATION_FIELDS, n=1) for u in unknown}
    hints = "; ".join(f"did you mean {c[0]!r} for {u!r}" for u, c in close.items() if c)
    return f" ({hints})" if hints else ""


def _toleration_operator_problem(key: str, operator: str, value: str) -> Optional[str]:
    if operator not in TOLERATION_OPERATORS:
        return f"operator={operator!r} must be one of {', '.join(TOLERATION_OPERATORS)}"
    if operator == "Exists":
        return f"operator 'Exists' takes no value (got {value!r}); drop value, or use 'Equal'" if value else None
    if not key:
        return "an empty key tolerates every taint only with operator 'Exists'"
    if not naming.is_label_value(value):
        return f"value={value!r} is not a taint value ({naming.LABEL_VALUE_RULE})"
    return None


def _toleration_seconds_problem(seconds: object, effect: str) -> Optional[str]:
    if seconds is None:
        return None
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        return f"tolerationSeconds={seconds!r} must be an integer"
    if effect != "NoExecute":
        return f"tolerationSeconds applies to effect 'NoExecute' only (effect is {effect!r})"
    return None


def _claim_problems(m: PVCMount) -> Iterator[str]:
    """One ``pvc_mounts`` entry's claim: its name, and with ``create`` its size and access modes."""
    if not naming.is_rfc1123_subdomain(m.claim_name):
        yield f"pvc_mounts: claim_name {m.claim_name!r} is not a valid Kubernetes name ({_OBJECT_NAME_RULE})"
    if not m.create:
        return
    if m.size is None or parse_quantity(str(m.size)) is None:
        yield f"pvc_mounts[{m.claim_name}]: create=True needs size, e.g. size='100Gi'"
    if (refused := refused_access_modes(m.access_modes)) is not None:
        yield f"pvc_mounts[{m.claim_name}]: invalid access_modes {refused}"


# A module worker_preload imports: a dotted Python name.
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: The rule of a DNS-1123 subdomain, the name of most objects, in words for messages.
_OBJECT_NAME_RULE = "at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
#: What the name of an object the pods refer to must be, for messages.
_SUBDOMAIN = f"a Kubernetes object name ({_OBJECT_NAME_RULE})"
#: The rule of label and annotation keys, in words for messages.
_KEY_RULE = (
    "keys are an optional DNS-subdomain prefix and '/', then at most 63 letters, digits, "
    "'-', '_' and '.' starting and ending with a letter or digit, e.g. 'example.com/team'"
)
_NOT_AN_OBJECT_NAME = f"not a valid Kubernetes object name ({_OBJECT_NAME_RULE})"
_NOT_A_QUEUE_OBJECT_NAME = (
    "must be a Kubernetes object name of at most 63 characters (lowercase letters, digits, '-' and '.')"
)
#: The optional fields that name something, as ``_value_problems`` checks them when set:
#: field -> (whether a value is valid, what the message says of an invalid one).
_VALUE_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    # Objects Trainer or the pods refer to: a wrong name is refused, or leaves the pods Pending.
    "runtime_name": (naming.is_rfc1123_subdomain, _NOT_AN_OBJECT_NAME),
    "service_account": (naming.is_rfc1123_subdomain, f"must be {_SUBDOMAIN}"),
    "priority_class_name": (naming.is_rfc1123_subdomain, _NOT_AN_OBJECT_NAME),
    "scheduler_name": (naming.is_rfc1123_subdomain, _NOT_AN_OBJECT_NAME),
    # A node label key, which the pod affinity's topologyKey is.
    "topology_key": (naming.is_qualified_name, "must be a node label key, e.g. 'cloud.google.com/gce-topology-block'"),
    # Kueue's objects, named in labels too (at most 63 characters there).
    "queue_name": (_is_queue_object_name, _NOT_A_QUEUE_OBJECT_NAME),
    "workload_priority_class": (_is_queue_object_name, _NOT_A_QUEUE_OBJECT_NAME),
}


def launcher_problem(launcher: object) -> Optional[str]:
    """Why ``launcher`` names no NeMo-Run launcher (``None`` when it is one, or a Launcher object)."""
    from nemo_run.core.execution.launcher import LAUNCHER_MAP

    if not isinstance(launcher, str) or launcher in LAUNCHER_MAP:
        return None
    close = difflib.get_close_matches(launcher, list(LAUNCHER_MAP), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (
        f"launcher={launcher!r}: not a NeMo-Run launcher; {hint}use one of "
        f"{', '.join(map(repr, sorted(LAUNCHER_MAP)))}, a run.Torchrun(...)/run.FaultTolerance(...), or None"
    )


def _optional_quantity(value: object) -> Optional[Decimal]:
    """``value`` as a number (``None`` when unset or not a quantity)."""
    return parse_quantity(str(value)) if value is not None else None


def _declared_problems(executor: "KubeflowExecutor") -> Iterator[str]:
    """The checks derived from each field's ``Landing`` (config/landing.py): integer ranges, quantities,
    and with ``runtime_name`` every field set that only a rendered runtime could carry."""
    for f in dataclasses.fields(executor):
        if (lands := LANDINGS.get(f.name)) is not None:
            yield from _landing_problems(executor, f, lands)


def _landing_problems(executor: "KubeflowExecutor", f: dataclasses.Field, lands: Landing) -> Iterator[str]:
    """Field ``f``'s problems by its ``Landing``: its range, its quantity, its refusal with ``runtime_name``."""
    value = getattr(executor, f.name)
    if problem := lands.range_problem(f.name, value):
        yield problem
    if lands.quantity and (problem := _quantity_problem(f.name, value, lands.example)):
        yield problem
    if refusal := _runtime_name_refusal(executor, f, lands):
        yield refusal


def _runtime_name_refusal(executor: "KubeflowExecutor", f: dataclasses.Field, lands: Landing) -> Optional[str]:
    """The refusal of field ``f`` set with ``runtime_name`` though only a rendered runtime could carry it, or None."""
    if executor.runtime_name is None or lands.existing != REFUSED or has_default_value(executor, f):
        return None
    return lands.refusal(f.name, executor.runtime_name)


def _quantity_problem(name: str, value: object, example: object) -> Optional[str]:
    """Why ``value`` of the quantity field ``name`` is no quantity of a resource, or None (also when unset;
    a dict of quantities, ``extra_resources``, is checked entry by entry elsewhere)."""
    if value is None or isinstance(value, dict):
        return None
    quantity = parse_quantity(str(value))
    if quantity is None:
        return f"{name}={value!r}: not a Kubernetes quantity (e.g. {example!r}, '500m', '64Gi')"
    if quantity < 0:
        return f"{name}={value!r}: must not be negative"
    return None
