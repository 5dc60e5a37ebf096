"""The status of an experiment of many tasks, answered from one snapshot of it (cluster/experiment_snapshot.py):
the experiment's TrainJobs, JobSets and pods listed once each for the status queries of all its tasks, each
task's state and why the same as its own describe says, a failing task's reason still shown, and a list the
server refuses the look's error (never a state it could not read). Requests counted over HTTP by the local API
server."""

import collections
import json
import time

import nemo_run as run
import pytest
from backends import app_id_of, wait_for
from torchx.specs import AppState

from nemo_kubeflow.cluster import records
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.errors import PermissionDeniedError
from nemo_kubeflow.nemo_run.app_watch import AppWatch
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.nemo_run.status_answers import ANSWER_REUSE_S
from nemo_kubeflow.observe.job_view import NOT_RUNNING

#: Tasks of the experiment: sleepers that run, one that fails, one that succeeds.
SLEEPERS = 4


def _experiment(backend, title: str) -> list[str]:
    """An experiment of ``SLEEPERS`` running tasks, one failed and one succeeded (1 node each), once settled:
    its app ids, the failing task's last."""
    with run.Experiment(title, executor=backend.executor(nodes=1), log_level="WARN") as exp:
        for i in range(SLEEPERS):
            exp.add(run.Script(inline="sleep 300"), name=f"sleeper{i}")
        exp.add(run.Script(inline="echo done"), name="ok")
        exp.add(run.Script(inline='echo "boom on node $PET_NODE_RANK" >&2; exit 3'), name="fails")
        exp.run(detach=True)
    app_ids = [app_id_of(job) for job in exp.jobs]
    wanted = [AppState.RUNNING] * SLEEPERS + [AppState.SUCCEEDED, AppState.FAILED]
    wait_for(lambda: [_plain(a).state for a in app_ids] == wanted, "the tasks running, done and failed", timeout=240)
    time.sleep(ANSWER_REUSE_S)  # NeMo-Run's own status query at the launch is not answered again
    return app_ids


def _cancel(app_ids: list[str]) -> None:
    """Delete the tasks' TrainJobs (the sleepers would run on past the test)."""
    scheduler = create_scheduler("cancel")
    for app_id in app_ids:
        scheduler.cancel(app_id)


def _plain(app_id: str):
    """The look of one task on its own (its reads sent to the API server, no snapshot): today's describe."""
    namespace, name = records.parse_app_id(app_id)
    record = records.load(namespace, name)
    cluster = KubernetesCluster(kubeconfig=record.kubeconfig, context=record.context)
    return create_scheduler("plain").observe(app_id, cluster, record, AppWatch())


def _progress_not_read(experiment: str, app_id: str) -> str:
    """What a running task's status says of its progress when it is asked with the others of its experiment."""
    return (
        "progress not read from node logs for one of many tasks asked at once "
        f"(`nemo-kubeflow status {experiment} --task {app_id.split(':')[1]}` reads them)"
    )


def test_a_snapshot_answers_each_task_as_its_own_describe_does(backend):
    app_ids = _experiment(backend, "snapshot-same")
    assert all(records.load(*records.parse_app_id(a)).experiment for a in app_ids)
    scheduler = create_scheduler("status")
    try:
        from_snapshot = [scheduler.describe(a) for a in app_ids]
        plain = [_plain(a) for a in app_ids]
    finally:
        _cancel(app_ids)
    # The first task is read on its own; the other running ones read no node log (their progress: `--task`).
    experiment = records.load(*records.parse_app_id(app_ids[0])).experiment
    expected = [(plain[0].state, plain[0].message)] + [
        (
            p.state,
            "; ".join(filter(None, [p.message, _progress_not_read(experiment, a)]))
            if p.state == AppState.RUNNING
            else p.message,
        )
        for a, p in zip(app_ids[1:], plain[1:])
    ]
    assert [(d.state, d.msg) for d in from_snapshot] == expected
    failed = from_snapshot[-1]
    assert failed.state == AppState.FAILED and "exited with code 3" in failed.msg and "boom on node 0" in failed.msg, (
        failed
    )


@pytest.fixture(scope="module")
def local(local_cluster):
    return local_cluster


@pytest.fixture
def local_backend(local):
    from backends import Backend

    namespace = f"snap-{len(local.objects('namespaces'))}"
    local.create_namespace(namespace)
    made = Backend("local", str(local.kubeconfig_path), namespace, lambda resource: local.objects(resource, namespace))
    yield made
    made.clean_up()


