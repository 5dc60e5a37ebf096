"""The node agent (our kubelet on any API server), attached to a local cluster without its own
kubelet: Node registration, pods bound to its Nodes run, report status, serve logs over HTTPS,
die on deletion, and torchrun finds its peers by their pod DNS names."""

from __future__ import annotations

import base64
import ssl
import urllib.error
import urllib.request

import pytest
from kubernetes import client
from localcluster_helpers import ALL_REDUCE_SCRIPT, alive, recorded_pids, stubborn_pod, wait_gone

from nemo_kubeflow_local import LocalCluster
from nemo_kubeflow_local.kubelet.nodeagent import NodeAgent, NodeSpec

TORCHRUN = (
    "echo master $PET_MASTER_ADDR:$PET_MASTER_PORT; "
    "torchrun --nnodes $PET_NNODES --nproc-per-node 1 --node-rank $PET_NODE_RANK "
    "--master-addr $PET_MASTER_ADDR --master-port $PET_MASTER_PORT /workspace/script.py"
)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A local API server whose pods no embedded kubelet runs."""
    with LocalCluster(tmp_path_factory.mktemp("bare"), run_kubelet=False) as local:
        yield local


@pytest.fixture(scope="module")
def agent(bare, tmp_path_factory):
    with NodeAgent(
        bare.kubeconfig_path,
        [NodeSpec("n1", cpu="4", memory="8Gi"), NodeSpec("n2", gpus=2)],
        tmp_path_factory.mktemp("agent"),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def core(bare) -> client.CoreV1Api:
    return client.CoreV1Api(bare.api_client())


def kubelet_get(agent: NodeAgent, path: str) -> tuple[int, str]:
    """GET from the agent's kubelet endpoint as the API server does (not verifying its certificate)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{agent.port}{path}", context=context, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_phase(bare, core, name: str, phases=("Succeeded", "Failed"), timeout: float = 30.0):
    return bare.wait_for(
        lambda: (lambda p: p if p.status.phase in phases else None)(core.read_namespaced_pod(name, "default")), timeout
    )


def test_nodes_are_registered_ready_with_their_resources_and_endpoint(agent, core):
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == {"n1", "n2"}
    assert nodes["n1"].status.allocatable == {"cpu": "4", "memory": "8Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    assert nodes["n2"].status.allocatable["nvidia.com/gpu"] == "2"
    for node in nodes.values():
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert (ready.status, ready.reason) == ("True", "KubeletReady")
        assert node.status.daemon_endpoints.kubelet_endpoint.port == agent.port
        assert [(a.type, a.address) for a in node.status.addresses][0] == ("InternalIP", "127.0.0.1")
        assert node.metadata.labels["kubernetes.io/hostname"] == node.metadata.name
    assert kubelet_get(agent, "/healthz") == (200, "ok")


def test_a_bound_pod_runs_with_its_volumes_and_env_and_serves_its_logs(bare, agent, core):
    core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}, "data": {"greeting.txt": "hello"}})
    core.create_namespaced_secret(
        "default", {"metadata": {"name": "creds"}, "data": {"token": base64.b64encode(b"s3cret").decode()}}
    )
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": "worker"},
            "spec": {
                "nodeName": "n2",
                "restartPolicy": "Never",
                "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}, {"name": "scratch", "emptyDir": {}}],
                "initContainers": [
                    {
                        "name": "prepare",
                        "image": "busybox",
                        "command": ["sh", "-c", "echo prepared > /scratch/ready"],
                        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                    }
                ],
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "command": [
                            "sh",
                            "-c",
                            'cat /etc/cfg/greeting.txt; echo; cat /scratch/ready; echo "node=$NODE token=${#TOKEN}"; '
                            "exit 3",
                        ],
                        "env": [
                            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                        ],
                        "volumeMounts": [
                            {"name": "cfg", "mountPath": "/etc/cfg"},
                            {"name": "scratch", "mountPath": "/scratch"},
                        ],
                    }
                ],
            },
        },
    )
    pod = wait_phase(bare, core, "worker")
    assert pod.status.phase == "Failed"
    assert (pod.status.pod_ip, pod.status.host_ip) == ("127.0.0.1", "127.0.0.1")
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 0
    assert {c.type: c.status for c in pod.status.conditions}["Initialized"] == "True"

    assert kubelet_get(agent, "/containerLogs/default/worker/main") == (200, "hello\nprepared\nnode=n2 token=6\n")
    status, tail = kubelet_get(agent, "/containerLogs/default/worker/main?tailLines=1&timestamps=true")
    assert status == 200 and tail.endswith(" node=n2 token=6\n") and tail.startswith("20")
    assert kubelet_get(agent, "/containerLogs/default/worker/prepare") == (200, "")
    status, message = kubelet_get(agent, "/containerLogs/default/worker/main?previous=true")
    assert (status, message) == (400, 'previous terminated container "main" in pod "worker" not found')
    assert kubelet_get(agent, "/containerLogs/default/nosuch/main")[0] == 404
    events = {
        e.reason for e in core.list_namespaced_event("default", field_selector="involvedObject.name=worker").items
    }
    assert {"Pulled", "Created", "Started"} <= events


