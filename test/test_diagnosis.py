"""Why is it pending, why did it fail: what status tells the user, on the local cluster."""

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import nemo_run as run
import pytest
from polling import wait_for_status
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import KubeflowExecutor, PVCMount
from nemo_kubeflow.nemo_run.scheduler import create_scheduler


def submit(local, name, script="echo hi", **kw):
    executor = KubeflowExecutor(
        **{
            "container_image": "python:3.11",
            "nodes": 2,
            "shm_size": None,
            "kubeconfig": str(local.kubeconfig_path),
            **kw,
        }
    )
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name=name)
        exp.run(detach=True)
    return exp, parse_app_handle(exp.jobs[0].handle)[2]


def wait_for_message(app_id, text, timeout=30):
    return wait_for_status(
        create_scheduler("t"), app_id, lambda d: text in d.msg, f"{text!r} in the status", timeout=timeout
    )


def test_image_that_cannot_be_pulled_ends_the_wait(local):
    executor = KubeflowExecutor(
        container_image="registry.invalid/team/nemo:25.02",
        nodes=2,
        shm_size=None,
        kubeconfig=str(local.kubeconfig_path),
    )
    started = time.monotonic()
    with run.Experiment("pull", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="echo never"), name="pull")
        exp.run(sequential=True)  # waits: must end promptly, not hang on ImagePullBackOff
    assert time.monotonic() - started < 60
    [job] = exp.jobs
    status = exp.status(return_dict=True)[job.id]
    assert status["status"] == AppState.FAILED
    desc = create_scheduler("t").describe(parse_app_handle(job.handle)[2])
    assert desc.state == AppState.FAILED
    assert "image 'registry.invalid/team/nemo:25.02' cannot be pulled" in desc.msg and "not found" in desc.msg
    assert "the TrainJob was deleted" in desc.msg
    assert not [j for j in local.objects("trainjobs", "default") if "pull" in j["metadata"]["name"]]


def test_unschedulable_gpu_request(local):
    _, app_id = submit(local, "nogpu", gpus_per_node=1)
    desc = wait_for_message(app_id, "cannot be scheduled")
    assert desc.state == AppState.PENDING
    assert "0/1 nodes are available: 1 Insufficient nvidia.com/gpu." in desc.msg
    create_scheduler("t").cancel(app_id)


def test_missing_pvc(local):
    _, app_id = submit(local, "nopvc", pvc_mounts=[PVCMount(claim_name="missing-claim", mount_path="/data")])
    desc = wait_for_message(app_id, 'persistentvolumeclaim "missing-claim" not found')
    assert desc.state == AppState.PENDING
    create_scheduler("t").cancel(app_id)


def test_missing_secret_key(local):
    _, app_id = submit(local, "nosecret", secret_key_refs={"TOKEN": "absent-secret/token"})
    desc = wait_for_message(app_id, "cannot start")
    assert desc.state == AppState.PENDING and "absent-secret" in desc.msg
    create_scheduler("t").cancel(app_id)


def test_progress_is_shown_while_waiting(local, capsys):
    _, app_id = submit(local, "progress", gpus_per_node=1)
    wait_for_message(app_id, "Insufficient nvidia.com/gpu")
    out = capsys.readouterr()
    assert "pending: node" in " ".join((out.out + out.err).split())
    create_scheduler("t").cancel(app_id)


def test_failure_summary_names_the_rank_and_saves_every_log(local):
    # Node 0 finishes first: a failed Job deletes its pods that still run, logs and all.
    script = (
        'for i in 1 2 3; do echo "node $PET_NODE_RANK step $i"; done\n'
        'if [ "$PET_NODE_RANK" = 1 ]; then sleep 1; exit 3; fi'
    )
    exp, app_id = submit(local, "summary", script=script)
    desc = wait_for_message(app_id, "exited with code", timeout=60)
    assert desc.state == AppState.FAILED
    assert "node 1 (pod " in desc.msg and "exited with code 3" in desc.msg
    assert "last lines of node 1:" in desc.msg and "node 1 step 3" in desc.msg
    logs = Path(exp.jobs[0].executor.job_dir) / "logs"
    assert not logs.exists()  # a status query only reads: the repair step (a wait, `watch`) keeps the logs
    desc, repaired = create_scheduler("t").look_after(app_id)
    assert repaired == [f"node logs saved in {logs}"] and f"node logs saved in {logs}" in desc.msg
    assert f"node logs kept in {logs}" in create_scheduler("t").describe(app_id).msg
    assert "node 0 step 3" in (logs / "node-0.log").read_text()
    assert "node 1 step 3" in (logs / "node-1.log").read_text()