def _requests_of_status(local, app_ids) -> tuple[collections.Counter, list]:
    """(verb, resource) -> requests of one status query of every task, by a fresh scheduler (a new process's), and
    the field selector of each list of pods, in order."""
    scheduler = create_scheduler("count")
    local.clear_requests()
    for app_id in app_ids:
        scheduler.describe(app_id)
    pod_lists = [r.query.get("fieldSelector") for r in local.requests if (r.verb, r.resource) == ("list", "pods")]
    return collections.Counter((r.verb, r.resource) for r in local.requests), pod_lists


def test_the_status_of_many_tasks_lists_each_kind_once(local, local_backend):
    app_ids = _experiment(local_backend, "snapshot-count")
    try:
        counts, pod_lists = _requests_of_status(local, app_ids)
    finally:
        _cancel(app_ids)
    # The first task read on its own (a status of one task costs what it did), then one list of each kind for the
    # others; what only some need (the failed task's events and node log, node 0's progress lines) is their own.
    assert counts[("list", "trainjobs")] == 1 and counts[("list", "jobsets")] == 1, counts
    assert counts[("get", "trainjobs")] == 1 and counts[("get", "jobsets")] == 1, counts
    # The first task's pods twice (those not running, node 0's metadata for its progress), then the snapshot's:
    # those not running for the running tasks' looks, every pod once the failed task's look asks for the others.
    assert pod_lists == [NOT_RUNNING, None, NOT_RUNNING, None], pod_lists
    # Node logs: the first task's (its progress) and the failed task's (why); none of the other running tasks.
    log_reads = counts[("get", "pods/log")]
    assert 1 <= log_reads <= 2 and sum(counts.values()) == 8 + log_reads, counts


def test_the_status_of_running_tasks_lists_only_their_pods_not_running(local, local_backend):
    """A sweep's tasks all running: the snapshot lists the pods not running (few), not every running pod, and
    each task's status is its own describe's."""
    with run.Experiment("snapshot-running", executor=local_backend.executor(nodes=1), log_level="WARN") as exp:
        for i in range(SLEEPERS):
            exp.add(run.Script(inline="sleep 300"), name=f"sleeper{i}")
        exp.run(detach=True)
    app_ids = [app_id_of(job) for job in exp.jobs]
    experiment = records.load(*records.parse_app_id(app_ids[0])).experiment
    try:
        wait_for(lambda: all(_plain(a).state == AppState.RUNNING for a in app_ids), "running", timeout=240)
        time.sleep(ANSWER_REUSE_S)
        counts, pod_lists = _requests_of_status(local, app_ids)
        from_snapshot = [create_scheduler("again").describe(a) for a in app_ids]
        plain = [_plain(a) for a in app_ids]
    finally:
        _cancel(app_ids)
    # The first task's own two lists, then the snapshot's one.
    assert pod_lists == [NOT_RUNNING, None, NOT_RUNNING], pod_lists
    assert counts[("list", "trainjobs")] == 1 and counts[("list", "jobsets")] == 1, counts
    assert [(d.state, d.msg) for d in from_snapshot[1:]] == [
        (AppState.RUNNING, "; ".join(filter(None, [p.message, _progress_not_read(experiment, a)])))
        for a, p in zip(app_ids[1:], plain[1:])
    ]


def test_nemo_runs_own_status_of_many_tasks_lists_each_kind_once(local, local_backend):
    """``nemo experiment status``'s query, in a process of its own: NeMo-Run's ``Experiment.status`` asks every task
    twice (its table, its dict) from a pool of threads, whose threads each made a scheduler of their own while torchx
    had none (the first import is slow): one round all the same (each second query answered as the first), one
    list of each kind."""
    import subprocess
    import sys

    app_ids = _experiment(local_backend, "snapshot-nemo-run")
    experiment = records.load(*records.parse_app_id(app_ids[0])).experiment
    query = (
        "import json\n"
        "from nemo_run.run.experiment import Experiment\n"
        f"found = Experiment.from_id({experiment!r}).status(return_dict=True)\n"
        "print(json.dumps({name: str(task['status']) for name, task in found.items()}))\n"
    )
    try:
        local.clear_requests()
        out = subprocess.run([sys.executable, "-c", query], capture_output=True, text=True, timeout=300)
        counts = collections.Counter(
            (r.verb, r.resource) for r in local.requests if r.namespace == local_backend.namespace
        )
    finally:
        _cancel(app_ids)
    assert out.returncode == 0, out.stderr[-3000:]
    states = sorted(json.loads(out.stdout.strip().splitlines()[-1]).values())
    assert states == sorted(["RUNNING"] * SLEEPERS + ["SUCCEEDED", "FAILED"]), states
    assert counts[("list", "trainjobs")] == 1 and counts[("list", "jobsets")] == 1, counts
    assert counts[("get", "trainjobs")] == 1 and counts[("get", "jobsets")] == 1, counts


