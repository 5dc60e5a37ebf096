"""Smoke test on the real upstream control plane (kube-apiserver, Trainer, JobSet, Kueue controllers).

Run with `python -m pytest -q -m real` (see docs/real-control-plane.md). There is no node yet (the
node agent comes later), so pods stay Pending: this checks what the real controllers build from a
TrainJob submitted through NeMo-Run and that cancelling lets the garbage collector remove it all.
"""

import ipaddress
import json
import socket
import subprocess
import sys
import textwrap
import urllib.error
from pathlib import Path

import nemo_run as run
import pytest
from controlplane import versions
from torchx.specs import parse_app_handle

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

pytestmark = pytest.mark.real

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def items(cp, path):
    return cp.request("GET", path)["items"]


def test_components_are_the_pinned_upstream_releases(real_control_plane):
    cp = real_control_plane
    version = cp.request("GET", "/version")
    # The pinned release, or the matrix entry NEMO_KUBEFLOW_KUBERNETES selects (test_controlplane_matrix.py).
    assert version["gitVersion"] == versions.selected_kubernetes()
    groups = {g["name"] for g in cp.request("GET", "/apis")["groups"]}
    assert {"trainer.kubeflow.org", "jobset.x-k8s.io", "kueue.x-k8s.io"} <= groups
    hooks = {
        h["name"]
        for c in items(cp, "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations")
        for h in c["webhooks"]
    }
    assert {"validator.trainjob.trainer.kubeflow.org", "vjobset.kb.io"} <= hooks
    assert all(proc.poll() is None for proc in cp.processes.values())


