"""Submission against the local cluster: request budget, faults at every step, rollback, bad input."""

import os
import time
from pathlib import Path

import pytest
from torchx.specs import Role

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.packaging import SHARE_MIN_BYTES
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import submit
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.errors import (
    AlreadyExistsError,
    ClusterUnreachableError,
    KubeconfigError,
    NotFoundError,
    PermissionDeniedError,
    SubmissionError,
)

RESOURCES = (
    "configmaps",
    "secrets",
    "persistentvolumeclaims",
    "trainjobs",
    "clustertrainingruntimes",
    "trainingruntimes",
)


@pytest.fixture()
def cluster(local):
    local.allow_all()
    local.clear_requests()
    return KubernetesCluster(kubeconfig=str(local.kubeconfig_path), backoff=0.01, max_backoff=0.05)


def snapshot(local):
    return {r: sorted(o["metadata"]["name"] for o in local.objects(r, None)) for r in RESOURCES}


def plan(task="t", experiment="exp", code=b"print(1)\n", **kw):
    executor = KubeflowExecutor(container_image="img", nodes=1, shm_size=None, **kw)
    role = Role(name=task, image="", entrypoint="bash", args=["-c", "sleep 30"])
    files = [BundleFile("code/a.py", code)]
    return build_submission(executor, role, files, task_name=task, experiment_id=experiment)


def writes(local):
    return [(r.verb, r.resource) for r in local.requests if r.verb not in ("get", "list")]


def test_request_budget_and_owner_references(local, cluster):
    result = submit(cluster, plan("budget"))
    assert writes(local) == [
        ("create", "clustertrainingruntimes"),
        ("create", "trainjobs"),
        ("create", "configmaps"),
        ("patch", "trainjobs"),
    ]
    uid = result.trainjob["metadata"]["uid"]
    code_cm = result.trainjob["metadata"]["name"] + "-code"
    [cm] = [c for c in local.objects("configmaps", "default") if c["metadata"]["name"] == code_cm]
    assert cm["metadata"]["ownerReferences"][0]["uid"] == uid
    # A second task with the same settings reuses the runtime (409) and creates no other.
    local.clear_requests()
    submit(cluster, plan("budget2"))
    runtime_creates = [r.status_code for r in local.requests if r.resource == "clustertrainingruntimes"]
    assert runtime_creates == [409]


def test_a_runtime_already_seen_is_not_sent_again(local, cluster):
    known: set = set()
    submit(cluster, plan("seen1", experiment="seen"), known_runtimes=known)
    assert len(known) == 1
    local.clear_requests()
    result = submit(cluster, plan("seen2", experiment="seen"), known_runtimes=known)
    # 3 requests: the runtime this process created a moment ago is not POSTed again.
    assert writes(local) == [("create", "trainjobs"), ("create", "configmaps"), ("patch", "trainjobs")]
    assert result.actions[0][0] == "reuse"


def shared_code(text: str) -> bytes:
    """Code large enough to be shared (``SHARE_MIN_BYTES``), its own for each ``text``."""
    return f"print({text!r})\n".encode() + b"#" * SHARE_MIN_BYTES + b"\n"


def owner_uids(local, name: str) -> set[str]:
    [cm] = [c for c in local.objects("configmaps", "default") if c["metadata"]["name"] == name]
    return {ref["uid"] for ref in cm["metadata"]["ownerReferences"]}