def test_a_running_tasks_progress_is_read_when_it_is_asked_alone(local, local_backend, capsys):
    """`nemo-kubeflow status EXP` of tasks that report progress in their log lines (no ``trainerStatus``): the first
    task's progress shown, every other running task's status says its progress was not read and how to read it;
    `--task` (by the TrainJob's name, as that line names it) reads it."""
    import progress_workload
    from test_progress import PACKAGER

    from nemo_kubeflow import ConfigMapPackager
    from nemo_kubeflow.cli.main import main as cli_main

    executor = local_backend.executor(nodes=1, packager=ConfigMapPackager(**PACKAGER))
    with run.Experiment("snapshot-progress", executor=executor, log_level="WARN") as exp:
        for i in range(3):
            exp.add(run.Partial(progress_workload.train, steps=3000, seconds_per_step=0.1, interval=0), name=f"p{i}")
        exp.run(detach=True)
    app_ids = [app_id_of(job) for job in exp.jobs]
    try:
        wait_for(lambda: all("step" in _plain(a).message for a in app_ids), "every task's progress", timeout=240)
        capsys.readouterr()
        assert cli_main(["status", exp._id]) == 0
        out = capsys.readouterr().out
        assert out.count("why:   step ") == 1 and out.count("progress not read from node logs") == 2, out
        second = app_ids[1].split(":")[1]
        assert _progress_not_read(exp._id, app_ids[1]) in out, out
        time.sleep(ANSWER_REUSE_S)  # as another process would: not the same status query again (answered as was)
        assert cli_main(["status", exp._id, "--task", second]) == 0
        alone = capsys.readouterr().out
        assert f"Task 1: p1 (TrainJob {app_ids[1].replace(':', '/')})" in alone, alone
        assert "why:   step " in alone and "not read" not in alone and "Task 0" not in alone, alone
    finally:
        _cancel(app_ids)


def test_a_refused_list_is_the_looks_error(local, local_backend):
    app_ids = _experiment(local_backend, "snapshot-refused")
    local.deny("list", "trainjobs", local_backend.namespace)
    scheduler = create_scheduler("refused")
    try:
        assert scheduler.describe(app_ids[0]).state == AppState.RUNNING  # the first task: read on its own
        with pytest.raises(PermissionDeniedError, match="trainjobs"):
            scheduler.describe(app_ids[1])  # the second: the snapshot's list, refused
    finally:
        local.allow_all()
        _cancel(app_ids)


def test_a_refused_pod_list_is_the_looks_error(local, local_backend):
    """The snapshot's list of the pods refused: the look fails with the server's words about pods (not a state
    read without them)."""
    app_ids = _experiment(local_backend, "snapshot-pods-refused")
    local.deny("list", "pods", local_backend.namespace)
    local.clear_requests()
    scheduler = create_scheduler("pods-refused")
    try:
        with pytest.raises(PermissionDeniedError, match="pods"):
            scheduler.describe(app_ids[1])  # the first task read on its own: its pods' list refused
        with pytest.raises(PermissionDeniedError, match="pods"):
            scheduler.describe(app_ids[2])  # the next: the snapshot's, refused too
        pod_lists = [
            r.status_code
            for r in local.requests
            if r.verb == "list" and r.resource == "pods" and f"/namespaces/{local_backend.namespace}/" in r.path
        ]
        assert pod_lists and set(pod_lists) == {403}, pod_lists
    finally:
        local.allow_all()
        _cancel(app_ids)


#: What a status query of an experiment's tasks reads: the snapshot's lists and what is read per task.
SNAPSHOT_READS = {
    ("get", "trainjobs"),
    ("list", "trainjobs"),
    ("get", "jobsets"),
    ("list", "jobsets"),
    ("list", "pods"),
    ("list", "events"),
    ("get", "pods/log"),
    ("list", "workloads"),
}


def _status_requests(backend, counts, settled=lambda: True) -> dict:
    """The requests of one status query of an experiment of ``SLEEPERS`` running tasks, by a fresh scheduler."""
    with run.Experiment("snapshot-real", executor=backend.executor(nodes=1), log_level="WARN") as exp:
        for i in range(SLEEPERS):
            exp.add(run.Script(inline="sleep 300"), name=f"sleeper{i}")
        exp.run(detach=True)
    app_ids = [app_id_of(job) for job in exp.jobs]
    try:
        wait_for(lambda: all(_plain(a).state == AppState.RUNNING for a in app_ids), "running", timeout=240)
        wait_for(settled, "no other client's requests in the counts", timeout=180)
        before = counts()
        scheduler = create_scheduler("status")
        assert [scheduler.describe(a).state for a in app_ids] == [AppState.RUNNING] * SLEEPERS
        after = counts()
    finally:
        _cancel(app_ids)
    return {
        key: after.get(key, 0) - before.get(key, 0)
        for key in set(after) | set(before)
        if after.get(key, 0) - before.get(key, 0)
    }