def test_failure_summary_says_which_logs_died_with_their_pods(local):
    script = 'echo "node $PET_NODE_RANK up"\nif [ "$PET_NODE_RANK" = 1 ]; then exit 4; fi\nsleep 30'
    _, app_id = submit(local, "lostlog", script=script)
    name = app_id.split(":", 1)[1]

    def failed():
        job = next(j for j in local.objects("trainjobs", "default") if j["metadata"]["name"] == name)
        return any(c["type"] == "Failed" and c["status"] == "True" for c in job.get("status", {}).get("conditions", []))

    def node0_gone():
        return not any(p["metadata"]["name"].startswith(f"{name}-node-0-0-") for p in local.objects("pods", "default"))

    # Nobody waited for the detached job while it ran: nothing kept node 0's lines when its pod was deleted.
    # Describe only once that pod is gone (under load it can still be terminating when Failed is set).
    local.wait_for(failed, timeout=60)
    local.wait_for(node0_gone, timeout=60)
    desc = wait_for_message(app_id, "no log for node(s) 0: their pods were deleted when the job failed", timeout=60)
    assert "exited with code 4" in desc.msg


def test_following_logs_keeps_them_next_to_the_job(local):
    exp, app_id = submit(local, "tee", script='echo "kept from node $PET_NODE_RANK"')
    scheduler = create_scheduler("t")
    for node in (0, 1):
        assert any("kept from node" in line for line in scheduler.log_iter(app_id, "tee", node, should_tail=True))
    logs = Path(exp.jobs[0].executor.job_dir) / "logs"
    assert "kept from node 1\n" in (logs / "node-1.log").read_text()


def test_failed_preflight_is_named_in_the_status(local):
    _, app_id = submit(
        local, "preflightfail", preflight='echo "checking"; echo "nccl: interface eth9 missing" >&2; exit 1'
    )
    desc = wait_for_message(app_id, "preflight on node", timeout=60)
    assert desc.state == AppState.FAILED and "(pod " in desc.msg


def test_following_logs_continues_across_a_gang_restart(local):
    # First attempt fails (no marker yet on the shared claim), the restarted gang succeeds.
    script = (
        "if [ ! -f /data/attempted-$PET_NODE_RANK ]; then touch /data/attempted-$PET_NODE_RANK; "
        'echo "attempt one"; sleep 3; exit 5; fi\necho "attempt two"'
    )
    claim = PVCMount(claim_name="restart-claim", mount_path="/data", create=True, size="1Gi")
    _, app_id = submit(local, "restart", script=script, retries=1, pvc_mounts=[claim])
    lines = list(create_scheduler("t").log_iter(app_id, "restart", 0, should_tail=True))
    text = "".join(lines)
    assert "attempt one" in text and "attempt two" in text, text
    assert "--- gang restart: following pod" in text and "(restart attempt 1)" in text
    assert create_scheduler("t").describe(app_id).state == AppState.SUCCEEDED


# A torch worker that fails as the task says: the last rank raises, exits with 3, or is killed by SIGKILL.
FAILING_WORKER = """\
import os, signal, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print(f"rank {rank} starting", flush=True)
if rank == world - 1:
    time.sleep(0.5)
    how = sys.argv[1]
    if how == "raise":
        raise RuntimeError("step 7 got a bad batch")
    if how == "exit":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(30)
"""