def test_deleting_a_pod_kills_every_process_after_the_grace_period_then_removes_it(bare, agent, core, tmp_path):
    body = stubborn_pod("stubborn", tmp_path, grace=1)
    body["spec"]["nodeName"] = "n1"
    core.create_namespaced_pod("default", body)
    pids = recorded_pids(tmp_path, 3)
    wait_phase(bare, core, "stubborn", phases=("Running",))
    core.delete_namespaced_pod("stubborn", "default")
    wait_gone(pids)
    assert len(list(tmp_path.glob("term-*"))) == 3  # SIGTERM reached all three first
    bare.wait_for(lambda: "stubborn" not in {p.metadata.name for p in core.list_namespaced_pod("default").items})


def test_torchrun_finds_its_master_by_pod_dns_name_on_a_port_of_its_own(bare, agent, core):
    """Two pods as JobSet makes them (hostname + subdomain, PET_MASTER_ADDR the first pod's DNS name,
    port 29500 declared), one per node."""
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": "script"}, "data": {"script.py": ALL_REDUCE_SCRIPT}}
    )
    for rank, node in enumerate(("n1", "n2")):
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": f"job-node-0-{rank}"},
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "hostname": f"job-node-0-{rank}",
                    "subdomain": "job",
                    "volumes": [{"name": "code", "configMap": {"name": "script"}}],
                    "containers": [
                        {
                            "name": "node",
                            "image": "pytorch",
                            "command": ["bash", "-c", TORCHRUN],
                            "ports": [{"containerPort": 29500}],
                            "volumeMounts": [{"name": "code", "mountPath": "/workspace"}],
                            "env": [
                                {"name": "PET_NNODES", "value": "2"},
                                {"name": "PET_NODE_RANK", "value": str(rank)},
                                {"name": "PET_MASTER_ADDR", "value": "job-node-0-0.job"},
                                {"name": "PET_MASTER_PORT", "value": "29500"},
                            ],
                        }
                    ],
                },
            },
        )
    pods = [wait_phase(bare, core, f"job-node-0-{rank}", timeout=120) for rank in range(2)]
    logs = [kubelet_get(agent, f"/containerLogs/default/job-node-0-{rank}/node")[1] for rank in range(2)]
    assert [p.status.phase for p in pods] == ["Succeeded", "Succeeded"], logs
    masters = {line for log in logs for line in log.splitlines() if line.startswith("master ")}
    assert len(masters) == 1  # both pods agree on one address and port
    host, port = masters.pop().split()[1].split(":")
    assert host == "127.0.0.1" and port != "29500"
    assert sorted(line for log in logs for line in log.splitlines() if "sum=" in line) == [
        "rank 0 of 2: sum=3",
        "rank 1 of 2: sum=3",
    ]


