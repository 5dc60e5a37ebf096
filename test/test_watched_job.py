"""The looks that repeat (an attached wait, ``nemo-kubeflow watch``: ``look_after``) read a job's TrainJob, JobSet
and pods from watches (``cluster/watched.py``), counted at the HTTP level on a local cluster of status-only pods:
no GET or LIST of them per look once the watches are current, the same answers as a look that reads them, a
change seen by the next look, and the reads going to the API server where a watch cannot answer (no right to
watch, a selector it does not evaluate). The outage case is test_outages_and_gone_jobs.py's."""

import queue
import time

import pytest
from polling import wait_for
from test_describe_reads_at_scale import status_only_cluster
from test_diagnosis import submit
from torchx.specs import AppState

from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.cluster.watched import WatchedJob
from nemo_kubeflow.constants import COMPLETION_INDEX_LABEL, JOBSET_KIND, JOBSET_NAME_LABEL, TRAINJOB_KIND
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe.job_view import NOT_PENDING, NOT_RUNNING, RUNNING, STARTING, UNSCHEDULED
from nemo_kubeflow.observe.log_follower import node_selector

NODES = 4


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    yield from status_only_cluster(tmp_path_factory, NODES * 2)


def _running_job(local, title, **kw):
    _, app_id = submit(local, title, script="sleep 600", nodes=NODES, **kw)
    name = app_id.split(":")[-1]
    wait_for(
        lambda: (
            sum(
                p["status"].get("phase") == "Running"
                for p in local.objects("pods", "default")
                if p["metadata"]["labels"].get(JOBSET_NAME_LABEL) == name
            )
            == NODES
        ),
        "every pod running",
        timeout=120,
    )
    return app_id, name


def _job_requests(local, name):
    return sorted(
        (r.verb, r.resource)
        for r in local.requests
        if name in (r.name or "") + r.query.get("labelSelector", "") + r.query.get("fieldSelector", "")
    )


def _current(scheduler, app_id):
    cache = scheduler._watches[app_id].job_cache
    return cache is not None and all(cache.current().values())


def test_repeated_looks_read_the_job_from_watches_and_answer_as_a_read_does(local):
    app_id, name = _running_job(local, "wj-looks")
    scheduler = create_scheduler("wj")
    assert scheduler.look_after(app_id)[0].state == AppState.RUNNING
    assert scheduler._watches[app_id].job_cache is None  # its first look reads: a job over is never watched
    scheduler.look_after(app_id)
    wait_for(lambda: _current(scheduler, app_id), "the watches current", timeout=30)
    local.clear_requests()
    looks = [scheduler.look_after(app_id)[0] for _ in range(5)]
    requests = _job_requests(local, name)
    assert not [r for r in requests if r in {("get", "trainjobs"), ("get", "jobsets"), ("list", "pods")}], requests
    direct = create_scheduler("direct").describe(app_id)
    assert {(d.state, d.msg) for d in looks} == {(direct.state, direct.msg)}
    assert direct.state == AppState.RUNNING

    # A change reaches the next look: a node fails, the job (no retries) fails.
    local.end_pods(f"{JOBSET_NAME_LABEL}={name},{COMPLETION_INDEX_LABEL}=1", 3)
    failed = wait_for(
        lambda: (d := scheduler.look_after(app_id)[0]).state == AppState.FAILED and d,
        "the look to see the failure",
        timeout=60,
    )
    assert "exited with code 3" in failed.msg, failed.msg
    assert scheduler._watches[app_id].job_cache is None  # over: no longer watched