@pytest.mark.real
def test_the_real_api_server_counts_the_snapshots_requests_as_the_local_one(
    real_control_plane, node_agent, real_namespace, local, local_backend
):
    from backends import Backend
    from test_apiload_real import _no_namespace_emptied, _real_counts

    def local_counts():
        return {
            (c.verb, c.resource): c.requests for c in local.api_counters() if (c.verb, c.resource) in SNAPSHOT_READS
        }

    emulated = _status_requests(local_backend, local_counts)
    real_backend = Backend(
        "real", str(real_control_plane.kubeconfig_path), real_namespace, lambda resource: [], made=[]
    )
    real = _status_requests(
        real_backend,
        lambda: _real_counts(real_control_plane, SNAPSHOT_READS),
        settled=lambda: _no_namespace_emptied(real_control_plane),
    )
    assert emulated[("list", "trainjobs")] == 1 and emulated[("list", "jobsets")] == 1, emulated
    for key in set(emulated) | set(real):
        mine, theirs = emulated.get(key, 0), real.get(key, 0)
        assert abs(theirs - mine) <= 0.2 * max(mine, theirs), (key, emulated, real)


def test_the_logs_of_many_running_tasks_are_followed_by_a_bounded_pool(local, local_backend, capsys):
    """`nemo-kubeflow logs EXP -f` of more running tasks than it follows at once: every line of every task once,
    at most ``FOLLOWED_AT_ONCE`` node logs followed at any time (its ``follow-*`` threads), and stderr says the
    others wait their turn."""
    import threading
    import time

    from nemo_kubeflow.cli.logs import FOLLOWED_AT_ONCE
    from nemo_kubeflow.cli.main import main as cli_main
    from nemo_kubeflow.observe.log_follower import LOG_READERS

    tasks = LOG_READERS + 2  # more than one follower reader each, all at once, would make
    script = 'sleep 10; for i in $(seq 1 20); do echo "line $i"; sleep 0.2; done'
    with run.Experiment("snapshot-logs", executor=local_backend.executor(nodes=1), log_level="WARN") as exp:
        for i in range(tasks):
            exp.add(run.Script(inline=script), name=f"t{i}")
        exp.run(detach=True)
    capsys.readouterr()
    returned: list[int] = []
    command = threading.Thread(target=lambda: returned.append(cli_main(["logs", exp._id, "--follow"])), daemon=True)
    command.start()
    following = 0
    while command.is_alive():
        following = max(following, sum(t.name.startswith("follow-") for t in threading.enumerate()))
        time.sleep(0.02)
    out, said = capsys.readouterr()
    expected = [f"t{t}/0 line {i}" for t in range(tasks) for i in range(1, 21)]
    assert returned == [0] and sorted(out.splitlines()) == sorted(expected), (returned, out)
    assert 1 <= following <= FOLLOWED_AT_ONCE, following
    assert f"following {FOLLOWED_AT_ONCE} of {tasks} node logs at once" in said, said


def test_a_round_of_status_queries_lasts_while_its_tasks_keep_being_asked(local, local_backend, monkeypatch):
    """A status of many tasks on a loaded machine may take longer than REUSE_S in all: the round (and its lists)
    lasts as long as its tasks keep being asked, each within REUSE_S of the one before."""
    from nemo_kubeflow.cluster import experiment_snapshot

    monkeypatch.setattr(experiment_snapshot, "REUSE_S", 2.0)
    app_ids = _experiment(local_backend, "snapshot-slow")
    scheduler = create_scheduler("slow")
    try:
        local.clear_requests()
        for app_id in app_ids:
            scheduler.describe(app_id)
            time.sleep(0.7)  # 6 tasks: 3.5 s in all, past REUSE_S
        lists = collections.Counter(r.resource for r in local.requests if r.verb == "list")
        assert lists["trainjobs"] == 1 and lists["jobsets"] == 1, lists
        time.sleep(2.5)  # then nothing asked for longer than REUSE_S: the next query starts a round, read afresh
        local.clear_requests()
        scheduler.describe(app_ids[1])
        scheduler.describe(app_ids[2])
        lists = collections.Counter(r.resource for r in local.requests if r.verb == "list")
        assert lists["trainjobs"] == 1, lists
    finally:
        _cancel(app_ids)
