"""The looks of every task of an experiment in one process read from one set of watches (``cluster/watched.py``:
the experiment's TrainJobs by its label, the namespace's JobSets and JobSet pods), counted at the HTTP level on a
local cluster of status-only pods: one watch of each kind whatever the task count, each look answered as a read
answers it, a broken watch sending the looks' reads to the API server, a write of this process read through for
its task only, each task's pod events told to its own listeners, and two experiments each with their own set."""

import threading

import nemo_run as run
import pytest
from polling import wait_for
from test_describe_reads_at_scale import status_only_cluster
from test_experiment_status import _plain
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow.config.executor import KubeflowExecutor
from nemo_kubeflow.constants import COMPLETION_INDEX_LABEL, EXPERIMENT_LABEL, JOBSET_NAME_LABEL
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

TASKS = 3


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    yield from status_only_cluster(tmp_path_factory, 2 * TASKS + 2)


def _experiment(local, title, tasks, namespace="default"):
    """An experiment of ``tasks`` 1-node tasks in ``namespace``, every pod running: its app ids."""
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=1,
        shm_size=None,
        kubeconfig=str(local.kubeconfig_path),
        namespace=namespace,
    )
    with run.Experiment(title, executor=executor, log_level="WARN") as exp:
        for i in range(tasks):
            exp.add(run.Script(inline="sleep 600"), name=f"{title}-{i}")
        exp.run(detach=True)
    app_ids = [parse_app_handle(job.handle)[2] for job in exp.jobs]
    names = {a.split(":")[-1] for a in app_ids}
    wait_for(
        lambda: (
            sum(
                p["status"].get("phase") == "Running"
                for p in local.objects("pods", namespace)
                if p["metadata"]["labels"].get(JOBSET_NAME_LABEL) in names
            )
            == tasks
        ),
        "every task's pod running",
        timeout=180,
    )
    return app_ids


def _name(app_id):
    return app_id.split(":")[-1]


def _watched(scheduler, app_ids):
    """Look at each task twice (watched from its second look), then wait for its watches to be current."""
    for _ in range(2):
        for app_id in app_ids:
            scheduler.look_after(app_id)
    caches = [scheduler._watches[a].job_cache for a in app_ids]
    wait_for(lambda: all(all(c.current().values()) for c in caches), "the watches current", timeout=30)
    return caches


def _reads(local, names, verbs=("get", "list")):
    """The requests about these jobs' TrainJobs, JobSets and pods by name or by selector."""
    return sorted(
        (r.verb, r.resource)
        for r in local.requests
        if r.verb in verbs
        and r.resource in ("trainjobs", "jobsets", "pods")
        and any(
            n in (r.name or "") + r.query.get("labelSelector", "") + r.query.get("fieldSelector", "") for n in names
        )
    )


def _done(scheduler, app_ids):
    """Stop the test's views (a set of watches ends with its last view: the process's cap counts sets) and its
    tasks."""
    for app_id in app_ids:
        watch = scheduler._watches.get(app_id)
        if watch is not None and watch.job_cache is not None:
            watch.job_cache.stop()
        create_scheduler("t").cancel(app_id)


def _watches(local):
    return sorted((r.resource, r.query.get("labelSelector", "")) for r in local.requests if r.verb == "watch")


def test_the_tasks_of_an_experiment_are_looked_at_through_one_set_of_watches(local):
    app_ids = _experiment(local, "wx-one", TASKS)
    names = [_name(a) for a in app_ids]
    scheduler = create_scheduler("wx-one")
    for app_id in app_ids:  # the first look of each reads (a job over is never watched)
        scheduler.look_after(app_id)
    local.clear_requests()
    caches = _watched(scheduler, app_ids)
    assert len({id(c._watches) for c in caches}) == 1  # one set for the experiment's tasks
    experiment = caches[0]._watches.experiment
    assert experiment and all(c._watches.experiment == experiment for c in caches)
    # One watch of each kind for the TASKS tasks (each opened once within its WATCH_SECONDS).
    assert _watches(local) == [
        ("jobsets", ""),
        ("pods", JOBSET_NAME_LABEL),
        ("trainjobs", f"{EXPERIMENT_LABEL}={experiment}"),
    ], _watches(local)

    local.clear_requests()
    looks = {a: [scheduler.look_after(a)[0] for _ in range(3)] for a in app_ids}
    assert _reads(local, names) == [], _reads(local, names)  # answered from the watches
    assert not [r for r in local.requests if r.verb == "list" and r.resource == "pods"]
    for app_id, answers in looks.items():
        direct = _plain(app_id)  # the task alone, read from the API server (a status of all reads no node log)
        assert {(d.state, d.msg) for d in answers} == {(direct.state, direct.message)}
        assert direct.state == AppState.RUNNING

    # A change of one task reaches its look, and only its: its pod fails, it fails; the others run on.
    local.end_pods(f"{JOBSET_NAME_LABEL}={names[1]},{COMPLETION_INDEX_LABEL}=0", 3)
    failed = wait_for(
        lambda: (d := scheduler.look_after(app_ids[1])[0]).state == AppState.FAILED and d,
        "the look to see the failure",
        timeout=60,
    )
    assert "exited with code 3" in failed.msg, failed.msg
    assert scheduler._watches[app_ids[1]].job_cache is None  # over: its view stopped
    assert scheduler.look_after(app_ids[0])[0].state == AppState.RUNNING
    assert caches[0].current()["Pod"] and caches[0]._watches.stopped is not None  # the others' set watches on
    _done(scheduler, app_ids)


