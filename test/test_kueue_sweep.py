"""A sweep into one LocalQueue with room for a few of its tasks (issue 39, Kueue at sweep scale), on a local
cluster of status-only pods, counted at the HTTP level: each waiting task's status says Kueue's reason in
Kueue's words, the status of all the tasks lists the namespace's Workloads once, and as admitted tasks end the
queued ones are admitted and run, an attached wait following them to the end through watches."""

import collections
import copy
import re
import time
from concurrent.futures import ThreadPoolExecutor

import nemo_run as run
import pytest
from backends import Backend
from kubernetes.config import new_client_from_config
from kueue_api import serves_kueue_visibility
from polling import wait_for
from test_apiserver_metadata_and_counts import _raw
from test_describe_reads_at_scale import status_only_cluster
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow.cluster.watched import PLACES_EVERY_S
from nemo_kubeflow.config.executor import KubeflowExecutor
from nemo_kubeflow.constants import JOBSET_NAME_LABEL
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe.status import NOT_TRIED_YET

TASKS = 12
ROOM = 3  # one-node tasks of 1 CPU each, a ClusterQueue of 3 CPUs
QUEUE = "sweep"
#: Kueue's reason, in its words, for each task beyond the queue's room.
KUEUE_SAYS = (
    "Pending: couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor be-flavor, "
    "1 more needed"
)
#: A waiting task's status: its place where Kueue's visibility API tells it, then Kueue's reason.
QUEUED = re.compile(
    rf"waiting for queue {QUEUE} to admit it(?: \((\d+)(?:st|nd|rd|th) of (\d+) in LocalQueue {QUEUE}\))?: "
    + re.escape(KUEUE_SAYS)
)


def _place(message: str):
    """(place, of how many) a waiting task's status says; None for another status; (None, None) without one."""
    found = QUEUED.fullmatch(message)
    return found and (found[1] and int(found[1]), found[2] and int(found[2]))


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    yield from status_only_cluster(tmp_path_factory, ROOM + 1)


@pytest.fixture
def sweep_backend(local):
    namespace = f"sweep-{len(local.objects('namespaces'))}"
    local.create_namespace(namespace)
    made = Backend("local", str(local.kubeconfig_path), namespace, lambda resource: local.objects(resource, namespace))
    made.queue(QUEUE, {"clusterQueue": made.provide_cluster_queue(cpu=str(ROOM), memory="64Gi")})
    yield made
    made.clean_up()


_rounds = iter(range(10**6))


def _status(app_ids):
    """Each task's status, asked by a fresh scheduler (a new process's status round)."""
    scheduler = create_scheduler(f"sweep-status-{next(_rounds)}")
    return [scheduler.describe(a) for a in app_ids]


def _sweep(backend, urgent_class=None, urgent=0):
    """The sweep's tasks, launched: its app ids. The last ``urgent`` tasks in WorkloadPriorityClass
    ``urgent_class``."""
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=1,
        shm_size=None,
        namespace=backend.namespace,
        kubeconfig=backend.kubeconfig,
        queue_name=QUEUE,
        cpu_request="1",
        memory_request="1Gi",
    )
    with run.Experiment("kueue-sweep", executor=executor, log_level="WARN") as exp:
        for i in range(TASKS):
            chosen = executor
            if i >= TASKS - urgent:
                chosen = copy.deepcopy(executor)
                chosen.workload_priority_class = urgent_class
            exp.add(run.Script(inline="sleep 600"), name=f"point{i}", executor=chosen)
        exp.run(detach=True)
    return [parse_app_handle(job.handle)[2] for job in exp.jobs]


def _serves_places(backend) -> bool:
    """Whether the back end serves Kueue's visibility API (in its discovery), where a waiting task says its place."""
    return serves_kueue_visibility(new_client_from_config(config_file=backend.kubeconfig))


def _name(app_id):
    return app_id.split(":")[-1]