def test_tasks_of_the_same_code_share_its_configmap_at_no_more_requests(local, cluster):
    code = shared_code("budget")
    name = plan(code=code).configmaps[0]["metadata"]["name"]
    known: set = set()
    first = submit(cluster, plan("share1", experiment="share", code=code), known_runtimes=known)
    assert writes(local) == [
        ("create", "clustertrainingruntimes"),
        ("create", "trainjobs"),
        ("create", "configmaps"),
        ("patch", "trainjobs"),
    ]
    local.clear_requests()
    second = submit(cluster, plan("share2", experiment="share", code=code), known_runtimes=known)
    # The code's ConfigMap this process created is not sent again: one patch adds the TrainJob to its owners.
    assert writes(local) == [("create", "trainjobs"), ("patch", "configmaps"), ("patch", "trainjobs")]
    assert second.actions[2] == ("share", "ConfigMap", name)
    uids = {first.trainjob["metadata"]["uid"], second.trainjob["metadata"]["uid"]}
    assert owner_uids(local, name) == uids
    # Another process (nothing known): its create is answered 409, then the same patch.
    local.clear_requests()
    third = submit(cluster, plan("share3", experiment="share", code=code))
    assert [(r.verb, r.status_code) for r in local.requests if r.resource == "configmaps"] == [
        ("create", 409),
        ("patch", 200),
    ]
    assert owner_uids(local, name) == uids | {third.trainjob["metadata"]["uid"]}


def test_joining_a_shared_configmap_applies_a_conflicting_owner_patch_again(local, cluster):
    """The tasks of an experiment are submitted in parallel: their owner patches of the code's ConfigMap meet,
    and the API server answers 409 Conflict after a few tries of its own."""
    code = shared_code("conflict")
    first = submit(cluster, plan("conflict1", code=code))
    local.clear_requests()
    local.inject_fault(verb="patch", resource="configmaps", status=409, reason="Conflict", times=2)
    second = submit(cluster, plan("conflict2", code=code))
    patches = [r.status_code for r in local.requests if r.resource == "configmaps" and r.verb == "patch"]
    assert patches == [409, 409, 200]
    name = plan(code=code).configmaps[0]["metadata"]["name"]
    assert owner_uids(local, name) == {first.trainjob["metadata"]["uid"], second.trainjob["metadata"]["uid"]}


def test_a_configmap_of_the_shared_name_holding_other_code_is_refused(local, cluster):
    sub = plan("impostor", code=shared_code("impostor"))
    impostor = {**sub.configmaps[0], "metadata": {**sub.configmaps[0]["metadata"], "annotations": {}}}
    cluster.create(impostor)
    with pytest.raises(SubmissionError) as err:
        submit(cluster, sub)
    assert "exists with other content" in str(err.value) and "kubectl delete configmap" in str(err.value)
    assert sub.name not in snapshot(local)["trainjobs"]  # rolled back
    [kept] = [
        c for c in local.objects("configmaps", "default") if c["metadata"]["name"] == impostor["metadata"]["name"]
    ]
    assert not kept["metadata"].get("ownerReferences")  # left as it was: the refused TrainJob is not its owner


@pytest.mark.parametrize("kind", ["ClusterTrainingRuntime", "TrainingRuntime"])
def test_a_known_runtime_deleted_since_is_created_again(local, cluster, kind):
    known: set = set()
    settings = dict(experiment=f"gone-{kind.lower()}", pod_labels={"variant": "deleted-runtime"}, runtime_kind=kind)
    first = plan("gone1", **settings)
    submit(cluster, first, known_runtimes=known)
    runtime, namespace = first.runtime["metadata"]["name"], first.runtime["metadata"].get("namespace")
    cluster.delete(kind, runtime, namespace)  # say, by `nemo-kubeflow gc`
    local.clear_requests()
    result = submit(cluster, plan("gone2", **settings), known_runtimes=known)
    # The webhook refuses the TrainJob (runtime missing); the runtime is created and the TrainJob sent again.
    resource = kind.lower() + "s"
    assert [(r.verb, r.resource, r.status_code) for r in local.requests if r.verb not in ("get", "list")][:3] == [
        ("create", "trainjobs", 403),
        ("create", resource, 201),
        ("create", "trainjobs", 201),
    ]
    assert ("create", kind, runtime) in result.actions
    assert runtime in snapshot(local)[resource]


