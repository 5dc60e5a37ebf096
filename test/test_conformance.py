"""The local cluster against the real Trainer v2.3.0 + JobSet v0.12.0 + kube-controller-manager.

test/data/real-trainer/ holds what the real controllers and API server built from six executor
configurations (scenarios a-f; its README lists them): the JobSet, the Jobs, one pod per Job, the
headless Service and the TrainJob status trace. Each test submits the same configuration to the
local cluster through `run.Experiment` + `KubeflowExecutor` (detach), as the recording did, and
compares the objects field by field after normalising names, uids and hashes. What the local
cluster does differently on purpose is listed once, in `INTENTIONAL_DIFFERENCES` (mirrored in
docs/local-cluster.md); anything else that differs fails the test.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Callable

import nemo_run as run
import pytest
import workloads
import yaml
from polling import wait_for
from torchx.specs import parse_app_handle

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor, PVCMount
from nemo_kubeflow.build.command import RANK_PREFIX_EXPORT
from nemo_kubeflow.parts import initializers as inits
from nemo_kubeflow_local import LocalCluster

DATA = Path(__file__).parent / "data" / "real-trainer"
UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SHA1 = re.compile(r"\b[0-9a-f]{40}\b")
#: The content hash the packager appends to each ConfigMap key (`train_configs_train_config.yaml.<hash>`).
KEY_HASH = re.compile(r"(?<=[\w.])\.[0-9a-f]{8,64}(?=\")")
#: Metadata the recording kept (the rest is per-run bookkeeping: resourceVersion, timestamps, ...).
KEPT_METADATA = ("name", "generateName", "namespace", "labels", "annotations", "ownerReferences", "finalizers", "uid")


# --- the differences the local cluster keeps on purpose ------------------------------------------------------


def _containers(kind: str, obj: dict) -> list[dict]:
    """Every container of a JobSet (all replicated jobs), a Job (its template) or a pod."""
    if kind == "JobSet":
        specs = [r["template"]["spec"]["template"]["spec"] for r in obj["spec"]["replicatedJobs"]]
    elif kind == "Job":
        specs = [obj["spec"]["template"]["spec"]]
    elif kind == "Pod":
        specs = [obj["spec"]]
    else:
        specs = []
    return [c for spec in specs for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])]


def _mask_env(name: str) -> Callable[[str, str, dict], None]:
    def mask(side: str, kind: str, obj: dict) -> None:
        for container in _containers(kind, obj):
            for env in container.get("env") or []:
                if env["name"] == name and "value" in env:
                    env["value"] = "<differs>"

    return mask


def _mask_master_port(side: str, kind: str, obj: dict) -> None:
    for container in _containers(kind, obj):
        port = next((e["value"] for e in container.get("env") or [] if e["name"] == "PET_MASTER_PORT"), None)
        for entry in container.get("ports") or []:
            if port is not None and str(entry.get("containerPort")) in (port, "<differs>"):
                entry["containerPort"] = "<differs>"
        for env in container.get("env") or []:
            if env["name"] == "PET_MASTER_PORT":
                env["value"] = "<differs>"


def _drop_node_name(side: str, kind: str, obj: dict) -> None:
    if kind == "Pod":
        obj["spec"].pop("nodeName", None)


def _drop_service_account_volume(side: str, kind: str, obj: dict) -> None:
    if kind != "Pod":
        return
    obj["spec"]["volumes"] = [
        v for v in obj["spec"].get("volumes") or [] if not v["name"].startswith("kube-api-access-")
    ]
    for container in _containers(kind, obj):
        container["volumeMounts"] = [
            m for m in container.get("volumeMounts") or [] if not m["name"].startswith("kube-api-access-")
        ]
        if not container["volumeMounts"]:
            del container["volumeMounts"]


def _drop_initializer_command(side: str, kind: str, obj: dict) -> None:
    for container in _containers(kind, obj):
        if container["name"] in ("dataset-initializer", "model-initializer"):
            container.pop("command", None)


def _drop_tracking_finalizer(side: str, kind: str, obj: dict) -> None:
    if kind == "Pod":
        obj["metadata"].pop("finalizers", None)


#: id -> (what differs and why, how both sides are brought to one form). Mirrored in
#: docs/local-cluster.md ("Compared with the recorded real controllers").
INTENTIONAL_DIFFERENCES: dict[str, tuple[str, Callable[[str, str, dict], None]]] = {
    "master-addr": (
        "PET_MASTER_ADDR is 127.0.0.1 (pods share the host network), not the rank-0 pod's DNS name "
        "`<trainjob>-node-0-0.<trainjob>`",
        _mask_env("PET_MASTER_ADDR"),
    ),
    "master-port": (
        "PET_MASTER_PORT and the `node` containerPort are a free port per TrainJob, not 29500",
        _mask_master_port,
    ),
    "node-name": (
        "pods get `spec.nodeName: nemo-kubeflow-local` at once (the recording had no scheduler, so its "
        "pods stayed unbound)",
        _drop_node_name,
    ),
    "service-account-token": (
        "no `kube-api-access-<rand>` projected volume and mount (service account token, "
        "kube-root-ca.crt, namespace; the recording's API server also added "
        "`openshift-service-ca.crt`)",
        _drop_service_account_volume,
    ),
    "finished-pod": (
        "a pod that already finished here (the recording's pods stayed Pending) has no "
        "`batch.kubernetes.io/job-tracking` finalizer: the Job controller removes it from finished pods, "
        "as for real",
        _drop_tracking_finalizer,
    ),
    "initializer-command": (
        "scenario e only, a setting of this test: the initializer containers get a `command` "
        "(`true`), since the local cluster runs the host's programs and the initializer images' "
        "entrypoints do not exist here",
        _drop_initializer_command,
    ),
}


# --- normalising -------------------------------------------------------------------------------------------


def normalise(obj: dict, trainjob: str, namespace: str) -> dict:
    """What the recording did: names, uids, hashes and random suffixes replaced, status and
    per-run metadata dropped."""
    obj = copy.deepcopy(obj)
    obj.pop("status", None)
    if obj.get("kind") != "JobSet":  # typed objects were recorded from lists, without kind and apiVersion
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
    meta = obj["metadata"]
    obj["metadata"] = {k: meta[k] for k in KEPT_METADATA if meta.get(k) not in (None, {}, [])}
    if meta.get("generateName"):
        obj["metadata"]["name"] = meta["generateName"] + "<rand>"
    text = json.dumps(obj)
    text = UID.sub("<uid>", text)
    text = SHA1.sub("<sha1>", text)
    text = KEY_HASH.sub(".<hash>", text)
    text = text.replace(f'"{namespace}"', '"<namespace>"')
    # The recordings predate the line that sets torchrun's log prefix to the global rank; the controllers
    # copy the container's args as they are, so leaving it out hides nothing they did.
    text = text.replace(json.dumps(RANK_PREFIX_EXPORT + "\n")[1:-1], "")
    text = re.sub(rf"\b{re.escape(trainjob)}\b", "<trainjob>", text)
    return json.loads(text)


def differences(local: object, real: object, path: str = "") -> list[str]:
    if isinstance(local, dict) and isinstance(real, dict):
        return [
            d
            for key in sorted(set(local) | set(real), key=str)
            for d in (
                differences(local.get(key, "<absent>"), real.get(key, "<absent>"), f"{path}.{key}")
                if key in local and key in real
                else [
                    f"{path}.{key}: local {json.dumps(local.get(key, '<absent>'))[:200]} "
                    f"real {json.dumps(real.get(key, '<absent>'))[:200]}"
                ]
            )
        ]
    if isinstance(local, list) and isinstance(real, list) and len(local) == len(real):
        return [d for i, (a, b) in enumerate(zip(local, real)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(local, str) and isinstance(real, str) and local != real:
        start = next((i for i, (a, b) in enumerate(zip(local, real)) if a != b), min(len(local), len(real)))
        return [
            f"{path}: from character {start}: local {json.dumps(local[start : start + 200])} "
            f"real {json.dumps(real[start : start + 200])}"
        ]
    if local != real:
        return [f"{path}: local {json.dumps(local)[:300]} real {json.dumps(real)[:300]}"]
    return []


def compare(kind: str, local: dict, real: dict, differences_to_apply: list[str]) -> list[str]:
    local, real = copy.deepcopy(local), copy.deepcopy(real)
    for key in differences_to_apply:
        INTENTIONAL_DIFFERENCES[key][1]("local", kind, local)
        INTENTIONAL_DIFFERENCES[key][1]("real", kind, real)
    return [f"{kind} {real['metadata']['name']}{d}" for d in differences(local, real)]


# --- the recorded facts ----------------------------------------------------------------------------------


def recorded(scenario: str) -> dict:
    docs = list(yaml.safe_load_all((DATA / f"scenario-{scenario}.yaml").read_text()))
    facts = next(d for d in docs if d.get("kind") == "RecordedFacts")
    jobset = next(d for d in docs if d.get("kind") == "JobSet")
    rest = [d for d in docs if d.get("kind") not in ("RecordedFacts", "JobSet")]
    service = next(d for d in rest if d["spec"].get("clusterIP") == "None")
    pods = {d["metadata"]["name"]: d for d in rest if "generateName" in d["metadata"]}
    jobs = {d["metadata"]["name"]: d for d in rest if "completionMode" in d["spec"]}
    return {"trace": facts["statusTrace"], "jobset": jobset, "service": service, "jobs": jobs, "pods": pods}


# --- the scenarios, as the recording submitted them --------------------------------------------------------


def _greet():
    return run.Partial(workloads.greet, name="conformance")


def scenario_executor(scenario: str, cluster: LocalCluster, namespace: str, tmp_path: Path) -> tuple:
    """(executor, task, task name, experiment title) of each recorded configuration."""
    # The recordings predate the failure classes (fail_fast_exit_codes renders a FailJob rule and a JobSet
    # rule): [] (with OOM kills restarting too) renders the runtime the real controllers were given, but for
    # the podFailurePolicy every runtime has since (`without_pod_failure_policy`).
    base = dict(
        container_image="nvcr.io/nvidia/nemo:25.02",
        namespace=namespace,
        kubeconfig=str(cluster.kubeconfig_path),
        fail_fast_exit_codes=[],
        restart_on_oom_kill=True,
    )
    if scenario == "a":
        return (
            KubeflowExecutor(
                **base,
                nodes=2,
                nprocs_per_node=8,
                gpus_per_node=8,
                launcher="torchrun",
                pvc_mounts=[PVCMount(claim_name="rc-ckpt", mount_path="/ckpt", create=True, size="1Gi")],
                secret_env_vars={"RC_SECRET_TOKEN": "env:RC_CONFORMANCE_TOKEN"},
                pod_labels={"realcheck/scenario": "a", "team": "rc"},
            ),
            _greet(),
            "train",
            "rc-a",
        )
    if scenario == "b":
        (tmp_path / "task_b.py").write_text("raise SystemExit(1)\n")
        return (
            KubeflowExecutor(
                **base,
                nodes=1,
                nprocs_per_node=2,
                cpu_request="1",
                memory_request="1Gi",
                packager=ConfigMapPackager(relative_path=str(tmp_path), include_pattern="task_b.py"),
            ),
            run.Script(path="/nemo_run/code/task_b.py", entrypoint="python"),
            "train",
            "rc-b",
        )
    if scenario == "c":
        return (
            KubeflowExecutor(
                **base,
                nodes=2,
                nprocs_per_node=8,
                gpus_per_node=8,
                launcher="torchrun",
                network_fabric="gke-tcpxo",
                node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"},
                tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            ),
            _greet(),
            "train",
            "rc-c",
        )
    if scenario == "d":
        return (
            KubeflowExecutor(
                **base,
                nodes=2,
                nprocs_per_node=2,
                launcher="torchrun",
                preflight=True,
                pvc_mounts=[PVCMount(claim_name="rc-scratch", mount_path="/scratch", create=True, size="1Gi")],
            ),
            _greet(),
            "train",
            "rc-d",
        )
    if scenario == "e":
        from kubeflow.trainer import HuggingFaceDatasetInitializer, HuggingFaceModelInitializer, Initializer

        initializer = Initializer(
            dataset=HuggingFaceDatasetInitializer(storage_uri="hf://tatsu-lab/alpaca"),
            model=HuggingFaceModelInitializer(storage_uri="hf://meta-llama/Llama-3.2-1B-Instruct"),
        )
        settings = inits.InitializerSettings(
            claim_name="rc-init-cache",
            create_claim=True,
            claim_size="1Gi",
            dataset_command=["true"],
            model_command=["true"],
        )
        return (
            KubeflowExecutor(
                **base, nodes=1, nprocs_per_node=1, initializer=initializer, initializer_settings=settings
            ),
            _greet(),
            "t",
            "e",
        )
    if scenario == "f":
        return (
            KubeflowExecutor(**base, nodes=2, nprocs_per_node=1, launcher="torchrun", runtime_kind="TrainingRuntime"),
            _greet(),
            "train",
            "rc-f",
        )
    raise KeyError(scenario)


#: Which intentional differences each scenario shows.
SCENARIO_DIFFERENCES = {
    "a": ["master-addr", "master-port", "service-account-token"],
    "b": ["master-addr", "master-port", "node-name", "service-account-token"],
    "c": ["master-addr", "master-port", "service-account-token"],
    "d": ["master-addr", "master-port", "node-name", "service-account-token"],
    "e": ["master-addr", "master-port", "node-name", "service-account-token", "initializer-command"],
    "f": ["master-addr", "master-port", "node-name", "service-account-token"],
}


def submit(scenario: str, cluster: LocalCluster, tmp_path: Path) -> tuple[str, str]:
    """Run the scenario's experiment detached; (namespace, TrainJob name)."""
    namespace = f"rc-{scenario}-ns"
    cluster.create_namespace(namespace)
    executor, task, task_name, title = scenario_executor(scenario, cluster, namespace, tmp_path)
    with run.Experiment(title, executor=executor, log_level="WARN") as exp:
        exp.add(task, name=task_name)
        exp.run(detach=True)
    [trainjob] = cluster.objects("trainjobs", namespace)
    return namespace, trainjob["metadata"]["name"]


