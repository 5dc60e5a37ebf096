"""Our node agent on the real control plane: the real kube-scheduler binds a TrainJob's pods to the
agent's Nodes, the real Trainer/JobSet/Job controllers own them, and the API server's `pods/log`
reads the agent's kubelet endpoint. Run with `python -m pytest -q -m real` (docs/real-control-plane.md)."""

import nemo_run as run
import pytest
import workloads
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow_local.kubelet.nodeagent import NodeAgent, NodeSpec

pytestmark = pytest.mark.real


@pytest.fixture()
def agent(real_control_plane, tmp_path):
    cp = real_control_plane
    serving = cp.certs.issue("node-agent", "nemo-kubeflow-node-agent")
    nodes = [NodeSpec("agent-a", cpu="8", memory="32Gi"), NodeSpec("agent-b", cpu="8", memory="32Gi")]
    with NodeAgent(cp.kubeconfig_path, nodes, tmp_path / "agent", serving_cert=serving) as running:
        yield running


def test_torchrun_allreduce_on_two_agent_nodes(real_control_plane, real_namespace, agent):
    cp, ns = real_control_plane, real_namespace
    executor = KubeflowExecutor(
        container_image="python:3.11",  # ignored by the node agent: the host's Python runs
        nodes=2,
        nprocs_per_node=2,
        launcher="torchrun",
        namespace=ns,
        kubeconfig=str(cp.kubeconfig_path),
        shm_size=None,
        packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
    )
    with run.Experiment("real-allreduce", executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(workloads.allreduce, expected_world_size=4), name="allreduce")
        exp.run(sequential=True)
        job = exp.jobs[0]
    app_id = parse_app_handle(job.handle)[2]
    pods = cp.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
    assert {p["spec"]["nodeName"] for p in pods} <= {"agent-a", "agent-b"} and len(pods) == 2  # bound by kube-scheduler
    lines = [line for node in (0, 1) for line in create_scheduler("t").log_iter(app_id, "allreduce", node)]
    assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED, lines
    sums = sorted(line for line in lines if "all_reduce sum" in line)
    assert len(sums) == 4 and all(line.rstrip().endswith("sum = 10") for line in sums), lines