def test_looks_at_tasks_found_over_start_no_watch_again(local):
    # Once an experiment's last running task ended, its set of watches stopped (its last view left). A later look
    # of an attached wait at a task it found over reads that task (one GET), as the first look did: it does not
    # start the experiment's watches again (three lists and three watches a look: at 1,000 ended tasks, minutes).
    app_ids = _experiment(local, "wx-over", TASKS)
    names = [_name(a) for a in app_ids]
    scheduler = create_scheduler("wx-over")
    for app_id in app_ids:
        scheduler.look_after(app_id)
    caches = _watched(scheduler, app_ids)
    for name in names:
        local.end_pods(f"{JOBSET_NAME_LABEL}={name}", 0)
    for app_id in app_ids:
        wait_for(lambda: scheduler.look_after(app_id)[0].state == AppState.SUCCEEDED, "the task over", timeout=60)
    wait_for(lambda: caches[0]._watches.stopped is None, "the experiment's watches stopped", timeout=30)
    local.clear_requests()
    looks = [scheduler.look_after(a)[0] for a in app_ids for _ in range(2)]
    assert {d.state for d in looks} == {AppState.SUCCEEDED}
    assert _reads(local, names) == [("get", "trainjobs")] * len(looks), _reads(local, names)
    assert _watches(local) == [] and all(scheduler._watches[a].job_cache is None for a in app_ids)


def test_the_first_look_at_a_task_whose_experiment_is_watched_reads_from_the_watches(local):
    # NeMo-Run's wait pool waits on a few tasks at a time, and on the next as one ends (a sweep's tasks admitted by
    # Kueue as others finish): the first look at that next task joins the experiment's watches, which hold it
    # already, instead of reading its TrainJob, JobSet and pods as a first look at a lone job does.
    app_ids = _experiment(local, "wx-join", TASKS)
    names = [_name(a) for a in app_ids]
    scheduler = create_scheduler("wx-join")
    caches = _watched(scheduler, app_ids[:-1])
    local.clear_requests()
    look = scheduler.look_after(app_ids[-1])[0]
    assert _reads(local, names) == [], _reads(local, names)
    assert scheduler._watches[app_ids[-1]].job_cache._watches is caches[0]._watches
    direct = _plain(app_ids[-1])
    assert (look.state, look.msg) == (direct.state, direct.message) and look.state == AppState.RUNNING
    # A lone job's first look still reads it (a job already over starts no watch).
    other = _experiment(local, "wx-lone", 1)[0]
    local.clear_requests()
    scheduler.look_after(other)
    assert ("get", "trainjobs") in _reads(local, [_name(other)]) and scheduler._watches[other].job_cache is None
    _done(scheduler, app_ids + [other])


def test_two_experiments_in_one_process_each_have_their_own_watches(local):
    first, second = _experiment(local, "wx-first", 2), _experiment(local, "wx-second", 2)
    scheduler = create_scheduler("wx-two")
    caches = _watched(scheduler, first + second)
    assert caches[0]._watches is caches[1]._watches and caches[2]._watches is caches[3]._watches
    assert caches[0]._watches is not caches[2]._watches
    selectors = {c._collections["TrainJob"].label_selector for c in caches}
    assert selectors == {f"{EXPERIMENT_LABEL}={c._watches.experiment}" for c in caches} and len(selectors) == 2
    # Each task's pod events reach its own listeners only (the node log keeper's: observe/kept_logs.py).
    told: dict[str, list[str]] = {_name(a): [] for a in first + second}
    listeners = {}

    def listener(name):
        return lambda kind, pod: told[name].append(pod["metadata"]["labels"][JOBSET_NAME_LABEL])

    for app_id, cache in zip(first + second, caches):
        listeners[app_id] = listener(_name(app_id))
        cache.on_pod_event(listeners[app_id])
    local.end_pods(f"{JOBSET_NAME_LABEL}={_name(second[1])},{COMPLETION_INDEX_LABEL}=0", 0)
    wait_for(lambda: told[_name(second[1])], "the pod's event told", timeout=30)
    assert set(told[_name(second[1])]) == {_name(second[1])}
    assert not any(told[n] for n in told if n != _name(second[1])), told
    for app_id, cache in zip(first + second, caches):
        cache.off_pod_event(listeners[app_id])
    _done(scheduler, first + second)


