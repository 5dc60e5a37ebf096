"""An attached wait of several tasks of one experiment, counted by the real kube-apiserver (its
``apiserver_request_total`` metric) and by the local cluster (``api_counters``): one watch of each kind for the
experiment's tasks (``cluster/watched.py``), and no read of their TrainJobs, JobSets and pods once the watches are
current; the two servers' counts agree within 20 % (test_watched_experiment.py counts per request, locally)."""

import time
import uuid

import nemo_run as run
import pytest
from polling import wait_for
from test_apiload_real import _namespaces_emptied, _no_namespace_emptied, _real_counts
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

TASKS = 3
#: Rounds of looks (one per task each) counted once the watches are current.
ROUNDS = 4
#: Countings of those rounds while another client's reads of the same kinds may be in the counts (``_attached``).
READ_ATTEMPTS = 5
KINDS = ("trainjobs", "jobsets", "pods")
WATCHES = {("watch", kind) for kind in KINDS}
READS = {(verb, kind) for verb in ("get", "list", "watch") for kind in KINDS}


def _attached(kubeconfig: str, namespace: str, counts, settled=lambda: True, unsettled=None) -> tuple[dict, dict]:
    """Submit TASKS 1-node tasks that run, then look at each as an attached wait does: (the watches opened from
    its second looks until they are current, the reads and watches of ROUNDS rounds of looks after that)."""
    executor = KubeflowExecutor(
        container_image="python:3.11", nodes=1, shm_size=None, namespace=namespace, kubeconfig=kubeconfig
    )
    with run.Experiment("watched-real", executor=executor, log_level="WARN") as exp:
        for i in range(TASKS):
            exp.add(run.Script(inline="sleep 300"), name=f"sleeper-{i}")
        exp.run(detach=True)
    app_ids = [parse_app_handle(job.handle)[2] for job in exp.jobs]
    for app_id in app_ids:
        wait_for(lambda a=app_id: create_scheduler("t").describe(a).state == AppState.RUNNING, "running", timeout=180)
    scheduler = create_scheduler("attached")
    for app_id in app_ids:  # the first looks read
        scheduler.look_after(app_id)
    before = counts(WATCHES)
    for app_id in app_ids:  # watched from the second look
        scheduler.look_after(app_id)
    caches = [scheduler._watches[a].job_cache for a in app_ids]
    wait_for(lambda: all(all(c.current().values()) for c in caches), "the watches current", timeout=60)
    opened = _difference(before, counts(WATCHES))
    for _ in range(READ_ATTEMPTS):
        before = counts(READS)
        for _ in range(ROUNDS):
            for app_id in app_ids:
                assert scheduler.look_after(app_id)[0].state == AppState.RUNNING
        looked = _difference(before, counts(READS))
        if not looked or settled():
            break
        # The counts have no namespace: the namespace controller emptying an earlier test's namespace (its
        # retries back off for minutes) lists these kinds too. Counted again; reads of ours would be in each.
        time.sleep(2)
    else:
        print(
            f"reads counted in each of {READ_ATTEMPTS} countings; namespaces being deleted:", unsettled and unsettled()
        )
    for app_id, cache in zip(app_ids, caches):
        cache.stop()
        create_scheduler("t").cancel(app_id)
    return opened, looked


def _difference(before: dict, after: dict) -> dict:
    return {
        k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before) if after.get(k, 0) - before.get(k, 0)
    }


@pytest.mark.real
def test_the_real_api_server_counts_one_set_of_watches_for_the_tasks_of_an_experiment(
    real_control_plane, node_agent, real_namespace, tmp_path
):
    from nemo_kubeflow_local import LocalCluster

    with LocalCluster(workdir=tmp_path / "local") as local:
        namespace = f"watched-{uuid.uuid4().hex[:6]}"
        local.create_namespace(namespace)

        def local_counts(counted):
            return {(c.verb, c.resource): c.requests for c in local.api_counters() if (c.verb, c.resource) in counted}

        emulated = _attached(str(local.kubeconfig_path), namespace, local_counts)
    real = _attached(
        str(real_control_plane.kubeconfig_path),
        real_namespace,
        lambda counted: _real_counts(
            real_control_plane,
            counted,
            # A watch is in kube-apiserver's request count once it ends (a minute later): the watches open now.
            "apiserver_longrunning_requests" if counted is WATCHES else "apiserver_request_total",
        ),
        settled=lambda: _no_namespace_emptied(real_control_plane),
        unsettled=lambda: f"namespaces being deleted: {_namespaces_emptied(real_control_plane)}",
    )
    # One watch of each kind for the experiment, not one per task; no read of them once current.
    assert emulated == (dict.fromkeys(sorted(WATCHES), 1), {}), emulated
    for mine, theirs in zip(emulated, real):
        for key in set(mine) | set(theirs):
            assert abs(theirs.get(key, 0) - mine.get(key, 0)) <= 0.2 * max(mine.get(key, 0), theirs.get(key, 0)), (
                key,
                emulated,
                real,
            )
