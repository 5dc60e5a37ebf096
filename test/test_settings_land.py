"""Every executor setting lands where config/landing.py declares, or is refused naming the field.

For every field of ``KubeflowExecutor`` (``dataclasses.fields``: a field added later is covered, and one
without a declaration fails), in both modes (a rendered runtime, and ``runtime_name``, an admin's
runtime): the field's declared example, set alone (with the settings it needs), changes what is at its
declared manifest path, or ``validate()`` refuses it and names it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import nemo_run as run
import pytest
from nemo_run.run.torchx_backend.packaging import package

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.plan import Submission, build_for_app
from nemo_kubeflow.config.landing import CLIENT, LANDINGS, REFUSED, RUNTIME, Landing
from nemo_kubeflow.errors import ConfigError

ADMIN_RUNTIME = "torch-distributed"
BASE = {"container_image": "registry.example.com/train:1"}
FIELDS = [f for f in dataclasses.fields(KubeflowExecutor) if f.init]
_MISSING = object()


def lookup(obj: Any, path: str) -> Any:
    """The value at dotted ``path`` (``[name]``: the list item of that name; ``[0]``: an index)."""
    for part in re.findall(r"[^.\[\]]+|\[[^\]]+\]", path):
        if part.startswith("["):
            key = part[1:-1]
            if not isinstance(obj, list):
                return _MISSING
            if key.isdigit():
                obj = obj[int(key)] if int(key) < len(obj) else _MISSING
            else:
                obj = next((item for item in obj if isinstance(item, dict) and item.get("name") == key), _MISSING)
        else:
            obj = obj.get(part, _MISSING) if isinstance(obj, dict) else _MISSING
        if obj is _MISSING:
            return _MISSING
    return obj


def build(tmp_path, settings: dict) -> Submission:
    executor = KubeflowExecutor(**settings)
    # A task folder with a file, so that the task's files ship (workspace_mount_path has something to mount).
    job_dir = tmp_path / "task"
    (job_dir / "configs").mkdir(parents=True, exist_ok=True)
    (job_dir / "configs" / "task.yaml").write_text("a: 1\n")
    executor.experiment_id = executor.experiment_id or "exp"
    executor.job_dir = str(job_dir) if settings.get("job_dir") is None else settings["job_dir"]
    app = package("task", run.Script(inline="print('hi')", entrypoint="python"), executor)
    return build_for_app(app, executor, local_script=False)


def at(submission: Submission, kind: str, path: str) -> Any:
    obj = submission.runtime if kind == RUNTIME else submission.trainjob
    return lookup(obj, path)


def settings_for(name: str, lands: Landing, admin: bool) -> tuple[dict, dict]:
    """(settings with the field's example, the same without it)."""
    base = {**BASE, **lands.example_settings()}
    if admin:
        base["runtime_name"] = ADMIN_RUNTIME
    return {**base, name: lands.example_value()}, base


def test_every_field_declares_where_it_lands():
    undeclared = [f.name for f in FIELDS if f.name not in LANDINGS]
    assert not undeclared, (
        f"declare where {', '.join(undeclared)} land(s) in nemo_kubeflow/config/landing.py "
        "(LANDINGS), with a non-default example"
    )
    stale = sorted(set(LANDINGS) - {f.name for f in FIELDS})
    assert not stale, f"LANDINGS declares fields the executor no longer has: {stale}"


@pytest.mark.parametrize("admin", [False, True], ids=["rendered-runtime", "runtime_name"])
@pytest.mark.parametrize("name", [f.name for f in FIELDS])
def test_a_set_field_lands_or_is_refused_naming_it(name, admin, tmp_path, monkeypatch):
    monkeypatch.setenv("EXAMPLE_TOKEN", "canary-not-a-secret")
    lands = LANDINGS.get(name)
    assert lands is not None, f"{name}: no Landing in nemo_kubeflow/config/landing.py"
    field = next(f for f in FIELDS if f.name == name)
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    example = lands.example_value()
    assert example is not None and example != default, f"{name}: its declared example is its default"
    with_field, without = settings_for(name, lands, admin)
    kind = lands.existing if admin else lands.rendered
    if kind == REFUSED:
        with pytest.raises(ConfigError) as refused:
            build(tmp_path, with_field)
        lines = [line for line in str(refused.value).splitlines() if re.match(rf"\s+- {name}\b", line)]
        assert lines and "runtime_name" in lines[0], f"{name} not named in: {refused.value}"
        return
    submission = build(tmp_path, with_field)
    if kind == CLIENT:
        return  # used on the submitting machine only: accepted, and nothing in the manifests to find
    path = (lands.existing_path or lands.path) if admin else lands.path
    value = at(submission, kind, path)
    assert value is not _MISSING, f"{name}={example!r}: nothing at its declared path {kind}: {path}"
    try:
        before = at(build(tmp_path, without), kind, path)
    except ConfigError as e:  # the settings around it need it (initializer and initializer_settings)
        assert name in str(e), e
        return
    assert value != before, f"{name}={example!r}: {kind}: {path} is the same as without it"


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"nodes": 2**31}, "nodes"),
        ({"nprocs_per_node": 2**31}, "nprocs_per_node"),
        ({"retries": 2**31}, "retries"),
        ({"run_as_user": 2**63}, "run_as_user"),
        ({"fs_group": 2**63}, "fs_group"),
        ({"active_deadline_seconds": 2**63}, "active_deadline_seconds"),
        ({"termination_grace_period_seconds": 2**63}, "termination_grace_period_seconds"),
        ({"ttl_seconds_after_finished": 2**31}, "ttl_seconds_after_finished"),
        ({"schedule_timeout_seconds": 2**31, "pod_group_policy": "coscheduling"}, "schedule_timeout_seconds"),
    ],
)
def test_integers_beyond_kubernetes_ranges_are_refused_naming_the_field(settings, field):
    with pytest.raises(ConfigError, match=rf"{field}={settings[field]}: must be .*(at most|to) \d+"):
        KubeflowExecutor(**BASE, **settings).validate()


