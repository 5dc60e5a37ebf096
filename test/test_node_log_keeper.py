"""The node log keeper of a waiting process (``observe/kept_logs.py`` ``NodeLogKeeper``) on a local cluster whose pods
run: node 0 followed with one stream, the other nodes read only when the job's pod watch tells of trouble (a pod
failed, or is being deleted), counted at the HTTP level; their last lines still saved when a failure deletes
their pods; and, without the right to watch pods, every node read in rounds as before."""

import time
from pathlib import Path

import pytest
from polling import wait_for
from test_diagnosis import submit
from torchx.specs import AppState

from nemo_kubeflow.cluster import watched as watched_module
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.constants import JOBSET_NAME_LABEL
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe import log_follower
from nemo_kubeflow.observe.kept_logs import _KeptLines
from nemo_kubeflow.repair.steps import keep_node_logs

NODES = 3
#: Every node prints its lines; node 2 fails once the test says so (a file appears); the others sleep on, and
#: take 2 s to stop when their pod is deleted, as a training process does (torchrun's agent passes SIGTERM to
#: its workers and waits for them). A pod being deleted serves its log until its containers have stopped: a
#: process that stops within milliseconds of the Job controller's delete can be gone before the keeper's read
#: (the failure then says "no log for node(s) ...", test_diagnosis.py).
SCRIPT = """trap 'echo "node $PET_NODE_RANK stopping"; sleep 2; exit 143' TERM
for i in 1 2 3; do echo "node $PET_NODE_RANK line $i"; done
while [ ! -e "{trigger}" ]; do sleep 0.2; done
if [ "$PET_NODE_RANK" = 2 ]; then echo "node 2 fails"; exit 5; fi
sleep 600 & wait $!
"""


def _node_pods(local, name):
    return {
        p["metadata"]["name"]: p
        for p in local.objects("pods", "default")
        if p["metadata"]["labels"].get(JOBSET_NAME_LABEL) == name
    }


def _all_running(local, name, nodes):
    wait_for(
        lambda: sum(p["status"].get("phase") == "Running" for p in _node_pods(local, name).values()) == nodes,
        "every pod running",
        timeout=120,
    )


def _log_reads(local, pods):
    """The log requests since the last clear, by pod."""
    return {pod: sum(1 for r in local.requests if r.resource == "pods/log" and r.name == pod) for pod in pods}


@pytest.mark.parametrize("pod_watch", ["allowed", "denied"])
def test_the_other_nodes_are_read_on_trouble_and_their_last_lines_outlive_their_pods(local, tmp_path, pod_watch):
    trigger = tmp_path / "fail-now"
    exp, app_id = submit(local, f"keep-{pod_watch}", script=SCRIPT.format(trigger=trigger), nodes=NODES)
    name = app_id.split(":")[-1]
    _all_running(local, name, NODES)
    if pod_watch == "denied":
        local.deny("watch", "pods")
    try:
        local.clear_requests()
        scheduler = create_scheduler(f"keep-{pod_watch}")
        for _ in range(2):  # the node logs are kept from the second look
            scheduler.look_after(app_id)
        watch = scheduler._watches[app_id]
        assert watch.keeper is not None
        wait_for(
            lambda: all(len(lines) >= 3 for i, lines in watch.keeper.kept_lines().items() if i == 0),
            "node 0's lines kept",
            timeout=30,
        )
        others = sorted(p for p in _node_pods(local, name) if "-node-0-0-" not in p)
        time.sleep(1.0)
        if pod_watch == "allowed":
            local.clear_requests()  # denied: counted from the keeper's start (a node alone on its reader is streamed)
        for _ in range(6):  # a keeper's round in turn reads a quiet node every 4 s at most
            time.sleep(1.0)
            assert scheduler.look_after(app_id)[0].state == AppState.RUNNING
        reads = _log_reads(local, others)
        if pod_watch == "allowed":
            assert reads == dict.fromkeys(others, 0), reads  # all goes well: nothing read
        else:
            assert all(n >= 1 for n in reads.values()), reads  # no pod events: read or followed, as before

        trigger.touch()
        failed = wait_for(
            lambda: (d := scheduler.look_after(app_id)[0]).state == AppState.FAILED and d,
            "the look to see the failure",
            timeout=90,
        )
        assert "exited with code 5" in failed.msg, failed.msg
        wait_for(
            lambda: not [p for p in _node_pods(local, name) if "-node-0-2-" not in p],
            "the pods that still ran deleted with the failed job",
            timeout=60,
            detail=lambda: str(
                {
                    n: (p["status"].get("phase"), p["metadata"].get("deletionTimestamp"))
                    for n, p in _node_pods(local, name).items()
                }
            ),
        )
        logs = Path(exp.jobs[0].executor.job_dir) / "logs"
        for node in range(NODES):
            kept = (logs / f"node-{node}.log").read_text()
            assert f"node {node} line 3" in kept, (node, kept)
        assert "node 2 fails" in (logs / "node-2.log").read_text()
        assert "no log for node" not in failed.msg, failed.msg  # none lost with its pod
    finally:
        local.allow_all()


