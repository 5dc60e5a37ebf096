"""Following a job's logs (``JobLogFollower``) over HTTP on the local cluster: a job of at most
``LOG_READERS`` nodes is followed with one ``follow`` stream per node, a larger one by reads in turn;
either way every line arrives once, across streams the server closes, containers restarted in place
and gang restarts, with a
bounded number of threads and connections, all of them closed when nobody reads any more."""

import threading
from datetime import datetime

import nemo_run as run
import pytest
from polling import wait_for
from torchx.specs import parse_app_handle

from nemo_kubeflow import KubeflowExecutor, PVCMount
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe.log_follower import LOG_READERS


def submit(local, name, script, nodes=2, **kw):
    executor = KubeflowExecutor(
        container_image="python:3.11", nodes=nodes, shm_size=None, kubeconfig=str(local.kubeconfig_path), **kw
    )
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline=script), name=name)
        exp.run(detach=True)
    return parse_app_handle(exp.jobs[0].handle)[2]


def follow_all(app_id, role, nodes, received, during=None):
    """NeMo-Run's way: a thread per node reading ``log_iter(..., should_tail=True)`` to the job's end;
    ``during`` (if given) runs meanwhile in this thread. Returns the peak number of this job's reader threads (an
    earlier test's readers may still be ending: they are not this job's)."""
    scheduler = create_scheduler("t")
    prefix = f"logs-{app_id.split(':', 1)[1]}-"
    readers, done = [0], threading.Event()

    def follow(k):
        received[k].extend(scheduler.log_iter(app_id, role, k, should_tail=True))

    def sample():
        while not done.wait(0.05):
            readers[0] = max(readers[0], sum(t.name.startswith(prefix) for t in threading.enumerate()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=follow, args=(k,), daemon=True) for k in range(nodes)]
    for t in threads:
        t.start()
    if during is not None:
        during()
    for t in threads:
        t.join(180)
    done.set()
    assert not any(t.is_alive() for t in threads), "a follower did not finish"
    return readers[0]


def log_requests(local, job):
    return [r for r in local.requests if r.resource == "pods/log" and (r.name or "").startswith(job)]


def open_streams(local, job):
    return [s for s in local.log_streams() if s.startswith(f"default/{job}-")]


def no_reader_threads(job):
    return not [t for t in threading.enumerate() if t.name.startswith(f"logs-{job}-")]


# Lines over several seconds, identical ones included: one pipe read's lines share a timestamp, so
# only their count tells a line read again after a reconnect from a new one.
NUMBERED = 'for i in $(seq 1 {n}); do echo "line $i"; echo "same"; sleep 0.02; done'


def numbered(n):
    return [line for i in range(1, n + 1) for line in (f"line {i}\n", "same\n")]


def test_a_small_job_is_followed_with_a_stream_per_node_and_a_quiet_one_costs_no_reads(local):
    job = submit(local, "streamed", 'echo "start $PET_NODE_RANK"; sleep 5; echo "end $PET_NODE_RANK"')
    name = job.split(":", 1)[1]
    local.clear_requests()
    received = {k: [] for k in range(2)}
    follow_all(job, "streamed", 2, received)
    assert received == {k: [f"start {k}\n", f"end {k}\n"] for k in range(2)}, received
    for k in range(2):
        [pod] = [p for p in local.objects("pods", "default") if p["metadata"]["name"].startswith(f"{name}-node-0-{k}-")]
        finished = datetime.fromisoformat(
            pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"].replace("Z", "+00:00")
        )
        # While the node ran (its end known to the second), one request: the stream. Polling read it again
        # and again (every 0.15 s, backing off to 2 s while it printed nothing).
        while_running = [r for r in log_requests(local, pod["metadata"]["name"]) if r.time < finished.timestamp() - 1]
        assert [r.query.get("follow") for r in while_running] == ["true"], [r.query for r in while_running]
    local.wait_for(lambda: not open_streams(local, name) and no_reader_threads(name), timeout=10)


