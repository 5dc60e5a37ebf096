"""What the Kubeflow SDK (kubeflow 0.5) reads of our jobs, on the local cluster.

Every nemo_kubeflow TrainJob is created suspended and resumed once its ConfigMaps and Secret exist, so it
carries the condition ``Suspended=False`` from then on. The SDK's ``get_job``/``list_jobs`` derive "Running"
only for a TrainJob with no condition at all (kubeflow/sdk#803), so a running job of ours reads "Created"
there until it ends; "Complete" and "Failed" read right. Kept as documented (docs/troubleshooting.md,
"The Kubeflow SDK says Created"): these tests pin that reading and the workarounds the page gives."""

import uuid

import pytest
from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import TrainerClient
from polling import wait_for
from torchx.specs import Role

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import submit
from nemo_kubeflow.config.packager import BundleFile


@pytest.fixture()
def ns(local) -> str:
    name = "sdk-" + uuid.uuid4().hex[:8]
    local.create_namespace(name)
    return name


def submitted(local, ns: str, script: str) -> str:
    executor = KubeflowExecutor(container_image="img", nodes=2, shm_size=None, namespace=ns)
    role = Role(name="train", image="", entrypoint="bash", args=["-c", script])
    sub = build_submission(
        executor, role, [BundleFile("code/a.py", b"print(1)\n")], task_name="train", experiment_id=f"sdk-{ns}"
    )
    submit(KubernetesCluster(kubeconfig=str(local.kubeconfig_path)), sub)
    return sub.name


def sdk(local, ns: str) -> TrainerClient:
    return TrainerClient(KubernetesBackendConfig(namespace=ns, client_configuration=local.configuration()))


def test_a_running_job_of_ours_reads_created_and_its_steps_read_running(local, ns):
    name = submitted(local, ns, "sleep 60")
    client = sdk(local, ns)

    def all_nodes_running():
        job = client.get_job(name)
        nodes = [s for s in job.steps if s.name.startswith("node")]
        return job if len(nodes) == 2 and all(s.status == "Running" for s in nodes) else None

    job = wait_for(all_nodes_running, "both node steps Running", timeout=60)
    [trainjob] = [j for j in local.objects("trainjobs", ns) if j["metadata"]["name"] == name]
    assert {"type": "Suspended", "status": "False"}.items() <= next(
        c for c in trainjob["status"]["conditions"] if c["type"] == "Suspended"
    ).items()
    assert job.status == "Created"  # sdk#803: the documented limitation; the steps above are the workaround
    assert [j.status for j in client.list_jobs() if j.name == name] == ["Created"]
    client.delete_job(name)


def test_waiting_for_the_end_works_with_the_sdk(local, ns):
    name = submitted(local, ns, "echo done")
    client = sdk(local, ns)
    job = client.wait_for_job_status(name, {"Complete", "Failed"}, timeout=90, polling_interval=1)
    assert job.status == "Complete"
    client.delete_job(name)