def test_the_held_pods_are_what_a_list_with_each_selector_of_ours_returns(local):
    app_id, name = _running_job(local, "wj-select")
    local.end_pods(f"{JOBSET_NAME_LABEL}={name},{COMPLETION_INDEX_LABEL}=2", 0)
    cluster = KubernetesCluster(kubeconfig=str(local.kubeconfig_path))
    watched = WatchedJob(cluster, "default", name)
    try:
        job = f"{JOBSET_NAME_LABEL}={name}"
        wait_for(
            lambda: watched.list("Pod", "default", job) and all(watched.current().values()),
            "the watches current",
            timeout=30,
        )
        for labels in (job, node_selector(name), node_selector(name, 0), node_selector(name, 2)):
            for fields in (None, NOT_RUNNING, RUNNING, NOT_PENDING, UNSCHEDULED, STARTING):
                for limit in (None, 1, 8):
                    assert [p["metadata"]["name"] for p in watched.list("Pod", "default", labels, fields, limit)] == [
                        p["metadata"]["name"] for p in cluster.list("Pod", "default", labels, fields, limit)
                    ], (labels, fields, limit)
                assert watched.list_metadata("Pod", "default", labels, fields) == cluster.list_metadata(
                    "Pod", "default", labels, fields
                ), (labels, fields)
        assert watched.get(TRAINJOB_KIND, name, "default") == cluster.get(TRAINJOB_KIND, name, "default")
        assert (
            watched.get(JOBSET_KIND, name, "default")["metadata"]["uid"]
            == cluster.get(JOBSET_KIND, name, "default")["metadata"]["uid"]
        )
        local.clear_requests()
        watched.list("Pod", "default", job, NOT_RUNNING)
        watched.get(TRAINJOB_KIND, name, "default")
        assert _job_requests(local, name) == []
        # A selector not evaluated here (set-based) and another job's pods go to the API server.
        watched.list("Pod", "default", f"{JOBSET_NAME_LABEL} in ({name})")
        watched.list("Pod", "default", f"{JOBSET_NAME_LABEL}=someone-else")
        watched.get(TRAINJOB_KIND, "someone-else", "default")
        assert (
            len([r for r in local.requests if r.verb in ("list", "get") and r.resource in ("pods", "trainjobs")]) == 3
        )
    finally:
        watched.stop()


def test_why_a_job_ended_is_read_from_the_api_server_not_from_watches_that_lag(local, monkeypatch):
    from nemo_kubeflow.cluster.watched import _Collection

    app_id, name = _running_job(local, "wj-ended")
    scheduler = create_scheduler("wj-ended")
    for _ in range(2):  # watched from the second look
        scheduler.look_after(app_id)
    wait_for(lambda: _current(scheduler, app_id), "the watches current", timeout=30)
    # The pod watch falls behind (each watch is a stream of its own): its held pods still run when the
    # TrainJob's watch brings the verdict.
    apply = _Collection._apply
    monkeypatch.setattr(_Collection, "_apply", lambda self, event: "" if self.kind == "Pod" else apply(self, event))
    local.end_pods(f"{JOBSET_NAME_LABEL}={name},{COMPLETION_INDEX_LABEL}=1", 3)
    failed = wait_for(
        lambda: (d := scheduler.look_after(app_id)[0]).state == AppState.FAILED and d,
        "the look to see the failure",
        timeout=60,
    )
    assert "exited with code 3" in failed.msg, failed.msg


def test_without_the_right_to_watch_pods_their_reads_go_to_the_api_server(local):
    app_id, name = _running_job(local, "wj-denied")
    local.deny("watch", "pods")
    try:
        scheduler = create_scheduler("wj-denied")
        for _ in range(2):  # watched from the second look
            scheduler.look_after(app_id)
        cache = scheduler._watches[app_id].job_cache
        wait_for(
            lambda: (
                cache.current()[TRAINJOB_KIND]
                and cache.current()[JOBSET_KIND]
                and "Pod" in cache._refused | {k for k, c in cache._collections.items() if c.refused}
            ),
            "the TrainJob and JobSet watched, the pods refused",
            timeout=30,
        )
        local.clear_requests()
        look = scheduler.look_after(app_id)[0]
        requests = _job_requests(local, name)
        assert ("list", "pods") in requests and ("get", "trainjobs") not in requests, requests
        assert cache.sent_to_server["its watch was refused"] >= 1, cache.sent_to_server  # why, for --verbose
        direct = create_scheduler("direct").describe(app_id)
        assert (look.state, look.msg) == (direct.state, direct.msg) and look.state == AppState.RUNNING
    finally:
        local.allow_all()