def test_a_pod_gone_between_its_list_and_its_read_has_its_kept_lines_saved(local, tmp_path):
    """The repair step saves each node's whole log from its pod; a pod that the Job controller deletes between the
    step's list and its read answers 404: the node's last lines kept while waiting are saved instead of a line
    saying the pod was not found."""
    exp, app_id = submit(local, "keep-gone", script=SCRIPT.format(trigger=tmp_path / "never"), nodes=2)
    name = app_id.split(":")[-1]
    _all_running(local, name, 2)
    scheduler = create_scheduler("keep-gone")
    for _ in range(2):
        scheduler.look_after(app_id)
    keeper = scheduler._watches[app_id].keeper
    wait_for(lambda: len(keeper.kept_lines()[0]) >= 3, "node 0's lines kept", timeout=30)
    keeper.stop()
    pods = _node_pods(local, name)
    node_0 = next(p for p in pods if "-node-0-0-" in p)
    local.inject_fault(
        verb="get",
        resource="pods/log",
        name=node_0,
        status=404,
        reason="NotFound",
        message=f'pods "{node_0}" not found',
    )
    job_dir = exp.jobs[0].executor.job_dir
    cluster = KubernetesCluster(kubeconfig=str(local.kubeconfig_path))
    assert keep_node_logs(cluster, "default", name, job_dir, keeper) == f"node logs saved in {job_dir}/logs"
    logs = Path(job_dir) / "logs"
    assert (logs / "node-0.log").read_text() == "".join(keeper.kept_lines()[0])
    assert "node 0 line 3" in (logs / "node-0.log").read_text()
    assert "node 1 line 3" in (logs / "node-1.log").read_text()  # read from its pod
    create_scheduler("t").cancel(app_id)


#: ft_launcher's lines of one in-job restart (torchelastic's agent): node 1's worker killed, every agent restarting.
#: Node 1 logs its worker's end when ``{cause}`` appears, then ``{logged}`` appears; node 0 logs its restart once
#: ``{restart}`` appears (as a real peer's agent, after the failing node's line, when it is ``{logged}``).
IN_JOB = """echo "node $PET_NODE_RANK up"
if [ "$PET_NODE_RANK" = 1 ]; then
  while [ ! -e "{cause}" ]; do sleep 0.2; done
  echo "E1127 06:23:08.497000 7 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -9) local_rank: 0 (pid: 812) of binary: python"
  touch "{logged}"
else
  while [ ! -e "{restart}" ]; do sleep 0.2; done
fi
echo "[default] Worker group FAILED. 2/2 attempts left; will restart worker group"
sleep 600
"""


def _in_job_job(local, tmp_path, monkeypatch, name, restart, pod_events=True, room=1):
    """A 2-node job of ``IN_JOB`` (node 0 restarts on the file ``restart`` names), running, looked at twice
    (the node logs are kept from the second look) and node 0's lines kept: (app_id, scheduler, its pods).
    Room is made for its watches beside those that earlier tests' schedulers hold for 2 minutes after their last
    read (``IDLE_STOP_S``): over ``MAX_WATCHED_SETS`` its pod events would not flow, and node 1 be followed
    (``room=0``: none made)."""
    paths = {k: tmp_path / k for k in ("cause", "logged")}
    script = IN_JOB.format(restart=paths[restart] if restart in paths else tmp_path / restart, **paths)
    _, app_id = submit(local, name, script=script, nodes=2)
    trainjob = app_id.split(":")[-1]
    _all_running(local, trainjob, 2)
    monkeypatch.setattr(watched_module, "MAX_WATCHED_SETS", len(watched_module._watching) + room)
    scheduler = create_scheduler(name)
    for _ in range(2):
        scheduler.look_after(app_id)
    keeper = scheduler._watches[app_id].keeper
    flow = keeper._cluster.pod_events_flow
    wait_for(lambda: flow() is pod_events, f"pod events flowing: {pod_events}", timeout=30)  # a refusal comes later
    wait_for(lambda: keeper.kept_lines()[0], "node 0's lines kept", timeout=30)
    if pod_events:
        assert not keeper.kept_lines()[1]  # all goes well: node 1 not read
    return app_id, scheduler, sorted(_node_pods(local, trainjob))