@pytest.mark.parametrize("abrupt", [True, False], ids=["dropped", "ended"])
def test_a_stream_the_server_closes_mid_job_loses_and_repeats_nothing(local, abrupt):
    lines = 400
    role = f"cut{int(abrupt)}"
    job = submit(local, role, NUMBERED.format(n=lines))
    name = job.split(":", 1)[1]
    received = {k: [] for k in range(2)}
    cuts = []

    def cut_streams_while_printing():
        # Three times, each once both nodes have streamed more lines: the server closes every stream.
        for want in (40, 250, 500):
            local.wait_for(lambda: min(len(r) for r in received.values()) >= want, timeout=120, interval=0.01)
            cuts.append(local.cut_log_streams(abrupt=abrupt))

    follow_all(job, role, 2, received, during=cut_streams_while_printing)
    for k in range(2):
        assert received[k] == numbered(lines), (k, len(received[k]))
    assert sum(cuts) >= 3, cuts  # streams were open to be cut, so the lines above crossed reconnects
    streams = [r for r in log_requests(local, name) if r.query.get("follow") == "true"]
    assert len(streams) >= 2 + sum(cuts), len(streams)
    # Each cut stream was resumed from the second of its last line, not read from the start again.
    assert sum("sinceTime" in r.query for r in streams) >= sum(cuts), [r.query for r in streams]


def test_a_nodes_new_pod_after_a_gang_restart_is_followed_with_a_stream(local):
    script = (
        "if [ ! -f /data/tried-$PET_NODE_RANK ]; then touch /data/tried-$PET_NODE_RANK; "
        'echo "attempt one"; sleep 2; exit 5; fi\n'
        'for i in $(seq 1 20); do echo "attempt two $i"; sleep 0.1; done'
    )
    claim = PVCMount(claim_name="restart-claim", mount_path="/data", create=True, size="1Gi")
    job = submit(local, "regang", script, retries=1, pvc_mounts=[claim])
    name = job.split(":", 1)[1]
    local.clear_requests()
    received = {k: [] for k in range(2)}
    follow_all(job, "regang", 2, received)
    for k in range(2):
        text = "".join(received[k])
        assert received[k][0] == "attempt one\n" and "(restart attempt 1)" in text, received[k]
        assert received[k][-20:] == [f"attempt two {i}\n" for i in range(1, 21)], received[k]
    followed = {r.name for r in log_requests(local, name) if r.query.get("follow") == "true"}
    pods = {
        p["metadata"]["name"]: p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"]
        for p in local.objects("pods", "default")
        if p["metadata"]["name"].startswith(name)
    }
    new = {pod for pod, attempt in pods.items() if attempt == "1"}
    assert len(new) == 2 and new <= followed, (new, followed)


@pytest.mark.parametrize("nodes", [LOG_READERS, LOG_READERS + 4])
def test_threads_and_streams_stay_within_the_reader_bound(local, nodes):
    lines = 150
    job = submit(local, f"bound{nodes}", NUMBERED.format(n=lines), nodes=nodes)
    name = job.split(":", 1)[1]
    local.clear_requests()
    received = {k: [] for k in range(nodes)}
    streams, done = [0], threading.Event()

    def sample():
        while not done.wait(0.02):
            streams[0] = max(streams[0], len(open_streams(local, name)))

    threading.Thread(target=sample, daemon=True).start()
    readers = follow_all(job, f"bound{nodes}", nodes, received)
    done.set()
    for k in range(nodes):
        assert received[k] == numbered(lines), (k, len(received[k]))
    assert 1 <= readers <= LOG_READERS and 1 <= streams[0] <= LOG_READERS, (readers, streams)
    followed = {r.name for r in log_requests(local, name) if r.query.get("follow") == "true"}
    if nodes <= LOG_READERS:
        assert len(followed) == nodes, followed  # every node streamed
    else:
        # Readers with two nodes read them in turn: those nodes are polled (tailLines) once both are followed.
        assert any("tailLines" in r.query for r in log_requests(local, name))
        # A job followed in rounds is looked at through a watch of its pods, not a list of every pod each second:
        # the follower's own lists (of the job's nodes) come only from its first subscribers, before it has more
        # nodes than readers; once its watch lists the job's pods, every look reads them from the watch.
        of_job = [r for r in local.requests if r.resource == "pods" and name in r.query.get("labelSelector", "")]
        watch_listed = [
            r.time for r in of_job if r.verb == "list" and "replicatedjob-name" not in r.query["labelSelector"]
        ]
        looks = [r.time for r in of_job if r.verb == "list" and "replicatedjob-name" in r.query["labelSelector"]]
        shown = sorted((round(r.time - of_job[0].time, 2), r.verb, r.query["labelSelector"]) for r in of_job)
        assert len(watch_listed) == 1 and any(r.verb == "watch" for r in of_job), shown
        assert 1 <= len(looks) <= LOG_READERS and max(looks) < watch_listed[0], shown
    local.wait_for(lambda: no_reader_threads(name), timeout=10)