def test_a_view_waits_for_its_watch_to_list_instead_of_listing_beside_it(local):
    # A log follower's view of a large job, made for a look at once, waits for the watch's first list: the pods
    # are listed once, not by the look and by the watch. Where the watch cannot answer (no right to watch
    # pods), the wait ends as soon as that is known, not at its timeout.
    _, name = _running_job(local, "wj-wait")
    cluster = KubernetesCluster(kubeconfig=str(local.kubeconfig_path))
    local.clear_requests()
    watched = WatchedJob(cluster, "default", name)
    try:
        assert watched.wait_held("Pod", 30)
        assert [p["metadata"]["name"] for p in watched.list("Pod", "default", node_selector(name))] == sorted(
            p["metadata"]["name"]
            for p in local.objects("pods", "default")
            if p["metadata"]["labels"].get(JOBSET_NAME_LABEL) == name
        )
        assert [r for r in _job_requests(local, name) if r[1] == "pods"] == [("list", "pods"), ("watch", "pods")]
    finally:
        watched.stop()
    local.deny("watch", "pods")
    denied = WatchedJob(cluster, "default", name)
    try:
        started = time.monotonic()
        assert not denied.wait_held("Pod", 30)
        assert time.monotonic() - started < 15
        assert denied.wait_held(TRAINJOB_KIND, 30)
    finally:
        denied.stop()
        local.allow_all()


def test_a_look_after_a_write_of_this_process_reads_the_api_server(local):
    app_id, name = _running_job(local, "wj-wrote")
    scheduler = create_scheduler("wj-wrote")
    for _ in range(2):  # watched from the second look
        scheduler.look_after(app_id)
    wait_for(lambda: _current(scheduler, app_id), "the watches current", timeout=30)
    cache = scheduler._watches[app_id].job_cache  # the look that sees the job over stops watching it
    scheduler.cancel(app_id)
    started = time.monotonic()
    local.clear_requests()
    look = scheduler.look_after(app_id)[0]
    assert time.monotonic() - started < 5
    assert ("get", "trainjobs") in _job_requests(local, name)  # not the watch's copy, which may predate the delete
    assert look.state == AppState.CANCELLED, look.msg
    assert cache.sent_to_server["this process wrote to the job within 5 s"] >= 1, cache.sent_to_server


def test_watching_pauses_when_nobody_reads_and_starts_again_on_the_next_read(local, monkeypatch):
    from nemo_kubeflow.cluster import watched as watched_module

    app_id, name = _running_job(local, "wj-idle")
    monkeypatch.setattr(watched_module, "IDLE_STOP_S", 0.5)
    cluster = KubernetesCluster(kubeconfig=str(local.kubeconfig_path))
    watched = WatchedJob(cluster, "default", name)
    try:
        watched.get(TRAINJOB_KIND, name, "default")
        wait_for(
            lambda: not any(watched.current().values()) and watched._stopped is None, "watching paused", timeout=30
        )
        local.clear_requests()
        assert watched.get(TRAINJOB_KIND, name, "default")["metadata"]["name"] == name  # read through, restarts
        # Read from the API server: by the read itself, or by the new watch's list when it is done first (its
        # thread starts before the read looks: on a local server the list may be in before the read looks).
        read = _job_requests(local, name)
        assert ("get", "trainjobs") in read or read[:1] == [("list", "trainjobs")], read
        wait_for(lambda: watched.current()[TRAINJOB_KIND], "watching again", timeout=30)
    finally:
        watched.stop()
    assert watched._closed and not any(watched.current().values())