def _restart_counted(scheduler, app_id):
    return wait_for(
        lambda: (d := scheduler.look_after(app_id)[0]) and "in-job restart" in d.msg and d,
        "the look to count the restart",
        timeout=60,
    )


def _cause_named(scheduler, app_id):
    return wait_for(
        lambda: (d := scheduler.look_after(app_id)[0]) and "killed by signal" in d.msg and d,
        "a look to name the restart's cause",
        timeout=30,
        detail=lambda: scheduler.look_after(app_id)[0].msg,
    )


def test_an_in_job_restart_in_node_0s_lines_has_the_other_nodes_read_for_its_cause(local, tmp_path, monkeypatch):
    """No pod event tells of an in-job restart: node 0's lines do (every agent logs each), and the failing node's
    lines, read then, say which worker died. Node 0 restarts once node 1 has written its line, but the kubelet may
    serve that line a moment later (a loaded machine): a look that counts the restart before it reads on at the
    next look (test_a_restarts_cause_logged_after_the_look_that_counts_it_is_read_at_the_next_look)."""
    app_id, scheduler, _ = _in_job_job(local, tmp_path, monkeypatch, "keep-injob", restart="logged")
    (tmp_path / "cause").touch()
    look = _restart_counted(scheduler, app_id)
    assert look.state == AppState.RUNNING and "1 in-job restart" in look.msg, look.msg
    look = _cause_named(scheduler, app_id)
    assert look.state == AppState.RUNNING and "1 in-job restart" in look.msg, look.msg
    assert "on node 1 killed by signal 9" in look.msg, look.msg
    create_scheduler("t").cancel(app_id)


def test_a_restarts_cause_logged_after_the_look_that_counts_it_is_read_at_the_next_look(local, tmp_path, monkeypatch):
    """The failing node's line may not be in its log yet when node 0's restart is counted (or its read slow): a
    later look (IN_JOB_CAUSE_AGAIN_S after the first read) reads the nodes again, and once the cause is known no
    look reads them for it."""
    app_id, scheduler, pods = _in_job_job(local, tmp_path, monkeypatch, "keep-late", restart="restart-now")
    node_1 = next(p for p in pods if "-node-0-1-" in p)
    local.clear_requests()
    (tmp_path / "restart-now").touch()
    look = _restart_counted(scheduler, app_id)
    assert "1 in-job restart" in look.msg and "killed by signal" not in look.msg, look.msg
    # Node 1 read for the cause (not there yet): the look waits for that read a while only (TROUBLE_READS_WAIT_S).
    wait_for(lambda: _log_reads(local, [node_1])[node_1] >= 1, "node 1 read for the restart's cause", timeout=30)
    (tmp_path / "cause").touch()
    wait_for(lambda: (tmp_path / "logged").exists(), "node 1 to log its worker's end", timeout=30)
    look = _cause_named(scheduler, app_id)
    assert "1 in-job restart" in look.msg and "on node 1 killed by signal 9" in look.msg, look.msg
    reads = _log_reads(local, [node_1])[node_1]
    for _ in range(2):
        assert "on node 1 killed by signal 9" in scheduler.look_after(app_id)[0].msg
    assert _log_reads(local, [node_1])[node_1] == reads  # the cause known: node 1 not read again
    create_scheduler("t").cancel(app_id)


def test_an_in_job_restart_without_pod_events_is_answered_by_the_followed_nodes_stream(local, tmp_path, monkeypatch):
    """Without the right to watch pods a node alone on its reader is followed with a stream, whose visit ends only
    with the stream: the look that counts a restart has it answer the trouble at once (its lines come as they are
    logged) instead of waiting for a read that never comes (TROUBLE_READS_WAIT_S at that look and at each after)."""
    local.deny("watch", "pods")
    try:
        app_id, scheduler, _ = _in_job_job(
            local, tmp_path, monkeypatch, "keep-nowatch", restart="restart-now", pod_events=False
        )
        keeper = scheduler._watches[app_id].keeper
        wait_for(lambda: keeper.kept_lines()[1], "node 1's lines kept (followed: no pod events)", timeout=30)
        (tmp_path / "restart-now").touch()
        look = _restart_counted(scheduler, app_id)
        assert "1 in-job restart" in look.msg and "killed by signal" not in look.msg, look.msg
        follower = keeper._followers[1]
        assert follower.nudges_answered(0), "node 1's stream holds the trouble unanswered"
        (tmp_path / "cause").touch()
        look = _cause_named(scheduler, app_id)
        assert "1 in-job restart" in look.msg and "on node 1 killed by signal 9" in look.msg, look.msg
    finally:
        local.allow_all()
    create_scheduler("t").cancel(app_id)