def test_a_sweep_into_a_queue_with_room_for_a_few_waits_with_kueues_reason_and_runs_to_the_end(
    local, sweep_backend, capsys
):
    namespace = sweep_backend.namespace
    app_ids = _sweep(sweep_backend)

    def settled():
        states = _status(app_ids)
        return (
            sum(d.state == AppState.RUNNING for d in states) == ROOM
            and sum(bool(_place(d.msg)) for d in states) == TASKS - ROOM
            and states
        )

    states = wait_for(settled, "3 tasks running, the others waiting with Kueue's reason", timeout=180)
    waiting = [d for d in states if _place(d.msg)]
    assert {d.state for d in waiting} == {AppState.PENDING}
    # Each waiting task's place in the LocalQueue, from Kueue's visibility API: 1st to 9th of 9.
    assert sorted(_place(d.msg) for d in waiting) == [(i, TASKS - ROOM) for i in range(1, TASKS - ROOM + 1)], [
        d.msg for d in waiting
    ]

    # One status round of every task: the namespace's Workloads listed once, never one read per task.
    scheduler = create_scheduler("sweep-count")
    local.clear_requests()
    for app_id in app_ids:
        scheduler.describe(app_id)
    counts = collections.Counter((r.verb, r.resource) for r in local.requests if r.resource == "workloads")
    # The first task is read on its own (as a status of one task): one more list when it is one of the queued.
    first_queued = bool(_place(states[0].msg))
    assert counts == {("list", "workloads"): 1 + first_queued}, counts
    places = [r for r in local.requests if r.path.endswith("/pendingworkloads")]
    assert len(places) == 1 + first_queued, places  # the places read once for the round (one LocalQueue)

    # The attached wait: every task looked after (its look then its repair) until each is over; the running
    # tasks end a few at a time, Kueue admits the queued ones, and they run and end in turn. The looks run in a
    # pool of worker threads, as NeMo-Run's wait makes them (and as only there, they say progress in its console).
    waiting = create_scheduler("sweep-wait")

    def attached_look(app_id):  # a worker's wait (torchx's Runner.wait) on one task, one look of it
        with waiting.attached_wait():
            return waiting.describe(app_id)

    capsys.readouterr()
    with waiting.attached_wait(), ThreadPoolExecutor(4) as pool:
        for _ in range(2):  # the first look of each reads; from the second the tasks are watched
            for app_id in app_ids:
                waiting.describe(app_id)
        caches = [waiting._watches[a].job_cache for a in app_ids]
        wait_for(lambda: all(all(c.current().values()) for c in caches), "the watches current", timeout=30)
        assert "Workload" in caches[0].current(), caches[0].current()  # a queued task's look watches them
        # A look's list of the Workloads gets its own TrainJob's (what it lists them for), not a copy of every one.
        owners = [w["metadata"]["ownerReferences"][0]["name"] for w in caches[0].list("Workload", namespace)]
        assert owners == [_name(app_ids[0])], owners
        workload_watch = caches[0]._watches.collections["Workload"]
        changes_before = workload_watch.changes
        ended, rounds, reads, messages = set(), [], [], collections.Counter()
        started = time.monotonic()
        while len(ended) < TASKS:
            local.clear_requests()
            going = [a for a in app_ids if a not in ended]
            looks = dict(zip(going, pool.map(attached_look, going)))
            reads.append(
                collections.Counter(
                    (r.verb, r.resource) for r in local.requests if r.verb in ("get", "list") and r.resource != "events"
                )
            )
            for app_id, desc in looks.items():
                assert desc.state in (AppState.PENDING, AppState.RUNNING, AppState.SUCCEEDED), (app_id, desc)
                if desc.state == AppState.PENDING:  # queued with Kueue's reason, or admitted and starting
                    assert not desc.msg.startswith("suspended"), desc.msg
                    messages["queued" if _place(desc.msg) else desc.msg.split(" (")[0]] += 1
                if desc.state == AppState.SUCCEEDED:
                    ended.add(app_id)
            running = [a for a, d in looks.items() if d.state == AppState.RUNNING]
            if running:
                rounds.append(len(running))
                for app_id in running:
                    local.end_pods(f"{JOBSET_NAME_LABEL}={_name(app_id)}", 0, namespace)
            assert len(reads) < 400, "the sweep did not end"
        elapsed = time.monotonic() - started
    assert len(rounds) >= TASKS // ROOM, rounds  # admitted a few at a time, as quota freed
    # Through watches: no look read a TrainJob by name (a GET per task per look), nor listed the Workloads (one
    # list per queued task per look before: 9, 8, 5, 4, 2, 2 in the rounds of this sweep).
    assert sum(c[("get", "trainjobs")] + c[("list", "workloads")] for c in reads) == 0, reads
    # The places: read again only when the watched Workloads changed, for the queue, not for each task, and at most
    # every PLACES_EVERY_S (the Workloads change many times in a few seconds as tasks end and the next are admitted).
    place_reads = sum(c[("get", "localqueues/pendingworkloads")] for c in reads)
    assert place_reads <= workload_watch.changes - changes_before and place_reads < messages["queued"], (
        place_reads,
        workload_watch.changes - changes_before,
        messages,
    )
    assert place_reads <= 1 + elapsed / PLACES_EVERY_S, (place_reads, elapsed)
    assert messages["queued"] > 0, messages
    # NeMo-Run's console: a waiting task's line is said once, not again each time the queue moved its place.
    console = re.sub(r"\[\d\d:\d\d:\d\d\]|scheduler\.py:\d+", " ", capsys.readouterr().out)
    console = " ".join(console.split())
    said = collections.Counter(
        re.findall(
            rf"(\S+) pending: waiting for queue {QUEUE} to admit it \(\d+(?:st|nd|rd|th) of \d+ in LocalQueue {QUEUE}\): "
            + re.escape(KUEUE_SAYS),
            console,
        )
    )
    assert said and max(said.values()) == 1, (said, console[-3000:])
    print("pending messages:", messages, "reads per attached-wait round:", reads)