def test_a_watch_whose_version_expired_lists_again_and_an_error_event_breaks_it():
    from nemo_kubeflow.cluster.watched import _Collection, _Expired

    collection = _Collection(None, "Pod", "default", lambda: None)
    assert collection._apply({"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "5"}}}) == "5"
    assert collection._apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}) == "9"
    assert collection._apply({"type": "DELETED", "object": {"metadata": {"name": "a", "resourceVersion": "10"}}})
    assert collection.objects == {}
    with pytest.raises(_Expired):
        collection._apply({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}})
    with pytest.raises(ValueError, match="watch error: internal"):
        collection._apply({"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "internal"}})


def test_a_process_watches_at_most_so_many_sets_and_reads_the_others(local, monkeypatch):
    from nemo_kubeflow.cluster import watched as watched_module

    # Earlier tests' sets may still watch, and pause and start again as their readers come and go: the cap is set
    # to what this process watches once this test's two sets do, just before the third asks (not counted at the
    # start, where a set of an earlier test starting again meanwhile took one of this test's places).
    monkeypatch.setattr(watched_module, "MAX_WATCHED_SETS", 10**6)
    cluster = KubernetesCluster(kubeconfig=str(local.kubeconfig_path))
    jobs = [WatchedJob(cluster, "default", f"wj-cap-{i}") for i in range(3)]
    try:
        for job in jobs[:2]:
            job.get(TRAINJOB_KIND, job.name, "default")
            wait_for(lambda job=job: all(job.current().values()), "watched", timeout=30)
        local.clear_requests()
        with watched_module._watching_lock:
            monkeypatch.setattr(watched_module, "MAX_WATCHED_SETS", len(watched_module._watching))
        assert jobs[2].get(TRAINJOB_KIND, "wj-cap-2", "default") is None
        assert _job_requests(local, "wj-cap-2") == [("get", "trainjobs")] and not any(jobs[2].current().values())
        assert list(jobs[2].sent_to_server) == [
            f"not watched ({watched_module.MAX_WATCHED_SETS} other experiments or jobs are, in this process)"
        ], jobs[2].sent_to_server
        jobs[0].stop()
        jobs[2].get(TRAINJOB_KIND, "wj-cap-2", "default")
        wait_for(lambda: all(jobs[2].current().values()), "the third watched once the first stopped", timeout=30)
    finally:
        for job in jobs:
            job.stop()


def test_the_node_log_keeper_of_a_watched_job_shares_the_follower_of_the_client_it_reads_through(local):
    """A waiting process that keeps the node logs (through its watched reader) and follows them live (through
    the client, `tail_logs`) reads each node's log once: one follower for both."""
    from nemo_kubeflow.observe import log_follower

    app_id, name = _running_job(local, "wj-keeper")
    scheduler = create_scheduler("wj-keeper")
    for _ in range(2):  # the node logs are kept from the second look
        scheduler.look_after(app_id)
    watch = scheduler._watches[app_id]
    assert watch.keeper is not None and watch.job_cache is not None
    [follower] = log_follower._followers[(id(watch.job_cache.cluster), "default", name)]
    assert set(watch.keeper._followers.values()) == {follower}
    sink = queue.SimpleQueue()
    live = log_follower.subscribe_node(watch.job_cache.cluster, "default", name, 0, sink)  # as log_iter subscribes
    live.unsubscribe(0, sink)
    assert live is follower
    scheduler.cancel(app_id)
    scheduler.look_after(app_id)


def test_a_status_only_pod_logs_as_a_running_container_that_prints_nothing(local):
    """What the node log keeper's count at 1,024 nodes rests on (benchmarks/bench_apiload.py): a read gets no line
    and a follow stream stays open until the container ends, as a kubelet serves a silent container."""
    _, name = _running_job(local, "wj-silent")
    cluster = KubernetesCluster(kubeconfig=str(local.kubeconfig_path))
    [pod] = [p["metadata"]["name"] for p in cluster.list("Pod", "default", node_selector(name, 1))]
    assert list(cluster.pod_log(pod, "default", container="node")) == []
    stream = cluster.pod_log_stream(pod, "default", container="node")
    got = queue.SimpleQueue()

    def drain():
        got.put(list(stream))

    import threading

    threading.Thread(target=drain, daemon=True).start()
    time.sleep(1.5)
    assert got.empty()  # open and silent while the container runs
    local.end_pods(f"{JOBSET_NAME_LABEL}={name},{COMPLETION_INDEX_LABEL}=1", 0)
    assert got.get(timeout=10) == []  # ended with the container
    create_scheduler("t").cancel(f"default:{name}")