def test_a_one_cpu_client_keeps_a_connection_for_every_stream(local, monkeypatch):
    # The kubernetes client keeps 5 connections per CPU: on one CPU, 8 streams would overflow its pool and
    # urllib3 would drop connections ("Connection pool is full"). Ours keeps enough for every reader.
    import logging
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "cpu_count", lambda: 1)
    job = submit(local, "onecpu", NUMBERED.format(n=100), nodes=LOG_READERS)
    received = {k: [] for k in range(LOG_READERS)}
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    pool_logger = logging.getLogger("urllib3.connectionpool")  # NeMo-Run's logging does not pass it to the root
    pool_logger.addHandler(handler)
    try:
        follow_all(job, "onecpu", LOG_READERS, received)
    finally:
        pool_logger.removeHandler(handler)
    assert all(received[k] == numbered(100) for k in range(LOG_READERS)), {k: len(v) for k, v in received.items()}
    assert not [w for w in warnings if "pool is full" in w], warnings


def test_readers_that_stop_reading_close_every_stream_and_thread(local):
    job = submit(local, "stopper", 'for i in $(seq 1 600); do echo "tick $i"; sleep 0.1; done')
    name = job.split(":", 1)[1]
    scheduler = create_scheduler("t")
    iterators = [scheduler.log_iter(job, "stopper", k, should_tail=True) for k in range(2)]
    firsts = [next(iter(it)) for it in iterators]
    assert firsts == ["tick 1\n", "tick 1\n"], firsts
    local.wait_for(lambda: len(open_streams(local, name)) == 2, timeout=30)
    for it in iterators:
        it.close()  # NeMo-Run's threads stop reading (Ctrl-C, the experiment's wait ends)
    # The container prints every 0.1 s: a stream whose client went away fails at the server's next write.
    local.wait_for(lambda: not open_streams(local, name) and no_reader_threads(name), timeout=10)
    scheduler.cancel(job)


def test_a_container_restarted_in_place_is_followed_on(local, tmp_path):
    # A runtime of one's own whose pods restart their container in place (restartPolicy OnFailure, as
    # JobSet's default): the stream of the first run ends with it, the second run's lines follow.
    import copy

    from nemo_kubeflow.cluster.client import KubernetesCluster
    from nemo_kubeflow.constants import CLUSTER_RUNTIME_KIND, TRAINJOB_KIND

    cluster = KubernetesCluster(str(local.kubeconfig_path))
    first = submit(local, "rendered", "echo hi", nodes=1)
    rendered = cluster.get(TRAINJOB_KIND, first.split(":", 1)[1], "default")["spec"]["runtimeRef"]["name"]
    runtime = copy.deepcopy(cluster.get(CLUSTER_RUNTIME_KIND, rendered))
    runtime["metadata"] = {"name": "restart-in-place"}
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][-1]["template"]["spec"]
    node.pop("podFailurePolicy", None)
    node["backoffLimit"] = 2  # the Job fails once its pods restarted this many times
    node["template"]["spec"]["restartPolicy"] = "OnFailure"
    runtime["spec"]["template"]["spec"].get("failurePolicy", {}).pop("rules", None)
    cluster.create(runtime)
    # The local cluster's pods are processes of this machine: a file of the test's tells the runs apart.
    marker = tmp_path / "ran"
    script = (
        f'if [ ! -f {marker} ]; then touch {marker}; echo "run one"; sleep 1; exit 3; fi\n'
        'for i in $(seq 1 10); do echo "run two $i"; sleep 0.1; done'
    )
    job = submit(local, "inplace", script, nodes=1, runtime_name="restart-in-place")
    name = job.split(":", 1)[1]
    local.clear_requests()
    received = {0: []}
    follow_all(job, "inplace", 1, received)
    assert received[0] == ["run one\n"] + [f"run two {i}\n" for i in range(1, 11)], received[0]
    [pod] = [p for p in local.objects("pods", "default") if p["metadata"]["name"].startswith(name)]
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 1  # the same pod: restarted in place
    assert any(r.query.get("follow") == "true" for r in log_requests(local, name))
    cluster.delete(CLUSTER_RUNTIME_KIND, "restart-in-place")