def local_objects(cluster: LocalCluster, namespace: str, expected_pods: int) -> dict:
    """The JobSet, Service, Jobs and one pod per Job (completion index 0, first attempt)."""

    def pods():
        found = {}
        for pod in cluster.objects("pods", namespace):
            labels = pod["metadata"]["labels"]
            if labels.get("batch.kubernetes.io/job-completion-index") == "0":
                found[labels["batch.kubernetes.io/job-name"]] = pod
        return found if len(found) == expected_pods else None

    found = wait_for(pods, f"the first pod of each of the {expected_pods} Jobs", interval=0.1)
    [jobset] = cluster.objects("jobsets", namespace)
    [service] = cluster.objects("services", namespace)
    jobs = {job["metadata"]["name"]: job for job in cluster.objects("jobs", namespace)}
    return {"jobset": jobset, "service": service, "jobs": jobs, "pods": found}


def without_loglevel(obj: Any) -> Any:
    """``obj`` without containers' LOGLEVEL env entries: NeMo-Run set INFO in some tasks when the recordings
    were made, our pods default to WARNING since (build/plan.py DEFAULT_LOGLEVEL); the only change of the
    input the real controllers saw, and no controller reads it."""
    if isinstance(obj, dict):
        return {
            k: (
                [e for e in v if not (isinstance(e, dict) and e.get("name") == "LOGLEVEL")]
                if k == "env"
                else without_loglevel(v)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [without_loglevel(v) for v in obj]
    return obj


def without_pod_failure_policy(obj: dict) -> dict:
    """A JobSet or Job without the ``node`` Job's podFailurePolicy, which the runtime gained after the
    recordings (a DisruptionTarget Count rule and a FailJob rule on every other exit code, so that each
    failure's exit code stays in the Job controller's event). The real controllers copy it as given:
    statuses.yaml's runs used it, and their Job's Failed condition is the FailJob rule's."""
    obj = copy.deepcopy(obj)
    specs = (
        [r["template"]["spec"] for r in obj["spec"]["replicatedJobs"]]
        if "replicatedJobs" in obj["spec"]
        else [obj["spec"]]
    )
    for spec in specs:
        spec.pop("podFailurePolicy", None)
    return obj


def conformance_differences(scenario: str, cluster: LocalCluster, tmp_path: Path) -> tuple[list[str], str, str]:
    real = without_loglevel(recorded(scenario))
    namespace, name = submit(scenario, cluster, tmp_path)
    local = local_objects(cluster, namespace, len(real["pods"]))
    found: list[str] = []
    keys = SCENARIO_DIFFERENCES[scenario]
    norm = lambda obj: normalise(without_loglevel(obj), name, namespace)  # noqa: E731
    found += compare("JobSet", norm(without_pod_failure_policy(local["jobset"])), real["jobset"], keys)
    found += compare("Service", norm(local["service"]), real["service"], keys)
    local_jobs = {norm(j)["metadata"]["name"]: norm(without_pod_failure_policy(j)) for j in local["jobs"].values()}
    assert sorted(local_jobs) == sorted(real["jobs"])
    for job_name, job in real["jobs"].items():
        found += compare("Job", local_jobs[job_name], job, keys)
    local_pods = {norm(p)["metadata"]["name"]: p for p in local["pods"].values()}
    assert sorted(local_pods) == sorted(real["pods"])
    for pod_name, pod in real["pods"].items():
        finished = (local_pods[pod_name].get("status") or {}).get("phase") in ("Succeeded", "Failed")
        found += compare("Pod", norm(local_pods[pod_name]), pod, keys + ["finished-pod"] * finished)
    return found, namespace, name


def _cancel(cluster: LocalCluster, namespace: str, name: str) -> None:
    from kubernetes import client

    client.CustomObjectsApi(cluster.api_client()).delete_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name
    )
    wait_for(lambda: not cluster.objects("pods", namespace), "the pods to be deleted", timeout=30, interval=0.1)


def trainjob_status(cluster: LocalCluster, namespace: str, name: str) -> dict:
    """The TrainJob's status as the recording's trace shows it (no timestamps, names normalised)."""
    [trainjob] = [t for t in cluster.objects("trainjobs", namespace) if t["metadata"]["name"] == name]
    status = copy.deepcopy(trainjob.get("status") or {})
    for condition in status.get("conditions") or []:
        condition.pop("lastTransitionTime", None)
    return json.loads(json.dumps(status).replace(name, "<trainjob>"))


#: The trace step each scenario reaches on the local cluster and is compared with: GPU pods stay
#: Pending here (no GPUs), scenario b's pod fails; the others run code this test does not ship.
TRACE_STEP = {"a": "pods pending", "b": "exit code / initializers done", "c": "pods pending"}


@pytest.mark.parametrize("scenario", ["a", "b", "c", "d", "e", "f"])
def test_jobset_jobs_service_and_pods_match_the_real_controllers(scenario, cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("RC_CONFORMANCE_TOKEN", "not-a-real-token")
    found, namespace, name = conformance_differences(scenario, cluster, tmp_path)
    try:
        assert not found, "\n".join(found)
        if scenario in TRACE_STEP:
            [step] = [s for s in recorded(scenario)["trace"] if s["step"] == TRACE_STEP[scenario]]
            try:
                wait_for(
                    lambda: trainjob_status(cluster, namespace, name) == step["trainjob_status"],
                    f"the TrainJob status of step {step['step']!r}",
                    timeout=90,
                    interval=0.1,
                )
            except AssertionError:  # show what differs
                assert trainjob_status(cluster, namespace, name) == step["trainjob_status"]
    finally:
        _cancel(cluster, namespace, name)


def test_the_differences_are_listed_in_the_docs():
    """docs/local-cluster.md mirrors INTENTIONAL_DIFFERENCES, one row per id."""
    docs = (Path(__file__).parent.parent / "docs" / "local-cluster.md").read_text()
    section = docs.split("### Compared with the recorded real controllers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \|", section, flags=re.M)
    assert rows == list(INTENTIONAL_DIFFERENCES)
    assert {key for keys in SCENARIO_DIFFERENCES.values() for key in keys} | {"finished-pod"} == set(
        INTENTIONAL_DIFFERENCES
    )


# --- the JobSet's and the Jobs' status, as the real JobSet and Job controllers write them ---------------------

#: test/data/real-trainer/statuses.yaml: what the real control plane (test/controlplane/: Trainer v2.3.0,
#: JobSet v0.12.0, kube-controller-manager v1.36.3, our node agent running the pods) wrote into the JobSet's
#: and the Job's status for these three runs of a 2-node job (`retries`, the task's script), recorded with
#: `status_facts` below; the local cluster must write the same.
STATUS_SCENARIOS = {
    "restarted-then-completed": (
        1,
        'if [ "$PET_NODE_RANK" = 1 ] && [ ! -e {marker} ]; then touch {marker}; '
        'echo failing; exit 3; fi; echo "attempt ok on $PET_NODE_RANK"',
    ),
    "failed": (0, 'if [ "$PET_NODE_RANK" = 1 ]; then exit 3; fi; sleep 2'),
    "running": (0, "sleep 30"),
}
_TIMES = ("lastTransitionTime", "lastProbeTime", "startTime", "completionTime")


def status_facts(jobset: dict, jobs: list[dict], name: str) -> dict:
    """The JobSet's and Jobs' status with times reduced to `<time>` and the TrainJob's name to `<trainjob>`."""

    def times(value):
        if isinstance(value, dict):
            return {k: "<time>" if k in _TIMES and v else times(v) for k, v in value.items()}
        if isinstance(value, list):
            return [times(v) for v in value]
        return value

    facts = {"jobset": jobset.get("status") or {}, "jobs": {j["metadata"]["name"]: j.get("status") or {} for j in jobs}}
    text = json.dumps(times(facts)).replace(f"{jobset['metadata']['namespace']}/", "<namespace>/")
    # A FailJob rule's message names the failed pod, whose name ends in the Job controller's random suffix.
    text = re.sub(r"(?<=\b%s-node-0-)(\d+)-[a-z0-9]{5}\b" % re.escape(name), r"\1-<random>", text)
    return json.loads(text.replace(name, "<trainjob>"))


def _local_status_facts(cluster: LocalCluster, namespace: str, name: str) -> dict:
    [jobset] = [j for j in cluster.objects("jobsets", namespace) if j["metadata"]["name"] == name]
    jobs = [j for j in cluster.objects("jobs", namespace) if j["metadata"]["name"].startswith(name)]
    return status_facts(jobset, jobs, name)


@pytest.mark.parametrize("scenario", list(STATUS_SCENARIOS))
def test_jobset_and_job_status_match_the_real_controllers(scenario, cluster, tmp_path):
    want = yaml.safe_load((DATA / "statuses.yaml").read_text())["scenarios"][scenario]
    retries, script = STATUS_SCENARIOS[scenario]
    namespace = f"status-{scenario}"
    cluster.create_namespace(namespace)
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        namespace=namespace,
        shm_size=None,
        retries=retries,
        kubeconfig=str(cluster.kubeconfig_path),
    )
    with run.Experiment(f"status-{scenario}", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script.format(marker=tmp_path / "failed-once")), name="t")
        exp.run(detach=True)
        name = parse_app_handle(exp.jobs[0].handle)[2].split(":", 1)[1]
    try:
        try:
            wait_for(
                lambda: _local_status_facts(cluster, namespace, name) == want,
                "the recorded statuses",
                timeout=90,
                interval=0.1,
            )
        except AssertionError:  # show what differs
            assert _local_status_facts(cluster, namespace, name) == want
    finally:
        _cancel(cluster, namespace, name)