def test_rollback_forgets_a_runtime_it_deleted(local, cluster):
    known: set = set()
    sub = plan("forget1", experiment="forget", pod_labels={"variant": "rolled-back-runtime"})
    local.inject_fault(verb="create", resource="configmaps", status=403, message="injected: forbidden", times=1)
    with pytest.raises(SubmissionError):
        submit(cluster, sub, known_runtimes=known)
    assert known == set() and sub.runtime["metadata"]["name"] not in snapshot(local)["clustertrainingruntimes"]


STEPS = [
    ("create", "persistentvolumeclaims", "PVC create"),
    ("create", "clustertrainingruntimes", "runtime create"),
    ("create", "trainjobs", "TrainJob create"),
    ("create", "configmaps", "ConfigMap create"),
    ("create", "secrets", "Secret create"),
    ("patch", "trainjobs", "resume patch"),
]
FAULTS = {
    "403": dict(status=403, message="injected: forbidden"),
    "409": dict(status=409, message="injected: already exists"),
    "422": dict(status=422, message="injected: invalid"),
    "500": dict(status=500),
    "503": dict(status=503),
    "429 + Retry-After": dict(status=429, retry_after=0),
    "timeout": dict(delay=1.0),  # the server applies it after the client gave up
    "dropped connection": dict(drop_connection=True),
}
# What a user gets. "submitted" = the job was created and resumed; anything else raised an error.
EXPECTED = {
    "403": "error",
    "422": "error",
    "500": "submitted",
    "503": "submitted",
    "429 + Retry-After": "submitted",
    "timeout": "submitted",
    "dropped connection": "submitted",
}
FAULT_MATRIX_DOC = Path(__file__).resolve().parent.parent / "docs" / "fault-matrix.md"


def plan_with_everything(task):
    from nemo_kubeflow import PVCMount

    return plan(
        task,
        experiment=f"faults-{task}",
        secret_env_vars={"TOKEN": "env:FAULT_TOKEN"},
        pvc_mounts=[PVCMount(claim_name=f"claim-{task}", mount_path="/d", create=True, size="1Gi")],
    )


def settled_count(local, match, at_least: float) -> int:
    """Requests matching ``match``, once the log stops growing: the server logs a request
    after answering it, and a delayed request lands after the client has given up on it."""
    time.sleep(at_least)
    count = -1
    while True:
        current = sum(1 for r in list(local.requests) if match(r))
        if current == count:
            return count
        count = current
        time.sleep(0.1)


def run_fault(local, kubeconfig, step, fault_name) -> tuple[str, int, int]:
    """(outcome, requests to the faulty step, objects leaked) for one injected fault."""
    verb, resource, _ = step
    cluster = KubernetesCluster(kubeconfig=kubeconfig, backoff=0.01, max_backoff=0.05, request_timeout=0.5)
    before = snapshot(local)
    local.clear_requests()
    local.inject_fault(verb=verb, resource=resource, **FAULTS[fault_name])
    task = f"m-{resource[:8]}-{verb}-{fault_name.split()[0]}".lower()
    try:
        submit(cluster, plan_with_everything(task), runtime_wait=0.5)
        outcome = "submitted"
    except SubmissionError as e:
        outcome = f"error: {type(e.__cause__).__name__}"
    attempts = settled_count(
        local, lambda r: r.verb == verb and r.resource == resource, at_least=FAULTS[fault_name].get("delay", 0) + 0.3
    )
    after = snapshot(local)
    if outcome == "submitted":  # clean up the job itself; its owned objects go with it
        name = plan_with_everything(task).name
        cluster.delete("TrainJob", name, "default")
        local.wait_for(lambda: snapshot(local)["configmaps"] == before["configmaps"], timeout=10)
        for kind, res in (
            ("ClusterTrainingRuntime", "clustertrainingruntimes"),
            ("PersistentVolumeClaim", "persistentvolumeclaims"),
        ):
            for obj in set(snapshot(local)[res]) - set(before[res]):
                cluster.delete(kind, obj, None if res == "clustertrainingruntimes" else "default")
        leaked = 0
    else:
        leaked = sum(len(set(after[r]) - set(before[r])) for r in RESOURCES)
    return outcome, attempts, leaked


