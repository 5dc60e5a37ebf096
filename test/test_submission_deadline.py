"""A stalled API server: one retry layer (ours), a deadline for the whole submission, and the same clean
outcome as any failed submission (what was created removed, an error that says the server stalled)."""

import time

import pytest
from torchx.specs import Role

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.plan import build_submission
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.submit import submit
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.errors import ClusterUnreachableError, DeadlineExceededError, SubmissionError

RESOURCES = ("configmaps", "secrets", "trainjobs", "clustertrainingruntimes")
STALL = 1.0  # seconds the server holds a stalled request: more than the client's read timeout below


def client(local, **kw) -> KubernetesCluster:
    return KubernetesCluster(
        kubeconfig=str(local.kubeconfig_path), backoff=0.01, max_backoff=0.05, request_timeout=0.3, **kw
    )


def plan(task: str):
    executor = KubeflowExecutor(container_image="img", nodes=1, shm_size=None)
    role = Role(name=task, image="", entrypoint="bash", args=["-c", "sleep 30"])
    return build_submission(
        executor, role, [BundleFile("code/a.py", b"print(1)\n")], task_name=task, experiment_id=f"deadline-{task}"
    )


def ours(local, sub) -> dict:
    """This test's objects on the cluster: the TrainJob, the task's ConfigMaps, the runtime."""
    names = {sub.name, *(cm["metadata"]["name"] for cm in sub.configmaps), sub.runtime["metadata"]["name"]}
    return {
        r: sorted(o["metadata"]["name"] for o in local.objects(r, None) if o["metadata"]["name"] in names)
        for r in RESOURCES
    }


def settled(local, match) -> int:
    """Requests matching ``match`` once the log stops growing: the server logs a request when it answers,
    and a stalled one is answered after the client gave up on it."""
    time.sleep(STALL + 0.3)
    count = -1
    while (current := sum(1 for r in local.requests if match(r))) != count:
        count = current
        time.sleep(0.2)
    return count


def test_a_stalled_server_ends_the_submission_at_its_deadline_and_leaves_nothing(local):
    local.clear_requests()
    cluster = client(local, max_attempts=50)  # only the deadline can end the tries
    sub = plan("stalled")
    stall = local.inject_fault(verb="create", resource="configmaps", delay=STALL, times=1000)
    try:
        with pytest.raises(SubmissionError) as err:
            submit(cluster, sub, timeout=1.5)
    finally:
        stall.remove()
    cause = err.value.__cause__
    assert isinstance(cause, DeadlineExceededError), repr(cause)
    message = str(err.value)
    assert "nothing was left on the cluster" in message and "stalled" in message, message
    assert "submit_timeout_seconds" in message and "kubectl get --raw /readyz" in message, message
    # The deadline ended it, not the attempt limit; every try of ours was one request to the server.
    tries = settled(local, lambda r: r.verb == "create" and r.resource == "configmaps")
    assert 1 <= cause.tries < cluster.max_attempts
    assert tries == cause.tries
    # The rollback deleted the TrainJob (once: its delete was not stalled), and with it what it owned,
    # the ConfigMap the server created after the client gave up included.
    assert sum(1 for r in local.requests if r.verb == "delete" and r.resource == "trainjobs") == 1
    local.wait_for(lambda: ours(local, sub) == {r: [] for r in RESOURCES}, timeout=10)


def test_urllib3_does_not_retry_under_our_retries(local):
    """A DELETE (idempotent: urllib3 retries its read timeouts 3 times by default) reaches the server once
    per try of ours."""
    local.clear_requests()
    cluster = client(local, max_attempts=2)
    stall = local.inject_fault(verb="delete", resource="configmaps", name="stalled-delete", delay=STALL, times=1000)
    try:
        with pytest.raises(ClusterUnreachableError, match="did not answer"):
            cluster.delete("ConfigMap", "stalled-delete", "default")
    finally:
        stall.remove()
    assert settled(local, lambda r: r.verb == "delete" and r.name == "stalled-delete") == 2


def test_the_deadline_bounds_reads_too_and_names_the_setting(local):
    local.clear_requests()
    cluster = client(local, max_attempts=50)
    stall = local.inject_fault(verb="get", resource="configmaps", name="stalled-get", delay=STALL, times=1000)
    try:
        with pytest.raises(DeadlineExceededError, match=r"stalled: no answer within 1 s, my_setting") as err:
            with cluster.deadline(1.0, "my_setting"):
                cluster.get("ConfigMap", "stalled-get", "default")
    finally:
        stall.remove()
    assert 1 <= err.value.tries < cluster.max_attempts
    assert settled(local, lambda r: r.verb == "get" and r.name == "stalled-get") == err.value.tries