def test_the_largest_int32_still_passes():
    KubeflowExecutor(**BASE, retries=2**31 - 1, run_as_user=2**63 - 1).validate()


def test_offline_validation_honours_the_schema_int_formats(tmp_path):
    from nemo_kubeflow.errors import ManifestValidationError
    from nemo_kubeflow.schema.validation import check_manifests

    submission = build(tmp_path, dict(BASE))
    submission.trainjob["spec"]["trainer"]["numNodes"] = 2**31
    with pytest.raises(ManifestValidationError, match=r"spec\.trainer\.numNodes.*does not fit int32"):
        check_manifests(submission.manifests())


@pytest.mark.parametrize(
    "field, key",
    [
        ("labels", "app.kubernetes.io/managed-by"),
        ("labels", "nemo-kubeflow.nvidia.com/experiment"),
        ("pod_labels", "nemo-kubeflow.nvidia.com/trainjob"),
        ("annotations", "nemo-kubeflow.nvidia.com/node-avoidance"),
        ("pod_annotations", "app.kubernetes.io/managed-by"),
    ],
)
def test_reserved_label_and_annotation_keys_are_refused_naming_them(field, key):
    with pytest.raises(ConfigError, match=rf"{field}: '{re.escape(key)}' is nemo_kubeflow's own"):
        KubeflowExecutor(**BASE, **{field: {key: "helm"}}).validate()


# --- an admin's runtime: the patch adds, never replaces (checked against the runtime read at submission) ---


def admin_runtime(**pod: Any) -> dict:
    """Trainer's torch-distributed shape, with ``pod`` fields of the admin's own in the node pods."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": ADMIN_RUNTIME},
        "spec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {"containers": [{"name": "node", "image": "pytorch/pytorch"}], **pod}
                                    }
                                }
                            },
                        }
                    ]
                }
            }
        },
    }


def admin_trainjob(tmp_path, **settings: Any) -> dict:
    return build(tmp_path, {**BASE, "runtime_name": ADMIN_RUNTIME, **settings}).trainjob


@pytest.mark.parametrize(
    "settings, admin_pod, field",
    [
        (
            {"tolerations": [{"key": "a", "operator": "Exists"}]},
            {"tolerations": [{"key": "site", "operator": "Exists"}]},
            "tolerations",
        ),
        ({"node_selector": {"pool": "mine"}}, {"nodeSelector": {"pool": "site"}}, "node_selector"),
        ({"service_account": "mine"}, {"serviceAccountName": "site"}, "service_account"),
        ({"run_as_user": 1000}, {"securityContext": {"runAsUser": 2000}}, "run_as_user"),
        ({}, {"volumes": [{"name": "dshm", "emptyDir": {}}]}, "shm_size"),
        (
            {},
            {
                "containers": [{"name": "node", "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}],
                "volumes": [{"name": "shm", "emptyDir": {}}],
            },
            "shm_size",
        ),
        (
            {"restricted_security": True, "run_as_user": 1000},
            {"containers": [{"name": "node"}, {"name": "site-agent"}]},
            "restricted_security",
        ),
    ],
)
def test_a_patch_that_would_replace_the_admins_setting_is_refused_naming_the_field(
    tmp_path, settings, admin_pod, field
):
    from nemo_kubeflow.schema.patch_conflicts import runtime_patch_conflicts

    problems = runtime_patch_conflicts(admin_trainjob(tmp_path, **settings), admin_runtime(**admin_pod))
    assert any(p.startswith(f"{field}:") for p in problems), problems


def test_a_patch_that_only_adds_passes(tmp_path):
    from nemo_kubeflow.schema.patch_conflicts import runtime_patch_conflicts

    trainjob = admin_trainjob(
        tmp_path,
        tolerations=[{"key": "site", "operator": "Exists"}, {"key": "a", "operator": "Exists"}],
        node_selector={"pool": "site", "zone": "a"},
        pod_labels={"team": "a"},
        image_pull_secrets=["pull"],
    )
    runtime = admin_runtime(
        tolerations=[{"key": "site", "operator": "Exists"}],
        nodeSelector={"pool": "site"},
        imagePullSecrets=[{"name": "site-pull"}],
    )
    assert runtime_patch_conflicts(trainjob, runtime) == []


def test_a_runtime_without_the_node_job_is_refused(tmp_path):
    from nemo_kubeflow.schema.patch_conflicts import runtime_patch_conflicts

    runtime = admin_runtime()
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] = "trainer"
    problems = runtime_patch_conflicts(admin_trainjob(tmp_path), runtime)
    assert problems and "no replicated job 'node'" in problems[0], problems