def render_matrix(cells) -> str:
    names = list(FAULTS)
    lines = [
        "# Faults during submission",
        "",
        "Generated by `test/test_submit.py::test_fault_matrix` (regenerate with",
        "`NEMO_KUBEFLOW_UPDATE_DOCS=1 python -m pytest test/test_submit.py -k fault_matrix`).",
        "Each cell: one fault injected by the local cluster at that step of a submission that ships",
        "code, a Secret and a PVC to create; the outcome, and how many requests that step took.",
        "Transient faults are retried with bounded backoff; permanent ones surface with the server's",
        "reason, and whatever the submission had created is removed.",
        "",
        "| step | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for step in STEPS:
        row = []
        for fault in names:
            outcome, attempts, leaked = cells[(step[2], fault)]
            text = "submitted" if outcome == "submitted" else outcome.replace("error: ", "")
            row.append(f"{text} ({attempts} req)")
        lines.append(f"| {step[2]} | " + " | ".join(row) + " |")
    total = len(cells)
    leaked = sum(c[2] for c in cells.values())
    lines += ["", f"Faults injected: {total}. Objects leaked: {leaked}.", ""]
    return "\n".join(lines)


def test_fault_matrix(local, cluster, monkeypatch):
    monkeypatch.setenv("FAULT_TOKEN", "canary-5f2a")
    kubeconfig = str(local.kubeconfig_path)
    cells = {(step[2], fault): run_fault(local, kubeconfig, step, fault) for step in STEPS for fault in FAULTS}
    table = render_matrix(cells)
    problems = [
        f"{step} x {fault}: {cell}"
        for (step, fault), cell in cells.items()
        if cell[2] != 0 or (fault in EXPECTED and (cell[0] == "submitted") != (EXPECTED[fault] == "submitted"))
    ]
    assert not problems, "\n".join(problems) + "\n\n" + table
    if os.environ.get("NEMO_KUBEFLOW_UPDATE_DOCS"):
        FAULT_MATRIX_DOC.write_text(table)
    assert FAULT_MATRIX_DOC.read_text() == table, "fault matrix changed; regenerate docs/fault-matrix.md"


def test_permanent_fault_message_carries_the_reason_not_secrets(local, cluster, monkeypatch):
    monkeypatch.setenv("FAULT_TOKEN", "canary-5f2a")
    local.inject_fault(verb="create", resource="secrets", status=422, message="injected failure")
    with pytest.raises(SubmissionError) as err:
        submit(cluster, plan_with_everything("reason"))
    assert "injected failure" in str(err.value) and "nothing was left" in str(err.value)
    assert "canary-5f2a" not in str(err.value)


def test_existing_trainjob_is_never_touched(local, cluster):
    first = submit(cluster, plan("dup", experiment="again"))
    uid, name = first.trainjob["metadata"]["uid"], first.trainjob["metadata"]["name"]
    # Trainer (emulated) snapshots the runtime of a TrainJob it first sees, a write of its own that may come after
    # `before` on a loaded machine: wait for it, so the snapshots differ only by what the second submission does.
    local.wait_for(lambda: f"{name}-runtime-snapshot" in snapshot(local)["configmaps"], timeout=60)
    before = snapshot(local)
    with pytest.raises(SubmissionError) as err:
        submit(cluster, plan("dup", experiment="again"))
    assert isinstance(err.value.__cause__, AlreadyExistsError)
    assert "already exists" in str(err.value) and "left untouched" in str(err.value)
    [job] = [j for j in local.objects("trainjobs", "default") if j["metadata"]["name"] == name]
    assert job["metadata"]["uid"] == uid
    assert snapshot(local) == before


def test_rbac_denial_says_what_to_ask_for(local, cluster):
    local.deny("create", "clustertrainingruntimes")
    before = snapshot(local)
    with pytest.raises(SubmissionError) as err:
        submit(cluster, plan("rbac", experiment="rbac"))
    assert isinstance(err.value.__cause__, PermissionDeniedError)
    assert "runtime_kind='TrainingRuntime'" in str(err.value) and "forbidden" in str(err.value)
    assert snapshot(local) == before


def test_missing_namespace(local, cluster):
    with pytest.raises(SubmissionError, match="create the namespace"):
        submit(cluster, plan("ns", namespace="does-not-exist", runtime_kind="TrainingRuntime"))


def test_missing_existing_runtime_lists_the_available_ones(local, cluster):
    with pytest.raises(NotFoundError, match="runtime_name='torch-distributd'.*available") as err:
        submit(cluster, plan("rt", runtime_name="torch-distributd"))
    assert writes(local) == []
    assert "fix runtime_name" in str(err.value)


def test_unreachable_server(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    cluster = KubernetesCluster(kubeconfig=str(kubeconfig), backoff=0.01, max_attempts=2, request_timeout=2)
    with pytest.raises(SubmissionError) as err:
        submit(cluster, plan("unreach"))
    assert isinstance(err.value.__cause__, ClusterUnreachableError)
    assert "127.0.0.1:9" in str(err.value) and "did not answer" in str(err.value)


def test_missing_kubeconfig_and_context(tmp_path, local):
    with pytest.raises(KubeconfigError, match="does not exist"):
        KubernetesCluster(kubeconfig=str(tmp_path / "nope")).get("ConfigMap", "x", "default")
    with pytest.raises(KubeconfigError, match="context 'nope'"):
        KubernetesCluster(kubeconfig=str(local.kubeconfig_path), context="nope").get("ConfigMap", "x", "default")


def test_missing_secret_source_fails_before_any_request(local, cluster, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(Exception, match=r"reads \$NOT_SET_ANYWHERE, which is not set"):
        submit(cluster, plan("sec", secret_env_vars={"TOKEN": "env:NOT_SET_ANYWHERE"}))
    assert local.requests == []


def test_webhook_denial_is_not_reported_as_rbac(local, cluster):
    from nemo_kubeflow.errors import AdmissionDeniedError

    local.inject_fault(
        verb="create",
        resource="trainjobs",
        status=403,
        message='admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: bad',
    )
    with pytest.raises(SubmissionError) as err:
        submit(cluster, plan("webhook", experiment="webhook"))
    assert isinstance(err.value.__cause__, AdmissionDeniedError)
    assert "admission webhook refused the object" in str(err.value) and "RBAC" not in str(err.value)


def test_resources_creation_failure_is_surfaced_in_status(local, cluster):
    """Trainer leaves only a Warning event when it cannot build the JobSet; status shows it."""
    from torchx.specs import AppState

    from nemo_kubeflow.nemo_run.scheduler import KubeflowTrainerScheduler

    sub = plan("blocked", experiment="blocked")
    # A ConfigMap with the snapshot's name that the TrainJob does not own blocks Trainer.
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{sub.name}-runtime-snapshot", "namespace": "default"},
            "data": {},
        }
    )
    submit(cluster, sub)
    scheduler = KubeflowTrainerScheduler("t", cluster=cluster)
    desc = local.wait_for(
        lambda: (d := scheduler.describe(f"default:{sub.name}")) and "TrainJobResources" in d.msg and d, timeout=15
    )
    assert desc.state == AppState.PENDING
    assert desc.msg.startswith("TrainJobResourcesCreationFailed: TrainJob resources reconciliation failed")


def test_failed_rollback_names_what_is_left_and_how_to_delete_it(local, cluster):
    sub = plan("left", experiment="rollback-fails", pod_labels={"variant": "rollback-fails"})
    runtime = sub.runtime["metadata"]["name"]
    local.inject_fault(verb="create", resource="configmaps", status=422, message="injected: invalid", times=1)
    local.inject_fault(verb="delete", resource="trainjobs", status=403, message="injected: cannot delete", times=1)
    local.inject_fault(verb="delete", resource="clustertrainingruntimes", status=403, times=1)
    with pytest.raises(SubmissionError) as err:
        submit(cluster, sub)
    message = str(err.value)
    assert "nothing was left" not in message
    assert message.startswith(f"submitting TrainJob {sub.name!r} failed: cannot create ConfigMap")
    assert "injected: invalid" in message  # the first error, still the one reported
    assert message.endswith(
        f"so this is left on the cluster: TrainJob {sub.name!r} in namespace 'default' (Forbidden), delete it with"
        f" `kubectl delete trainjobs.trainer.kubeflow.org {sub.name} -n default`; ClusterTrainingRuntime"
        f" {runtime!r} (Forbidden), delete it with `kubectl delete clustertrainingruntimes.trainer.kubeflow.org"
        f" {runtime}`"
    )
    # What it names is really there.
    assert sub.name in snapshot(local)["trainjobs"] and runtime in snapshot(local)["clustertrainingruntimes"]
    cluster.delete("TrainJob", sub.name, "default")
    cluster.delete("ClusterTrainingRuntime", runtime)


def test_an_existing_runtime_whose_jobs_leave_no_room_for_the_name_is_refused_before_writing(local, cluster):
    import copy

    from nemo_kubeflow.errors import ManifestValidationError

    base = plan("base", experiment="existing-runtime")
    runtime = copy.deepcopy(base.runtime)
    runtime["metadata"] = {"name": "warmup-runtime", "labels": runtime["metadata"].get("labels", {})}
    [node] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    warmup = copy.deepcopy(node)
    warmup["name"] = "warm-up-the-dataset-cache"
    warmup["template"]["metadata"]["labels"] = {}
    runtime["spec"]["template"]["spec"]["replicatedJobs"] = [warmup, node]
    cluster.create(runtime)
    local.clear_requests()
    # Planned offline for a `node` job only (the runtime is not read then): the full 48 characters.
    sub = plan("pretrain", experiment="llama3-8b-pretrain-h100_1732406400123456789", runtime_name="warmup-runtime")
    assert len(sub.name) == 48
    with pytest.raises(ManifestValidationError) as err:
        submit(cluster, sub)
    assert writes(local) == []
    message = str(err.value)
    assert f"TrainJob {sub.name!r} is invalid" in message
    assert "replicated job 'warm-up-the-dataset-cache' would be named up to 84 characters" in message
    assert "runtime_name='warmup-runtime'" in message and "at most 27 characters" in message
    cluster.delete("ClusterTrainingRuntime", "warmup-runtime")


def test_an_experiment_with_a_long_title_gets_pod_names_jobset_accepts(local):
    import nemo_run as run
    from torchx.specs import AppState, parse_app_handle

    executor = KubeflowExecutor(
        container_image="python:3.11", nodes=2, nprocs_per_node=1, shm_size=None, kubeconfig=str(local.kubeconfig_path)
    )
    title = "llama3-8b-pretrain-h100"
    with run.Experiment(title, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo rank $PET_NODE_RANK"), name="pretrain")
        exp.run(sequential=True)
        job = exp.jobs[0]
    assert exp._id.startswith(f"{title}_") and len(exp._id) == len(title) + 20  # NeMo-Run's id: time_ns()
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED
    name = parse_app_handle(job.handle)[2].split(":", 1)[1]
    # `<id>-pretrain-<hash>` would be 59 characters: shortened to the 48 that two `node` pods allow.
    assert len(name) == 48 and name.startswith("llama3-8b-pretrain-h100-")
    pods = [
        p["metadata"]["name"]
        for p in local.objects("pods", "default")
        if p["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/jobset-name") == name
    ]
    assert sorted(p.rsplit("-", 1)[0] for p in pods) == [f"{name}-node-0-0", f"{name}-node-0-1"]
    assert max(len(p) for p in pods) == 63