def test_a_broken_pod_watch_sends_the_looks_pod_reads_to_the_api_server(local):
    app_ids = _experiment(local, "wx-broken", 2)
    names = [_name(a) for a in app_ids]
    scheduler = create_scheduler("wx-broken")
    caches = _watched(scheduler, app_ids)
    broken = local.inject_fault(verb="watch", resource="pods", drop_connection=True, times=10**9)
    try:
        wait_for(lambda: not caches[0].current()["Pod"], "the pod watch broken", timeout=30)
        local.clear_requests()
        looks = [scheduler.look_after(a)[0] for a in app_ids]
        reads = _reads(local, names)
        assert ("list", "pods") in reads and ("get", "trainjobs") not in reads, reads
        assert all(c.sent_to_server["not listed yet, or its watch broke"] >= 1 for c in caches), [
            c.sent_to_server for c in caches
        ]
        for app_id, look in zip(app_ids, looks):
            direct = _plain(app_id)
            assert (look.state, look.msg) == (direct.state, direct.message) and look.state == AppState.RUNNING
    finally:
        broken.remove()
    wait_for(lambda: all(c.current()["Pod"] for c in caches), "the pod watch current again", timeout=60)
    local.clear_requests()
    for app_id in app_ids:
        scheduler.look_after(app_id)
    assert _reads(local, names) == [], _reads(local, names)
    _done(scheduler, app_ids)


def test_a_write_of_this_process_to_one_task_reads_that_task_from_the_api_server(local):
    app_ids = _experiment(local, "wx-wrote", 2)
    names = [_name(a) for a in app_ids]
    scheduler = create_scheduler("wx-wrote")
    caches = _watched(scheduler, app_ids)
    scheduler.cancel(app_ids[0])
    local.clear_requests()
    assert scheduler.look_after(app_ids[0])[0].state == AppState.CANCELLED
    assert ("get", "trainjobs") in _reads(local, [names[0]])  # not the watch's copy, which may predate the delete
    assert caches[0].sent_to_server["this process wrote to the job within 5 s"] >= 1, caches[0].sent_to_server
    local.clear_requests()
    assert scheduler.look_after(app_ids[1])[0].state == AppState.RUNNING
    assert _reads(local, [names[1]]) == []  # the other task's look still answers from the watches
    _done(scheduler, app_ids)


def test_a_wait_entered_on_one_scheduler_and_described_through_another_is_attached(local):
    """torchx's Runner makes its scheduler at first use without a lock: the threads of NeMo-Run's wait pool, starting
    together, may enter the wait on one instance and describe through another. The looks are still the wait's
    (repaired, watched from the second): not status queries, which would read every object on each look."""
    [app_id] = _experiment(local, "wx-race", 1)
    entered, described = create_scheduler("wx-race"), create_scheduler("wx-race")
    with entered.attached_wait():
        for _ in range(2):
            assert described.describe(app_id).state == AppState.RUNNING
    watch = described._watches[app_id]
    assert watch.looks_after == 2 and watch.job_cache is not None
    assert create_scheduler("t").describe(app_id).state == AppState.RUNNING  # outside a wait: a status query
    _done(described, [app_id])


def test_the_looks_of_a_wait_pool_at_once_ask_the_api_server_once_whether_it_answers(local):
    """NeMo-Run's attached wait looks at up to min(32, cores + 4) tasks at once: once the server has not been
    heard from for ANSWERED_WITHIN_S, the looks that come together send one GET of /version, not one each. In a
    namespace of its own (the other tests' tasks' events would answer for the server), asked as each look asks
    (``server_answers``) from as many threads at once."""
    local.create_namespace("wx-ping")
    app_ids = _experiment(local, "wx-ping", TASKS, namespace="wx-ping")
    scheduler = create_scheduler("wx-ping")
    for app_id in app_ids:
        scheduler.look_after(app_id)
    watches = _watched(scheduler, app_ids)[0]._watches
    local.clear_requests()
    # As after ANSWERED_WITHIN_S of a quiet cluster, set as the threads are let go (a watch event or a node log
    # keeper's read answers for the server too).
    start = threading.Barrier(2 * TASKS, action=lambda: setattr(watches, "answered_at", float("-inf")))
    answers = []

    def ask():
        start.wait()
        answers.append(watches.server_answers())

    threads = [threading.Thread(target=ask) for _ in range(2 * TASKS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert answers == [True] * (2 * TASKS)
    assert [r.path for r in local.requests if r.path == "/version"] == ["/version"], local.requests
    assert [scheduler.look_after(a)[0].state for a in app_ids] == [AppState.RUNNING] * TASKS
    assert _reads(local, [_name(a) for a in app_ids]) == []  # answered from the watches
    _done(scheduler, app_ids)