def test_stopping_the_agent_kills_its_pods_and_unregisters_its_nodes(bare, core, tmp_path):
    with NodeAgent(bare.kubeconfig_path, [NodeSpec("n3")], tmp_path / "agent"):
        body = stubborn_pod("left", tmp_path, grace=600)
        body["spec"]["nodeName"] = "n3"
        core.create_namespaced_pod("default", body)
        pids = recorded_pids(tmp_path, 3)
        assert "n3" in {n.metadata.name for n in core.list_node().items}
    assert [pid for pid in pids if alive(pid)] == []
    assert "n3" not in {n.metadata.name for n in core.list_node().items}


def test_the_kubelet_endpoint_serves_a_given_certificate(bare, tmp_path):
    """For an API server that verifies kubelets (--kubelet-certificate-authority): a certificate
    issued for 127.0.0.1 (self-signed here, so that it is its own CA)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-kubelet")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "kubelet.crt", tmp_path / "kubelet.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    with NodeAgent(
        bare.kubeconfig_path, [NodeSpec("n4")], tmp_path / "agent", serving_cert=(cert_file, key_file)
    ) as agent:
        verifying = ssl.create_default_context(cafile=str(cert_file))
        with urllib.request.urlopen(f"https://127.0.0.1:{agent.port}/healthz", context=verifying) as answer:
            assert answer.read() == b"ok"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--node", "n5:cpus=4"], "--node 'n5:cpus=4': 'cpus=4' is not one of cpu=, memory=, gpus=, pods="),
        (["--node", "n5", "--tls-cert", "a.crt"], "--tls-cert and --tls-key go together"),
    ],
)
def test_node_agent_command_refuses_bad_options(tmp_path, capsys, extra, message):
    from nemo_kubeflow_local.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["node-agent", "--kubeconfig", str(tmp_path / "kubeconfig"), "--workdir", str(tmp_path), *extra])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_heartbeats_move_and_a_pod_left_running_by_a_stopped_agent_is_failed_by_the_next(bare, core, tmp_path):
    def ready(node: str):
        return next(c for c in core.read_node(node).status.conditions if c.type == "Ready")

    with NodeAgent(bare.kubeconfig_path, [NodeSpec("n6")], tmp_path / "agent", unregister=False, heartbeat_seconds=0.3):
        first = ready("n6")
        bare.wait_for(lambda: ready("n6").last_heartbeat_time > first.last_heartbeat_time, timeout=10)
        assert ready("n6").last_transition_time == first.last_transition_time
        body = stubborn_pod("orphan", tmp_path, grace=600)
        body["spec"]["nodeName"] = "n6"
        core.create_namespaced_pod("default", body)
        pids = recorded_pids(tmp_path, 3)
        wait_phase(bare, core, "orphan", phases=("Running",))
    assert [pid for pid in pids if alive(pid)] == []
    with NodeAgent(bare.kubeconfig_path, [NodeSpec("n6")], tmp_path / "agent"):
        pod = wait_phase(bare, core, "orphan", phases=("Failed",))
        assert pod.status.reason == "NodeAgentRestarted"
    assert len(list(tmp_path.glob("pid-*"))) == 3  # it did not run again


def test_gpu_containers_get_devices_of_their_own_until_their_pod_ends(bare, agent, core, tmp_path):
    """n2 has 2 GPUs (host devices 0 and 1: n1, first, has none)."""

    def pod(name: str, gpus: int, hold: bool) -> dict:
        wait = f"while [ ! -e {tmp_path}/release ]; do sleep 0.05; done; " if hold else ""
        resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
        return {
            "metadata": {"name": name},
            "spec": {
                "nodeName": "n2",
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "cuda",
                        "resources": resources,
                        "command": ["sh", "-c", f'echo "devices=[$CUDA_VISIBLE_DEVICES]"; {wait}true'],
                    }
                ],
            },
        }

    def devices(name: str) -> str:
        wait_phase(bare, core, name, phases=("Running", "Succeeded"))
        return bare.wait_for(lambda: kubelet_get(agent, f"/containerLogs/default/{name}/main")[1].strip())

    core.create_namespaced_pod("default", pod("gpu-a", 1, hold=True))
    assert devices("gpu-a") == "devices=[0]"
    core.create_namespaced_pod("default", pod("gpu-b", 1, hold=True))
    assert devices("gpu-b") == "devices=[1]"
    core.create_namespaced_pod("default", pod("no-gpu", 0, hold=False))
    assert devices("no-gpu") == "devices=[]"  # the node's GPUs are hidden from it
    (tmp_path / "release").touch()
    for name in ("gpu-a", "gpu-b"):
        assert wait_phase(bare, core, name).status.phase == "Succeeded"
    core.create_namespaced_pod("default", pod("gpu-both", 2, hold=False))
    assert devices("gpu-both") == "devices=[0,1]"


def test_the_embedded_kubelet_leaves_pods_bound_to_other_nodes_alone(cluster, ns):
    """A local cluster with its own kubelet: a pod bound to an agent's Node is not run (nor removed
    on deletion) by it, while a pod after it runs."""
    local = client.CoreV1Api(cluster.api_client())
    command = ["sh", "-c", "echo ran"]
    local.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "elsewhere"},
            "spec": {
                "nodeName": "agent-node",
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "x", "command": command}],
            },
        },
    )
    local.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "here"},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x", "command": command}]},
        },
    )
    cluster.wait_for(lambda: local.read_namespaced_pod("here", ns).status.phase == "Succeeded")
    local.delete_namespaced_pod("elsewhere", ns)
    elsewhere = local.read_namespaced_pod("elsewhere", ns)
    assert elsewhere.status.phase == "Pending" and not elsewhere.status.container_statuses
    assert elsewhere.metadata.deletion_timestamp is not None  # its kubelet (an agent) would finish it
    assert not cluster.pod_dir("elsewhere", ns).exists()


def test_pod_dns_names_and_declared_ports_are_rewritten_for_the_shared_host_network():
    from nemo_kubeflow_local.kubelet.nodeagent import PodNetwork

    network = PodNetwork()

    def pod(name: str, subdomain: str) -> dict:
        return {
            "metadata": {"name": name, "namespace": "team"},
            "spec": {
                "hostname": name,
                "subdomain": subdomain,
                "containers": [{"name": "node", "ports": [{"containerPort": 29500}]}],
            },
        }

    argv, env = network.rewrite(
        pod("a-node-0-1", "a"),
        ["--rdzv-endpoint=a-node-0-0.a.team.svc.cluster.local:29500", "--other=b-node-0-0.b:29500", "a.b.c", "x.ab"],
        {
            "PET_MASTER_ADDR": "a-node-0-0.a",
            "PET_MASTER_PORT": "29500",
            "WORKERS": "a-node-0-0.a.team,a-node-0-1.a",
            "SIZE": "29500",
        },
    )
    port = env["PET_MASTER_PORT"]
    assert port != "29500" and network.rewrite(pod("a-node-0-0", "a"), [], {"PET_MASTER_PORT": "29500"})[1] == {
        "PET_MASTER_PORT": port
    }  # every pod of the JobSet gets the same port
    assert network.rewrite(pod("b-node-0-0", "b"), [], {"PET_MASTER_PORT": "29500"})[1]["PET_MASTER_PORT"] != port
    assert argv == [f"--rdzv-endpoint=127.0.0.1:{port}", "--other=b-node-0-0.b:29500", "a.b.c", "x.ab"]
    assert env == {
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": port,
        "WORKERS": "127.0.0.1,127.0.0.1",
        "SIZE": "29500",
    }