@pytest.fixture()
def nemo_kubeflow_cli(console_script, nemorun_home):
    """Runs `nemo-kubeflow ARGS` in a new process, with the test's NEMORUN_HOME."""
    tool = console_script("nemo-kubeflow")
    env = {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "250"}
    return lambda *args: subprocess.run([tool, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.needs_torch
def test_why_a_rank_failed_in_its_own_words(local, tmp_path, nemorun_home, nemo_kubeflow_cli, console_script):
    """The failed rank, its node and its exception (or exit code, signal, missing torchrun) reach
    describe's message, the console of the waiting experiment, `nemo experiment status` and
    `nemo-kubeflow status`; every node's last lines are kept although the failed Job's pods are deleted."""
    from nemo_kubeflow import ConfigMapPackager

    worker = tmp_path / "train.py"
    worker.write_text(FAILING_WORKER)
    base = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        nprocs_per_node=2,
        shm_size=None,
        launcher="torchrun",
        kubeconfig=str(local.kubeconfig_path),
        packager=ConfigMapPackager(relative_path=str(tmp_path), include_pattern="train.py"),
    )
    single = base.clone()
    single.nprocs_per_node = 1
    no_torch = base.clone()
    no_torch.nodes, no_torch.nprocs_per_node = 1, 1
    no_torch.env_vars = {"PATH": "/usr/bin:/bin"}  # the local cluster's stand-in for an image without torch
    with run.Experiment("why", executor=base, log_level="WARN") as exp:
        exp.add(run.Script(path=str(worker), args=["raise"], entrypoint="python"), name="raise")
        exp.add(run.Script(path=str(worker), args=["exit"], entrypoint="python"), name="exit", executor=single)
        exp.add(run.Script(path=str(worker), args=["kill"], entrypoint="python"), name="kill", executor=single.clone())
        exp.add(run.Script(path=str(worker), args=["raise"], entrypoint="python"), name="notorch", executor=no_torch)
        exp.run(sequential=False)  # waits for all four
        exp_id = exp._id
    messages = {}
    for job in exp.jobs:
        desc = create_scheduler("t").describe(parse_app_handle(job.handle)[2])
        assert desc.state == AppState.FAILED, (job.id, desc.state, desc.msg)
        messages[job.id] = desc.msg
    assert messages["raise"].startswith("rank 3 on node 1: RuntimeError: step 7 got a bad batch;"), messages["raise"]
    assert 'raise RuntimeError("step 7 got a bad batch")' in messages["raise"]  # the traceback is quoted
    assert messages["exit"].startswith("rank 1 on node 1: exited with code 3;"), messages["exit"]
    assert messages["kill"].startswith("rank 1 on node 1: killed by SIGKILL"), messages["kill"]
    assert messages["notorch"].startswith(
        "node 0: torchrun: command not found in the container: the image has no torch"
    ), messages["notorch"]
    assert "install torch" in messages["notorch"]
    # Node 0 was still running when node 1 failed: its pod went with the failed Job, its last lines did not.
    raise_logs = Path(exp.jobs[0].executor.job_dir) / "logs"
    assert "rank 0 starting" in (raise_logs / "node-0.log").read_text()
    assert "RuntimeError: step 7 got a bad batch" in (raise_logs / "node-1.log").read_text()
    assert "no log for node(s)" not in messages["raise"]

    out = nemo_kubeflow_cli("status", exp_id)
    assert out.returncode == 1, out.stderr
    text = out.stdout
    assert "Task 0: raise (TrainJob default/" in text and "state: FAILED" in text
    for line in (
        "why:   rank 3 on node 1: RuntimeError: step 7 got a bad batch",
        "why:   rank 1 on node 1: exited with code 3",
        "why:   rank 1 on node 1: killed by SIGKILL",
        "why:   node 0: torchrun: command not",
    ):
        assert line in text, text
    # NeMo-Run's own status prints only the state: the reason is printed with it.
    out = subprocess.run(
        [console_script("nemo"), "experiment", "status", exp_id],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "400"},
    )
    shown = " ".join((out.stdout + out.stderr).split())
    assert "failed: rank 3 on node 1: RuntimeError: step 7 got a bad batch" in shown, shown[-3000:]
    assert "failed: rank 1 on node 1: killed by SIGKILL" in shown
    assert "failed: rank 1 on node 1: exited with code 3" in shown