def test_the_logs_command_follows_every_node_of_every_task_with_nemo_runs_prefix(local, console_script):
    """`nemo-kubeflow logs EXP -f`, in its own process (no torch): every line of every node of each task
    once, after `<task>/<node>`; then, the jobs done, a plain read, one task chosen by name or index."""
    import subprocess

    executor = KubeflowExecutor(
        container_image="python:3.11", nodes=2, shm_size=None, kubeconfig=str(local.kubeconfig_path)
    )
    single = executor.clone()
    single.nodes = 1
    with run.Experiment("logscmd", executor=executor, log_level="WARN") as exp:
        exp.add(
            run.Script(inline='sleep 1; for i in 1 2 3; do echo "pair $PET_NODE_RANK $i"; sleep 0.2; done'), name="pair"
        )
        exp.add(run.Script(inline='sleep 1; echo "solo line"'), name="solo", executor=single)
        exp.run(detach=True, sequential=False)
        exp_id = exp._id
    tool = console_script("nemo-kubeflow")
    followed = subprocess.run([tool, "logs", exp_id, "--follow"], capture_output=True, text=True, timeout=120)
    assert followed.returncode == 0, followed.stderr
    lines = followed.stdout.splitlines()
    expected = [f"pair/{k} pair {k} {i}" for k in (0, 1) for i in (1, 2, 3)] + ["solo/0 solo line"]
    assert sorted(lines) == sorted(expected), followed.stdout
    # each node's lines in the order it printed them
    assert [line for line in lines if line.startswith("pair/1 ")] == [f"pair/1 pair 1 {i}" for i in (1, 2, 3)]

    for wanted in ("solo", "1"):
        read = subprocess.run([tool, "logs", exp_id, "--task", wanted], capture_output=True, text=True, timeout=120)
        assert read.returncode == 0, read.stderr
        assert read.stdout.splitlines() == ["solo/0 solo line"]
    wrong = subprocess.run([tool, "logs", exp_id, "--task", "train"], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == (
        "nemo-kubeflow: error: --task train: the experiment has no such task; its tasks: 0 (pair), 1 (solo)"
    )

    # The jobs cleaned up (a TTL, gc): the logs the follower kept next to each job, each line once.
    from nemo_kubeflow.cluster.client import KubernetesCluster
    from nemo_kubeflow.constants import TRAINJOB_KIND
    from nemo_kubeflow.observe.log_follower import node_selector

    cluster = KubernetesCluster(str(local.kubeconfig_path))
    names = [parse_app_handle(job.handle)[2].split(":", 1)[1] for job in exp.jobs]
    for name in names:
        cluster.delete(TRAINJOB_KIND, name, "default")
    wait_for(
        lambda: not any(cluster.list("Pod", "default", node_selector(name)) for name in names),
        timeout=60,
        what="the pods of both jobs to go",
    )
    kept = subprocess.run([tool, "logs", exp_id, "--task", "pair"], capture_output=True, text=True, timeout=120)
    assert kept.returncode == 0, kept.stderr
    job_dir = exp.jobs[0].executor.job_dir
    assert kept.stdout.splitlines() == [
        line
        for k in (0, 1)
        for line in (
            f"pair/{k} --- node {k} has no pod to read; the log kept in {job_dir}/logs/node-{k}.log:",
            *(f"pair/{k} pair {k} {i}" for i in (1, 2, 3)),
        )
    ]


def test_two_followers_of_a_node_keep_its_log_once(local):
    """The submitting run and `nemo-kubeflow logs -f` may follow the same node: one of them writes the
    node's log next to the job (a lock on the file), so it holds each line once."""
    from nemo_kubeflow.cluster import records
    from nemo_kubeflow.observe.kept_logs import node_log_path

    app_id = submit(local, "twice", NUMBERED.format(n=40), nodes=1)
    received = [{0: []}, {0: []}]
    others = threading.Thread(target=follow_all, args=(app_id, "twice", 1, received[1]), daemon=True)
    others.start()
    follow_all(app_id, "twice", 1, received[0])
    others.join(60)
    assert received[0][0] == received[1][0] == numbered(40)
    record = records.load(*records.parse_app_id(app_id))
    with open(node_log_path(record.job_dir, 0)) as f:
        assert f.readlines() == numbered(40)
