"""``cluster/watched.py`` on both back ends (the real kube-apiserver in the `real` tier): the held TrainJob,
JobSet and pods are what a read returns, for each selector our looks use (the field selectors are evaluated
here, as kube-apiserver evaluates them), a change reaches them, and repeated looks of a running job send no
GET or LIST of them (counted per job on the local back end: test_watched_job.py)."""

import nemo_run as run
from backends import app_id_of, wait_for
from torchx.specs import AppState

from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.watched import WatchedJob
from nemo_kubeflow.constants import JOBSET_KIND, JOBSET_NAME_LABEL, TRAINJOB_KIND
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe.job_view import NOT_PENDING, NOT_RUNNING, RUNNING, STARTING, UNSCHEDULED
from nemo_kubeflow.observe.log_follower import node_selector


def _names(items):
    return [p["metadata"]["name"] for p in items]


def test_held_objects_match_reads_and_looks_answer_from_them(backend):
    executor = backend.executor(nodes=2)
    with run.Experiment("watched", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="sleep 600"), name="sleeper")
        exp.run(detach=True)
    app_id = app_id_of(exp.jobs[0])
    name = app_id.split(":")[-1]
    cluster = KubernetesCluster(kubeconfig=backend.kubeconfig)
    wait_for(lambda: create_scheduler("t").describe(app_id).state == AppState.RUNNING, "running", timeout=180)
    watched = WatchedJob(cluster, backend.namespace, name)
    try:
        job = f"{JOBSET_NAME_LABEL}={name}"
        wait_for(
            lambda: watched.list("Pod", backend.namespace, job) and all(watched.current().values()),
            "the watches current",
        )
        ns = backend.namespace
        for labels in (job, node_selector(name), node_selector(name, 1)):
            for fields in (None, NOT_RUNNING, RUNNING, NOT_PENDING, UNSCHEDULED, STARTING):
                for limit in (None, 1):
                    assert _names(watched.list("Pod", ns, labels, fields, limit)) == _names(
                        cluster.list("Pod", ns, labels, fields, limit)
                    ), (labels, fields, limit)
                assert [p["metadata"]["uid"] for p in watched.list_metadata("Pod", ns, labels, fields)] == [
                    p["metadata"]["uid"] for p in cluster.list_metadata("Pod", ns, labels, fields)
                ]
        for kind in (TRAINJOB_KIND, JOBSET_KIND):  # the same object, at the same version once the watch has it
            wait_for(
                lambda kind=kind: (
                    watched.get(kind, name, ns)["metadata"]["resourceVersion"]
                    == cluster.get(kind, name, ns)["metadata"]["resourceVersion"]
                ),
                f"the held {kind}",
            )
            assert watched.get(kind, name, ns)["status"] == cluster.get(kind, name, ns)["status"]

        # A change reaches what is held: a label put on node 1's pod.
        [pod] = cluster.list("Pod", ns, node_selector(name, 1))
        cluster.patch("Pod", pod["metadata"]["name"], ns, {"metadata": {"labels": {"watched": "yes"}}})
        wait_for(
            lambda: _names(watched.list("Pod", ns, f"{job},watched=yes")) == [pod["metadata"]["name"]],
            "the label in the held pod",
        )
    finally:
        watched.stop()

    # An attached wait's looks answer as a read does (that they send no read: test_watched_job.py, counted by
    # the local server per job; the real one counts every client's requests together).
    scheduler = create_scheduler("looks")
    first = scheduler.look_after(app_id)[0]
    scheduler.look_after(app_id)  # watched from the second look
    cache = scheduler._watches[app_id].job_cache
    wait_for(lambda: all(cache.current().values()), "the look's watches current")
    looks = [scheduler.look_after(app_id)[0] for _ in range(4)]
    direct = create_scheduler("direct").describe(app_id)
    assert {(d.state, d.msg) for d in looks + [first]} == {(direct.state, direct.msg)}
    scheduler.cancel(app_id)  # its own write: the next look reads the API server, not the watch's older copy
    assert scheduler.look_after(app_id)[0].state == AppState.CANCELLED