def test_status_of_an_unknown_experiment(nemo_kubeflow_cli):
    out = nemo_kubeflow_cli("status", "nosuch_123")
    assert out.returncode == 2 and "no experiment 'nosuch_123'" in out.stderr, out.stderr


@pytest.mark.parametrize(
    "source, setup, message",
    [
        ("env:NEMO_KF_EMPTY_TOKEN", "env", "secret_env_vars['TOKEN'] reads $NEMO_KF_EMPTY_TOKEN, which is empty"),
        ("file:{tmp}/token", "file", "secret_env_vars['TOKEN']: '{tmp}/token' is empty"),
    ],
)
def test_empty_secret_source_is_refused_before_anything_is_sent(local, tmp_path, monkeypatch, source, setup, message):
    monkeypatch.setenv("NEMO_KF_EMPTY_TOKEN", "")
    (tmp_path / "token").write_text("\n")
    local.clear_requests()
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=1,
        shm_size=None,
        kubeconfig=str(local.kubeconfig_path),
        secret_env_vars={"TOKEN": source.format(tmp=tmp_path)},
    )
    with pytest.raises(Exception, match=re.escape(message.format(tmp=tmp_path))):
        with run.Experiment("emptysecret", executor=executor, log_level="WARN") as exp:
            exp.add(run.Script(inline="echo $TOKEN"), name="emptysecret")
            exp.run(detach=True)
    assert not [r for r in local.requests if r.verb in ("create", "patch", "update", "delete")]


def describe_cost(local, app_id):
    """What one describe by a new scheduler (as `nemo experiment status` makes) sends for this job, from the
    local API server's request log: "verb resource" of each request, sorted. The log also has what other
    tests' log followers send; those name other jobs, and are left out."""
    name = app_id.split(":", 1)[1]
    local.clear_requests()
    desc = create_scheduler("cost").describe(app_id)
    mine = [
        r
        for r in local.requests
        if (r.name or "").startswith(name)
        or name in r.query.get("labelSelector", "")
        or (r.resource == "events" and r.verb == "list")
    ]
    return desc, sorted(f"{r.verb} {r.resource}" for r in mine)


def test_what_a_describe_costs_in_each_state(local):
    """The last column of status.py's table, counted over HTTP: pods and events are read once per describe,
    and only in the states that need them; a finished job costs its one GET."""
    _, done = submit(local, "costdone")
    local.wait_for(lambda: create_scheduler("t").describe(done).state == AppState.SUCCEEDED, timeout=60)
    desc, requests = describe_cost(local, done)
    assert desc.state == AppState.SUCCEEDED and requests == ["get trainjobs"], requests

    _, running = submit(local, "costrun", script="sleep 60")
    local.wait_for(lambda: create_scheduler("t").describe(running).state == AppState.RUNNING, timeout=60)
    desc, requests = describe_cost(local, running)
    assert desc.state == AppState.RUNNING and desc.msg == "", desc.msg  # no restart, no progress: nothing to add
    # Its JobSet and the pods that are not running (none: an empty list), never the running pods; no
    # trainerStatus in the TrainJob: node 0's pod by its metadata and its last lines, for a progress line
    # (observe/progress_view.py).
    assert requests == ["get jobsets", "get pods/log", "get trainjobs", "list pods", "list pods"], requests
    create_scheduler("t").cancel(running)

    _, pending = submit(local, "costpend", gpus_per_node=1)
    wait_for_message(pending, "cannot be scheduled")
    desc, requests = describe_cost(local, pending)
    # Its JobSet, the pods that started or ended, the first chunk of those not placed and of those starting
    # (``JobView.read_waiting``), the Warning events but the scheduler's.
    assert desc.state == AppState.PENDING and requests == [
        "get jobsets",
        "get trainjobs",
        "list events",
        "list pods",
        "list pods",
        "list pods",
    ], requests
    create_scheduler("t").cancel(pending)

    _, failed = submit(local, "costfail", script="exit 3")
    # The first describe of the failed job saves each node's log. "exited with code 3" shows first in a RUNNING
    # "failing: ..." look, while the Job controller still stops the other node: wait for the verdict itself.
    wait_for_status(
        create_scheduler("t"),
        failed,
        lambda d: d.state == AppState.FAILED and "exited with code 3" in d.msg,
        "FAILED, 'exited with code 3'",
        timeout=60,
    )
    desc, requests = describe_cost(local, failed)
    assert desc.state == AppState.FAILED and "no gang restart" in desc.msg, desc.msg
    # The TrainJob once (not again for its node count), its JobSet, the running pods' metadata and the others
    # in full (``JobView.read_failed``), the failed node's last lines.
    assert requests == ["get jobsets", "get pods/log", "get trainjobs", "list pods", "list pods"], requests


