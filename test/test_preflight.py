"""Preflight checks: the packaged script on its own, and the local cluster running the ``preflight`` init
container before training (the rendered init container: test/unit/build/test_preflight.py)."""

import os
import subprocess
from pathlib import Path

import nemo_run as run
import pytest
from kubernetes import client
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import KubeflowExecutor, PVCMount
from nemo_kubeflow.observe.pod_states import failed_step
from nemo_kubeflow.parts.steps import step_selector
from nemo_kubeflow.parts.templates import templates_dir

SCRIPT = templates_dir() / "preflight.sh"


def preflight(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """The packaged script, run here as the init container would run it."""
    base = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PREFLIGHT_DNS_TIMEOUT": "1",
        "PREFLIGHT_DNS_INTERVAL": "1",
        "PET_MASTER_ADDR": "localhost",
        "PET_NODE_RANK": "1",
        "PET_NNODES": "2",
    }
    return subprocess.run(["bash", str(SCRIPT)], env={**base, **env}, capture_output=True, text=True, timeout=30)


def fake_nvidia_smi(tmp_path: Path, gpus: int) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(
        "#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})'\n" for i in range(gpus))
    )
    tool.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


# --- the script -------------------------------------------------------------------------------------------


def test_script_passes_with_one_line_per_check(tmp_path):
    out = preflight(
        tmp_path,
        PREFLIGHT_WRITABLE_PATHS=str(tmp_path),
        NCCL_SOCKET_IFNAME="lo",
        PREFLIGHT_EXPECTED_GPUS="2",
        PATH=fake_nvidia_smi(tmp_path, 2),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "preflight: node 1 of 2, ? process(es) per node, master localhost:?"
    assert [line.split()[1:3] for line in lines[1:-1]] == [
        ["dns", "OK"],
        ["gpus", "OK"],
        ["nccl", "OK"],
        ["storage", "OK"],
    ]
    assert lines[-1] == "preflight: all checks passed"
    assert not list(tmp_path.glob(".nemo-preflight-*"))  # the probe file is removed


@pytest.mark.parametrize(
    "env, failure",
    [
        ({"PET_MASTER_ADDR": "no-such-host.invalid"}, "dns: no-such-host.invalid did not resolve within 1s"),
        ({"PET_MASTER_ADDR": ""}, "dns: PET_MASTER_ADDR is not set: the runtime's envInjection did not reach"),
        ({"PREFLIGHT_EXPECTED_GPUS": "8", "PATH": "gpus:2"}, "gpus: 2 GPU(s) visible, expected 8"),
        ({"PREFLIGHT_EXPECTED_GPUS": "1", "PATH": "/usr/bin:/bin"}, "gpus: nvidia-smi not found, expected 1 GPU(s)"),
        (
            {"NCCL_SOCKET_IFNAME": "=no-such-nic0"},
            "nccl: NCCL_SOCKET_IFNAME==no-such-nic0 matches nothing in /sys/class/net",
        ),
        ({"NCCL_IB_HCA": "mlx5_9:1"}, "nccl: NCCL_IB_HCA=mlx5_9:1 matches nothing in /sys/class/infiniband"),
        ({"PREFLIGHT_WRITABLE_PATHS": "/no/such/claim"}, "storage: /no/such/claim is not writable"),
    ],
)
def test_each_failed_check_is_named_and_fails_the_script(tmp_path, env, failure):
    if env.get("PATH") == "gpus:2":
        env["PATH"] = fake_nvidia_smi(tmp_path, 2)
    out = preflight(tmp_path, **env)
    assert out.returncode == 1
    check = failure.split(":")[0]
    assert any(line.split()[1:3] == [check, "FAIL"] for line in out.stdout.splitlines()), out.stdout
    assert out.stdout.splitlines()[-1].startswith("preflight FAILED (1 check(s)); " + failure), out.stdout


def test_exclusion_lists_and_unset_settings_are_not_failures(tmp_path):
    out = preflight(tmp_path, NCCL_SOCKET_IFNAME="^docker,lo")
    assert out.returncode == 0 and "NCCL_SOCKET_IFNAME=^docker,lo excludes devices only" in out.stdout
    assert "gpus     SKIP" in out.stdout and "storage  SKIP" in out.stdout


# --- on the local cluster ------------------------------------------------------------------------------


def run_task(cluster, name: str, **kw):
    executor = KubeflowExecutor(
        container_image="python:3.11", nodes=2, kubeconfig=str(cluster.kubeconfig_path), shm_size=None, **kw
    )
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo training on $PET_NODE_RANK"), name="t")
        exp.run(sequential=True)
        job = exp.jobs[0]
    app_id = parse_app_handle(job.handle)[2]
    return exp.status(return_dict=True)["t"]["status"], app_id.split(":", 1)[1]


def preflight_logs(cluster, trainjob: str) -> dict[int, str]:
    core = client.CoreV1Api(cluster.api_client())
    pods = core.list_namespaced_pod("default", label_selector=step_selector(trainjob, "node")).items
    return {
        int(p.metadata.labels["batch.kubernetes.io/job-completion-index"]): core.read_namespaced_pod_log(
            p.metadata.name, "default", container="preflight"
        )
        for p in pods
    }


def test_local_cluster_runs_preflight_with_the_pet_values(cluster):
    state, name = run_task(
        cluster,
        "preflight-ok",
        preflight=True,
        pvc_mounts=[PVCMount(claim_name="ckpt", mount_path="/ckpt", create=True, size="1Gi")],
    )
    assert state == AppState.SUCCEEDED
    logs = preflight_logs(cluster, name)
    for rank in (0, 1):
        assert f"preflight: node {rank} of 2, 1 process(es) per node, master 127.0.0.1:" in logs[rank]
        assert "preflight: dns      OK   127.0.0.1 resolves" in logs[rank]
        assert "preflight: storage  OK" in logs[rank] and logs[rank].endswith("preflight: all checks passed\n")


def test_local_cluster_runs_a_command_of_your_own(cluster):
    state, name = run_task(cluster, "preflight-custom", preflight='echo "custom $(echo $PET_NODE_RANK)/$PET_NNODES"')
    assert state == AppState.SUCCEEDED
    assert preflight_logs(cluster, name) == {0: "custom 0/2\n", 1: "custom 1/2\n"}


def test_a_failing_preflight_fails_the_job_with_a_clear_message(cluster):
    state, name = run_task(cluster, "preflight-bad", preflight=True, env_vars={"NCCL_SOCKET_IFNAME": "=no-such-nic0"})
    assert state == AppState.FAILED
    pods = [
        p
        for p in cluster.objects("pods", "default")
        if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
    ]
    detail = failed_step(pods)
    assert (
        detail.startswith("preflight on node ")
        and "preflight FAILED (1 check(s)); nccl: NCCL_SOCKET_IFNAME==no-such-nic0 matches nothing in /sys/class/net"
        in detail
    )
    # Training never started.
    assert not any(
        cs["name"] == "node" and "terminated" in cs["state"]
        for p in pods
        for cs in p["status"].get("containerStatuses", [])
    )