def test_trainjob_becomes_jobset_jobs_and_pending_pods_then_cancel_collects_them(real_control_plane, real_namespace):
    cp, ns = real_control_plane, real_namespace
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        nprocs_per_node=1,
        namespace=ns,
        kubeconfig=str(cp.kubeconfig_path),
        shm_size=None,
        packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
    )
    with run.Experiment("real-smoke", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo hello; sleep 600"), name="hello")
        exp.run(detach=True)
        handle = exp.jobs[0].handle
    app_id = parse_app_handle(handle)[2]
    name = app_id.split(":", 1)[1]

    trainjob = cp.request("GET", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}")
    uid = trainjob["metadata"]["uid"]

    def jobset():
        found = [
            j
            for j in items(cp, f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets")
            if j["metadata"]["name"] == name
        ]
        return found and found[0]

    js = cp.wait_for(jobset, "the real Trainer to create the JobSet owned by the TrainJob")
    assert [(o["kind"], o["uid"]) for o in js["metadata"]["ownerReferences"]] == [("TrainJob", uid)]

    selector = f"?labelSelector={JOBSET_NAME_LABEL}%3D{name}"

    def jobs():
        return items(cp, f"/apis/batch/v1/namespaces/{ns}/jobs{selector}")

    # Trainer's `node` replicated job: one Job whose parallelism is the number of nodes
    [job] = cp.wait_for(jobs, "the real JobSet controller to create the `node` Job")
    assert job["metadata"]["name"] == f"{name}-node-0"
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 2

    def unschedulable_pods():
        pods = items(cp, f"/api/v1/namespaces/{ns}/pods{selector}")
        conds = [c for p in pods for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return len(pods) == 2 and len(conds) == 2 and all(c["reason"] == "Unschedulable" for c in conds) and pods

    pods = cp.wait_for(unschedulable_pods, "the pods, unschedulable (no node)")
    assert all(p["status"]["phase"] == "Pending" for p in pods)
    assert all(p["metadata"]["labels"]["jobset.sigs.k8s.io/priority"] == "0" for p in pods)

    create_scheduler("t").cancel(app_id)

    def collected():
        left = (
            items(cp, f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets")
            + items(cp, f"/apis/batch/v1/namespaces/{ns}/jobs")
            + items(cp, f"/api/v1/namespaces/{ns}/pods")
            + [c for c in items(cp, f"/api/v1/namespaces/{ns}/configmaps") if c["metadata"]["name"].startswith(name)]
        )
        return not left

    cp.wait_for(collected, "the garbage collector to remove the JobSet, Jobs, pods and ConfigMaps")
    assert items(cp, f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs") == []


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its reaper."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killing_the_test_process_leaves_no_component_running(real_control_plane, tmp_path):
    """A second control plane in a child process; SIGKILL the child (no cleanup code can run):
    every component it started dies with it (PR_SET_PDEATHSIG in each process group)."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import json, sys, time
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from controlplane import RealControlPlane
            with RealControlPlane(json.loads(sys.argv[1]), {str(tmp_path)!r}) as cp:
                print(json.dumps(cp.pids()), flush=True)
                time.sleep(600)
        """),
            json.dumps(real_control_plane.build_info),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = json.loads(child.stdout.readline())
    finally:
        child.kill()
        child.wait()
    assert set(pids) == set(real_control_plane.pids())
    real_control_plane.wait_for(
        lambda: not [pid for pid in pids.values() if _running(pid)],
        "the components of the killed process to die",
        timeout=30,
    )


def test_a_port_taken_before_its_component_binds_it_makes_the_control_plane_start_again(
    real_control_plane, tmp_path, monkeypatch
):
    """The ports are chosen free, then bound by the components a moment later: another process may take one
    meanwhile (CI's did). Here the first choice of etcd's port is a port this test listens on: etcd exits
    with "address already in use", and the control plane starts again on new ports, the first attempt's
    logs kept beside."""
    from controlplane import cluster

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    chosen = []

    def etcd_port_taken_the_first_time(count):
        ports = choose_free(count)
        if not chosen:
            ports[0] = taken.getsockname()[1]  # "etcd" is the first port start() asks for
        chosen.append(ports)
        return ports

    choose_free = cluster.free_ports
    monkeypatch.setattr(cluster, "free_ports", etcd_port_taken_the_first_time)
    try:
        with cluster.RealControlPlane(real_control_plane.build_info, tmp_path) as cp:
            assert cp.request("GET", "/version")["gitVersion"] == versions.selected_kubernetes()
            assert cp.ports["etcd"] != taken.getsockname()[1]
    finally:
        taken.close()
    assert len(chosen) == 2
    assert "address already in use" in (tmp_path / "logs-attempt-1" / "etcd.log").read_text()


VISIBILITY = "visibility.kueue.x-k8s.io"


def test_kueues_visibility_api_is_available_through_the_aggregator_where_the_machine_has_an_address(
    real_control_plane,
):
    """The stage serves Kueue's visibility API (v1beta1 and v1beta2) through kube-apiserver's aggregation layer, at
    an address of this machine that is not loopback (the aggregator of 1.32 reaches it through the Service's
    Endpoints, since 1.33 through its EndpointSlices); on a machine with none, discovery does not list the group."""
    cp = real_control_plane
    groups = {g["name"] for g in cp.request("GET", "/apis")["groups"]}
    if cp.kueue_visibility is None:
        assert VISIBILITY not in groups, groups
        return
    address, port = cp.kueue_visibility
    assert not ipaddress.ip_address(address).is_loopback
    assert VISIBILITY in groups
    for version in ("v1beta1", "v1beta2"):
        api_service = cp.request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{version}.{VISIBILITY}")
        assert {(c["type"], c["status"]) for c in api_service["status"]["conditions"]} == {("Available", "True")}
    namespace = cp.create_namespace()
    try:
        cp.request("GET", f"/apis/{VISIBILITY}/v1beta2/namespaces/{namespace}/localqueues/none/pendingworkloads")
        raise AssertionError("a LocalQueue that does not exist has pending workloads")
    except urllib.error.HTTPError as e:  # Kueue's own answer, through the aggregator
        assert e.code == 404 and json.loads(e.read())["message"] == f'localqueue.{VISIBILITY} "none" not found'
    finally:
        cp.delete_namespace(namespace)


def test_on_a_machine_without_a_non_loopback_address_kueue_runs_without_its_visibility_api_and_the_stage_says_so(
    real_control_plane, tmp_path, monkeypatch, capfd
):
    """kube-apiserver refuses loopback endpoints: without another address Kueue runs with the API off, the stage
    says so, and discovery does not list the group (what the tests expect then)."""
    from controlplane import cluster

    monkeypatch.setattr(cluster, "kueue_visibility_endpoint", lambda: None)
    with cluster.RealControlPlane(real_control_plane.build_info, tmp_path) as without:
        groups = {g["name"] for g in without.request("GET", "/apis")["groups"]}
        assert VISIBILITY not in groups and "kueue.x-k8s.io" in groups, groups
    assert "runs Kueue without its visibility API" in capfd.readouterr().err


def test_a_visibility_port_taken_before_kueue_binds_it_makes_the_control_plane_start_again(
    real_control_plane, tmp_path, monkeypatch
):
    """Kueue's visibility server listens on a port chosen free at start, on this machine's address: taken meanwhile,
    Kueue exits with "address already in use" and the control plane starts again on another."""
    from controlplane import cluster

    if real_control_plane.kueue_visibility is None:
        pytest.skip("this machine has no non-loopback IPv4 address: the stage runs Kueue without its visibility API")
    choose = cluster.kueue_visibility_endpoint
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind((real_control_plane.kueue_visibility[0], 0))
    taken.listen()
    chosen = []

    def taken_the_first_time():
        endpoint = choose() if chosen else (taken.getsockname()[0], taken.getsockname()[1])
        chosen.append(endpoint)
        return endpoint

    monkeypatch.setattr(cluster, "kueue_visibility_endpoint", taken_the_first_time)
    try:
        with cluster.RealControlPlane(real_control_plane.build_info, tmp_path) as cp:
            assert cp.kueue_visibility == chosen[-1] != taken.getsockname()
            assert VISIBILITY in {g["name"] for g in cp.request("GET", "/apis")["groups"]}
    finally:
        taken.close()
    assert len(chosen) == 2
    assert "address already in use" in (tmp_path / "logs-attempt-1" / "kueue-controller-manager.log").read_text()