def _pending(local, namespace, queue, version="v1beta2", query=()):
    """(HTTP status, body) of Kueue's visibility API's pending workloads of a LocalQueue."""
    path = f"/apis/visibility.kueue.x-k8s.io/{version}/namespaces/{namespace}/localqueues/{queue}/pendingworkloads"
    return _raw(local.api_client(), path, "application/json", query)


def test_the_local_cluster_serves_kueues_pending_workloads_with_their_places(local, sweep_backend):
    """Kueue's visibility API emulated: a LocalQueue's waiting Workloads, the highest priority first then the
    oldest, each with its place (from 0) in the LocalQueue and the ClusterQueue; an unknown queue is a 404."""
    namespace = sweep_backend.namespace
    urgent_class = sweep_backend.provide_priority_class("urgent", 100)
    app_ids = _sweep(sweep_backend, urgent_class, urgent=2)  # the last two, submitted last, waiting first
    try:
        wait_for(
            lambda: sum(bool(_place(d.msg)) for d in _status(app_ids)) == TASKS - ROOM,
            "the tasks beyond the queue's room waiting",
            timeout=180,
        )
        status, summary = _pending(local, namespace, QUEUE)
        assert status == 200 and summary["kind"] == "PendingWorkloadsSummary", (status, summary)
        assert summary["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta2"
        items = summary["items"]
        waiting = {
            w["metadata"]["name"]
            for w in local.objects("workloads", namespace)
            if not any(c["type"] == "QuotaReserved" and c["status"] == "True" for c in w["status"]["conditions"])
        }
        assert {i["metadata"]["name"] for i in items} == waiting and len(items) == TASKS - ROOM
        assert [i["positionInLocalQueue"] for i in items] == list(range(TASKS - ROOM))
        assert [i["positionInClusterQueue"] for i in items] == list(range(TASKS - ROOM))  # the only LocalQueue
        assert {i["localQueueName"] for i in items} == {QUEUE}
        # Kueue's order: the highest priority first, then the oldest (the urgent tasks, submitted last, are admitted
        # first when Kueue sees them together with the others, else wait at the head of the queue).
        order = [(-i["priority"], i["metadata"]["creationTimestamp"]) for i in items]
        assert order == sorted(order), order
        urgent_waiting = sum(i["priority"] == 100 for i in items)
        assert [i["priority"] for i in items[:urgent_waiting]] == [100] * urgent_waiting
        owners = [i["metadata"]["ownerReferences"][0]["name"] for i in items]
        assert set(owners) <= {_name(a) for a in app_ids}

        _, page = _pending(local, namespace, QUEUE, "v1beta1", [("offset", "2"), ("limit", "3")])
        assert [i["positionInLocalQueue"] for i in page["items"]] == [2, 3, 4], page
        status, missing = _pending(local, namespace, "no-such-queue")
        assert status == 404 and missing["message"].endswith('"no-such-queue" not found'), missing

        # Refused (RBAC), not served, failing: each waiting task's status says Kueue's reason only, no place.
        only_reason = f"waiting for queue {QUEUE} to admit it: {KUEUE_SAYS}"
        local.deny("get", "localqueues/pendingworkloads", namespace)
        try:
            assert sum(d.msg == only_reason for d in _status(app_ids)) == TASKS - ROOM
        finally:
            local.allow_all()
        for code, reason in ((404, "NotFound"), (500, "InternalError")):
            fault = local.inject_fault(resource="localqueues/pendingworkloads", status=code, reason=reason, times=100)
            try:
                assert sum(d.msg == only_reason for d in _status(app_ids)) == TASKS - ROOM, code
            finally:
                fault.remove()
    finally:
        for app_id in app_ids:
            create_scheduler("t").cancel(app_id)


def test_on_both_back_ends_a_small_sweep_waits_in_kueues_words_and_an_attached_wait_follows_it_to_the_end(
    backend, tmp_path
):
    """The small case on both back ends (the real one runs Kueue v0.19.2 with its visibility API behind
    kube-apiserver's aggregator):
        3 tasks into a queue with room for 1, each waiting task's status in Kueue's words; the attached wait follows
        the queued ones through their admission to the end."""
    tasks, queue = 3, "sweep-small"
    backend.queue(queue, {"clusterQueue": backend.provide_cluster_queue(cpu="1", memory="4Gi")})
    marker = tmp_path / "go"  # the pods run on this machine: a file lets the tasks end
    executor = backend.executor(nodes=1, queue_name=queue, cpu_request="1", memory_request="1Gi")
    with run.Experiment("kueue-small", executor=executor, log_level="WARN") as exp:
        for i in range(tasks):
            exp.add(run.Script(inline=f"until [ -e {marker} ]; do sleep 0.2; done"), name=f"p{i}")
        exp.run(detach=True)
    app_ids = [parse_app_handle(job.handle)[2] for job in exp.jobs]
    # Kueue's reason where it gave one: the real Kueue (BestEffortFIFO) writes it on the Workloads it tried, not
    # on one behind them it has not tried yet (that task's status then says its place, or that Kueue has not).
    reason = "Pending: couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor be-flavor"
    waiting_says = re.compile(
        rf"waiting for queue {queue} to admit it(?: \((\d)(?:st|nd) of 2 in LocalQueue {queue}\))?"
        + rf"(?:(: {re.escape(reason)}, 1 more needed)|: {NOT_TRIED_YET})?"
    )
    last = []
    try:
        states = wait_for(
            lambda: (
                (found := _status(app_ids))
                and not last.append([(d.state, d.msg) for d in found])
                and sum(d.state == AppState.RUNNING for d in found) == 1
                and sum(bool(waiting_says.fullmatch(d.msg)) for d in found) == tasks - 1
                and any((m := waiting_says.fullmatch(d.msg)) and m[2] for d in found)
                and found
            ),
            "one task running, the others waiting with Kueue's reason",
            timeout=150,
        )
    except AssertionError:
        raise AssertionError(f"the tasks' last statuses: {last[-1:]}") from None
    finally:
        marker.write_text("")
    places = sorted(waiting_says.fullmatch(d.msg)[1] or "" for d in states if waiting_says.fullmatch(d.msg))
    # The place where the back end serves Kueue's visibility API (its discovery says: the local cluster, and the real
    # stage where kube-apiserver's aggregator reaches Kueue's visibility server), none where not.
    assert places == (["1", "2"] if _serves_places(backend) else ["", ""]), places

    waiting = create_scheduler("sweep-small-wait")
    seen = collections.Counter()
    with waiting.attached_wait():
        done = wait_for(
            lambda: (
                (looks := [waiting.describe(a) for a in app_ids])
                and not seen.update(d.msg.split(" (")[0].split(":")[0] for d in looks if d.state == AppState.PENDING)
                and all(d.state == AppState.SUCCEEDED for d in looks)
                and looks
            ),
            "every task admitted in turn and succeeded",
            timeout=300,
        )
    assert [d.state for d in done] == [AppState.SUCCEEDED] * tasks
    assert not [m for m in seen if m.startswith("suspended")], seen


def test_on_both_back_ends_a_task_kueue_has_not_tried_yet_still_says_its_place(backend, tmp_path):
    """In a StrictFIFO ClusterQueue with room for one task, Kueue tries only the head of the queue: a task of lower
    priority submitted behind a head Kueue could not admit is never tried, and the real Kueue writes no reason on its
    Workload. Where the back end serves Kueue's visibility API, that task's status still says its place (no waiting
    task's status is only `waiting`); where not, it says only that it waits."""
    queue = "sweep-strict"
    cluster_queue = backend.provide_cluster_queue(cpu="1", memory="4Gi")
    backend.custom_objects().patch_cluster_custom_object(
        "kueue.x-k8s.io",
        backend.kueue_version(),
        "clusterqueues",
        cluster_queue,
        {"spec": {"queueingStrategy": "StrictFIFO"}},
    )
    backend.queue(queue, {"clusterQueue": cluster_queue})
    marker = tmp_path / "go"
    script = run.Script(inline=f"until [ -e {marker} ]; do sleep 0.2; done")
    high = backend.executor(nodes=1, queue_name=queue, cpu_request="1", memory_request="1Gi")
    high.workload_priority_class = backend.provide_priority_class("high", 100)
    reason = (
        "Pending: couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor be-flavor, "
        "1 more needed"
    )
    waiting_says = re.compile(
        rf"waiting for queue {queue} to admit it(?: \((\d)(?:st|nd) of (\d) in LocalQueue {queue}\))?(: .*)?"
    )
    served = _serves_places(backend)
    app_ids, last = [], []

    def statuses(wanted: int, what: str):
        """Each task's status once one runs and the others wait, the head with Kueue's reason."""
        try:
            return wait_for(
                lambda: (
                    (found := _status(app_ids))
                    and not last.append([(d.state, d.msg) for d in found])
                    and sum(d.state == AppState.RUNNING for d in found) == 1
                    and sum(bool(waiting_says.fullmatch(d.msg)) for d in found) == wanted
                    and any(d.msg.endswith(f": {reason}") for d in found)
                    and found
                ),
                what,
                timeout=150,
            )
        except AssertionError:
            raise AssertionError(f"the tasks' last statuses: {last[-1:]}") from None

    try:
        with run.Experiment("kueue-strict", executor=high, log_level="WARN") as exp:
            for i in range(2):
                exp.add(script, name=f"s{i}")
            exp.run(detach=True)
        app_ids += [parse_app_handle(job.handle)[2] for job in exp.jobs]
        statuses(1, "one task running, the other at the head of the queue with Kueue's reason")
        low = backend.executor(nodes=1, queue_name=queue, cpu_request="1", memory_request="1Gi")
        with run.Experiment("kueue-strict-low", executor=low, log_level="WARN") as exp:
            exp.add(script, name="behind")
            exp.run(detach=True)
        app_ids.append(parse_app_handle(exp.jobs[0].handle)[2])
        # The task behind the head: its place where served, and whatever Kueue said of it (nothing on the real
        # back end: its Workload has no QuotaReserved condition, Kueue never tried it).
        behind = wait_for(
            lambda: (
                (found := statuses(2, "the task behind the head waiting too")[2])
                and (not served or waiting_says.fullmatch(found.msg)[1])
                and found
            ),
            "the task behind the head with its place",
        )
        head = next(d for d in _status(app_ids[:2]) if d.state == AppState.PENDING)
        place = f" (1st of 2 in LocalQueue {queue})" if served else ""
        assert head.msg == f"waiting for queue {queue} to admit it{place}: {reason}", head.msg
        workload = next(
            w for w in backend.objects("workloads") if w["metadata"]["ownerReferences"][0]["name"] == _name(app_ids[2])
        )
        conditions = {c["type"]: c for c in (workload.get("status") or {}).get("conditions", [])}
        place = f" (2nd of 2 in LocalQueue {queue})" if served else ""
        if backend.name == "real":
            assert "QuotaReserved" not in conditions, conditions  # never tried
            untried = "" if served else f": {NOT_TRIED_YET}"  # its place, or that Kueue has not tried it
            assert behind.msg == f"waiting for queue {queue} to admit it{place}{untried}", behind.msg
        else:  # the local emulation writes Kueue's reason on every waiting Workload
            assert behind.msg == f"waiting for queue {queue} to admit it{place}: {reason}", behind.msg
    finally:
        marker.write_text("")
        for app_id in app_ids:
            create_scheduler("t").cancel(app_id)