def test_following_many_nodes_uses_a_fixed_pool_and_delivers_each_line_once_in_order(local):
    # 10 nodes, more than LOG_READERS: lines printed over several reads, identical lines included (one
    # pipe read's lines share a timestamp: only their count tells copies from lines read again).
    from nemo_kubeflow.observe.log_follower import LOG_READERS

    script = 'for i in $(seq 1 300); do echo "line $i"; echo "same"; if [ $((i % 60)) = 0 ]; then sleep 0.4; fi; done'
    nodes = 10
    _, app_id = submit(local, "manynodes", script=script, nodes=nodes)
    scheduler = create_scheduler("t")
    received = {k: [] for k in range(nodes)}
    readers, done = [], threading.Event()

    def follow(k):  # NeMo-Run's way: a thread per node
        received[k].extend(scheduler.log_iter(app_id, "manynodes", k, should_tail=True))

    def sample():
        while not done.wait(0.05):
            # this job's readers only: an earlier test's may still be ending
            readers.append(sum(t.name.startswith(f"logs-{app_id.split(':', 1)[1]}-") for t in threading.enumerate()))

    threading.Thread(target=sample, daemon=True).start()
    threads = [threading.Thread(target=follow, args=(k,)) for k in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    expected = [line for i in range(1, 301) for line in (f"line {i}\n", "same\n")]
    for k in range(nodes):
        assert received[k] == expected, (k, len(received[k]), received[k][:5])
    assert 1 <= max(readers) <= LOG_READERS, readers


def test_a_second_reader_of_a_followed_node_gets_its_whole_log_once(local):
    script = 'for i in $(seq 1 40); do echo "step $i"; sleep 0.1; done'
    _, app_id = submit(local, "tworeaders", script=script)
    scheduler = create_scheduler("t")
    first, second = [], []
    expected = [f"step {i}\n" for i in range(1, 41)]

    def follow(into):
        into.extend(scheduler.log_iter(app_id, "tworeaders", 0, should_tail=True))

    early = threading.Thread(target=follow, args=(first,))
    early.start()
    deadline = time.monotonic() + 60
    while len(first) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 5 <= len(first) < 40, first  # joined while the node runs
    follow(second)
    early.join(60)
    assert first == expected and second == expected
    # Once the job is over, a new reader (a reconnect) reads it all again, once.
    assert list(scheduler.log_iter(app_id, "tworeaders", 0, should_tail=True)) == expected


def test_quiet_nodes_are_read_less_often_and_their_next_line_still_arrives(local):
    # A training step that prints rarely: reading each node every POLL_SECONDS would cost ~80 reads
    # over these 6 quiet seconds for 2 nodes; backing off to IDLE_POLL_MAX_SECONDS costs a few each.
    _, app_id = submit(local, "quiet", script='echo "start $PET_NODE_RANK"; sleep 6; echo "end $PET_NODE_RANK"')
    name = app_id.split(":", 1)[1]
    scheduler = create_scheduler("t")
    received = {k: [] for k in range(2)}
    threads = [
        threading.Thread(
            target=lambda k=k: received[k].extend(scheduler.log_iter(app_id, "quiet", k, should_tail=True))
        )
        for k in range(2)
    ]
    local.clear_requests()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert received == {k: [f"start {k}\n", f"end {k}\n"] for k in range(2)}, received
    reads = [r for r in local.requests if r.resource == "pods/log" and (r.name or "").startswith(name)]
    assert 2 <= len(reads) <= 30, len(reads)