def test_a_node_followed_before_the_pod_events_flowed_is_read_once_on_trouble(local, tmp_path, monkeypatch):
    """Over the cap of watched sets (other experiments' in this process) the job's pod events do not flow and node
    1, alone on its reader, is followed with a stream; once they flow (a set paused, making room), the trouble of a
    restart closes that stream and node 1 is read once, as trouble's reads are (CI: the earlier tests' sets held
    the cap, node 1's stream opened before the test counted its reads, and none came)."""
    app_id, scheduler, pods = _in_job_job(
        local, tmp_path, monkeypatch, "keep-capped", restart="restart-now", pod_events=False, room=0
    )
    node_1 = next(p for p in pods if "-node-0-1-" in p)
    keeper = scheduler._watches[app_id].keeper
    wait_for(lambda: keeper.kept_lines()[1], "node 1's lines kept (followed: no pod events)", timeout=30)
    follower = keeper._followers[1]
    assert sorted(index for index, _ in follower._streams.values()) == [0, 1]
    monkeypatch.setattr(watched_module, "MAX_WATCHED_SETS", len(watched_module._watching) + 2)
    scheduler.look_after(app_id)  # watched from this look on
    assert keeper._cluster.pod_events_flow()
    local.clear_requests()
    (tmp_path / "restart-now").touch()
    look = _restart_counted(scheduler, app_id)
    assert "1 in-job restart" in look.msg, look.msg
    reads = [r for r in local.requests if r.resource == "pods/log" and r.name == node_1]
    assert reads and not any(r.query.get("follow") for r in reads), [r.query for r in reads]
    assert [index for index, _ in follower._streams.values()] == [0]  # node 1 no longer followed
    (tmp_path / "cause").touch()
    look = _cause_named(scheduler, app_id)
    assert "on node 1 killed by signal 9" in look.msg, look.msg
    create_scheduler("t").cancel(app_id)


def test_a_node_that_joins_after_the_jobs_last_pod_list_is_read_when_nudged_at_once(local, tmp_path, monkeypatch):
    """A follower lists the job's pods at most every ``LIST_SECONDS``; a node that subscribes after a list (the
    keeper subscribes node 0, whose reader lists at once, then node 1) is listed at the next visit all the same:
    nudged at once, it is read, not passed over as having no pod (CI: the look that counted an in-job restart
    within a second of the keeper's start read no node for its cause)."""
    monkeypatch.setattr(log_follower, "LIST_SECONDS", 600.0)  # no list but the first, unless a node joins
    _, app_id = submit(local, "keep-join", script=SCRIPT.format(trigger=tmp_path / "never"), nodes=2)
    trainjob = app_id.split(":")[-1]
    _all_running(local, trainjob, 2)
    monkeypatch.setattr(watched_module, "MAX_WATCHED_SETS", len(watched_module._watching) + 1)
    watched = watched_module.WatchedJob(KubernetesCluster(kubeconfig=str(local.kubeconfig_path)), "default", trainjob)
    watched.list("Pod", "default", label_selector=f"{JOBSET_NAME_LABEL}={trainjob}")  # its watches start
    assert watched.pod_events_flow()
    node_0, node_1 = _KeptLines(), _KeptLines(on_trouble=True)
    follower = log_follower.subscribe_node(watched, "default", trainjob, 0, node_0)
    wait_for(node_0.snapshot, "node 0's lines", timeout=30)  # its reader listed the pods
    assert log_follower.subscribe_node(watched, "default", trainjob, 1, node_1) is follower
    follower.nudge()
    assert follower.nudges_answered(10)
    assert "node 1 line 3" in "".join(node_1.snapshot()), node_1.snapshot()
    follower.unsubscribe(0, node_0)
    follower.unsubscribe(1, node_1)
    watched.stop()
    create_scheduler("t").cancel(app_id)
