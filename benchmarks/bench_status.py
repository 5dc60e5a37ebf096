"""What status costs: one ``describe`` in each state, and ``exp.status()`` of many jobs (time, requests, growth)."""

from __future__ import annotations

import json
import os
import time

from harness import Metric, in_fresh_process, launch, median, nemorun_home, ours, quick_task, quiet, stopwatch, upstream
from torchx.schedulers import get_scheduler_factories

NAME = "status"
#: Jobs of the largest ``exp.status()`` (full run only).
MANY = 500


def _sleeper():
    import nemo_run as run

    return run.Script(inline="sleep 60")


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.2)


def _log_keeping(request) -> bool:
    """A request of the waiting process's log keeper (``kept_logs.NodeLogKeeper``, through the job's log follower and
    watches: its streams and its timestamped log reads, of this job or of the one before), not of the describe
    being counted: the keeper runs in threads of its own. (A list of one node's pod is the describe's own: node 0's,
    for its progress line.)"""
    return request.verb == "watch" or request.query.get("follow") == "true" or request.query.get("timestamps") == "true"


def _failing():
    import nemo_run as run

    return run.Script(inline="exit 3")


_FRESH_DESCRIBE = """
from torchx.schedulers import get_scheduler_factories
with harness.stopwatch() as t:
    get_scheduler_factories()[backend]("fresh").describe(app_id)
print(json.dumps({"seconds": t[0]}))
"""


def _baseline_records(home: str) -> int:
    """Jobs in the baseline's ``.kubeflow_jobs.json`` (read-modify-write without a lock)."""
    path = os.path.join(home, ".kubeflow_jobs.json")
    try:
        with open(path) as f:
            return len(json.load(f))
    except (OSError, ValueError):
        return 0


def _gets(requests) -> int:
    return sum(1 for r in requests if r.method == "GET")


def run(ctx):
    cluster = ctx.cluster
    kubeconfig = cluster.kubeconfig_path
    variants = {"ours": lambda **overrides: ours(kubeconfig, **overrides), "baseline": upstream}
    small, large = (5, 20) if ctx.quick else (10, 100)

    # --- one describe in each state: running, pending, failed, finished; in a fresh process --------------
    # What each reads is the last column of status.py's table: the TrainJob always; its JobSet and the pods not
    # running when running; the pods once when waiting or failed; Warning events when waiting (or after a gang restart); the failed node's
    # last lines when failed (the first describe of a failed job also saves each node's log: not counted).
    states = (
        ("running", _sleeper, {}),
        ("pending", quick_task, {"gpus_per_node": 1}),
        ("failed", _failing, {}),
        ("finished", quick_task, {}),
    )
    requests, kinds, shown, fresh = {}, {}, {}, {}
    with nemorun_home():
        for name, make in variants.items():
            for when, task, overrides in states:
                if overrides and name == "baseline":
                    continue  # a GPU request the local cluster cannot place: ours only
                _, exp = launch(make(**overrides) if overrides else make(), 1, f"bench-describe-{name}", task=task)
                scheduler, backend, app_id = exp._runner._scheduler_app_id(exp.jobs[0].handle, check_session=False)
                if when == "running":
                    _wait_for(lambda: scheduler.describe(app_id).state.name in ("RUNNING", "FAILED", "SUCCEEDED"))
                elif when == "pending":
                    _wait_for(lambda: "cannot be scheduled" in (scheduler.describe(app_id).msg or ""))
                else:
                    cluster.wait_finished()
                    if hasattr(scheduler, "look_after"):  # ours: a failed job's first repair step saves the node logs
                        scheduler.look_after(app_id)
                # Counted: one describe by a new scheduler, as `nemo experiment status` makes it; the waiting
                # one's log keeper (threads of its own, reading logs and the TrainJob) is stopped first.
                for watch in getattr(scheduler, "_watches", {}).values():  # NeMo-Run's own scheduler has none
                    if watch.keeper is not None:
                        watch.keeper.stop()
                time.sleep(1.0)
                counted = get_scheduler_factories()[backend]("counted")
                cluster.clear_requests()
                response = counted.describe(app_id)
                requests[name, when] = [r for r in cluster.requests if not _log_keeping(r)]
                kinds[name, when] = ", ".join(sorted(f"{r.verb} {r.resource}" for r in requests[name, when]))
                shown[name, when] = response.state.name if response else "None"
                if when == "finished":
                    fresh[name] = [
                        in_fresh_process(_FRESH_DESCRIBE, backend=backend, app_id=app_id)["seconds"] * 1000
                        for _ in range(1 if ctx.quick else ctx.repeats(heavy=True))
                    ]
                cluster.delete_trainjobs()
    for when, most in (("running", 3), ("pending", 3), ("failed", 3), ("finished", 1)):
        theirs = requests.get(("baseline", when))
        yield Metric(
            f"requests per describe of one {when} job",
            len(requests["ours", when]),
            len(theirs) if theirs is not None else None,
            "req",
            at_most=most,
            note=f"state {shown['ours', when]}: {kinds['ours', when]}"
            + (
                f"; baseline {shown['baseline', when]}: {kinds['baseline', when]}"
                if theirs is not None
                else "; baseline: not run (GPU request)"
            ),
        )
    yield Metric(
        "first describe in a fresh process (after import nemo_run)",
        median(fresh["ours"]),
        median(fresh["baseline"]),
        "ms",
        note="what `nemo experiment status` pays per process",
    )

    # --- one describe of a job of N nodes: the same requests whatever N -----------------------------
    sizes = (8, 32) if ctx.quick else (8, 32, 128)
    with nemorun_home():
        for nodes in sizes:
            _, exp = launch(ours(kubeconfig, nodes=nodes), 1, f"bench-describe-{nodes}")
            scheduler, _, app_id = exp._runner._scheduler_app_id(exp.jobs[0].handle, check_session=False)
            cluster.wait_finished(timeout=300)
            cluster.clear_requests()
            with stopwatch() as t:
                response = scheduler.describe(app_id)
            yield Metric(
                f"describe of one finished job of {nodes} nodes",
                t[0] * 1000,
                None,
                "ms",
                note=f"{_gets(cluster.requests)} GET(s); state {response.state.name}",
            )
            cluster.delete_trainjobs(timeout=120)

    # --- exp.status() of many jobs --------------------------------------------------------
    results, kept = {}, {}
    for tasks in (small, large):
        for name, make in variants.items():
            with nemorun_home() as home:
                _, exp = launch(make(), tasks, f"bench-status-{name}")
                cluster.wait_finished()  # a defined state: every job done
                cluster.clear_requests()

                def status(exp=exp):
                    with quiet(), stopwatch() as t:
                        exp.status(return_dict=True)
                    return t[0]

                first = status()
                requests = cluster.requests
                # The baseline's status is quadratic: one run of it at 100 jobs takes long enough.
                runs = 1 if name == "baseline" and tasks >= 100 else ctx.repeats(heavy=True)
                seconds = [first] + [status() for _ in range(runs - 1)]
                results[name, tasks] = (median(seconds), _gets(requests))
                kept[name, tasks] = _baseline_records(home)
            cluster.delete_trainjobs()

    if not ctx.quick:
        # At 500 jobs, ours only: the baseline's quadratic status would take most of an hour.
        with nemorun_home():
            _, exp = launch(ours(kubeconfig), MANY, "bench-status-many")
            cluster.wait_finished(timeout=600)
            cluster.clear_requests()
            with quiet(), stopwatch() as t:
                exp.status(return_dict=True)
            results["ours", MANY] = (t[0], _gets(cluster.requests))
        cluster.delete_trainjobs(timeout=300)
        yield Metric(
            f"exp.status() of {MANY} finished jobs",
            t[0] * 1000,
            None,
            "ms",
            note=f"GETs per job: {results['ours', MANY][1] / MANY:g}; baseline not run at this size",
        )
        yield Metric(
            f"status time per job, {MANY} jobs vs {small} (1 = linear)",
            (t[0] / MANY) / (results["ours", small][0] / small),
            None,
            "x",
            at_most=1.5,
        )

    for tasks in (small, large):
        (mine, my_gets), (theirs, their_gets) = results["ours", tasks], results["baseline", tasks]
        yield Metric(
            f"exp.status() of {tasks} finished jobs",
            mine * 1000,
            theirs * 1000,
            "ms",
            note=f"GETs per job: {my_gets / tasks:g} ours (NeMo-Run describes each job twice), "
            f"{their_gets / tasks:g} baseline (its state file kept {kept['baseline', tasks]}/{tasks} "
            "jobs: concurrent saves lose entries)",
        )

    def growth(name):
        return (results[name, large][0] / large) / (results[name, small][0] / small)

    yield Metric(
        f"status time per job, {large} jobs vs {small} (1 = linear)",
        growth("ours"),
        growth("baseline"),
        "x",
        at_most=1.5,
        note="baseline rebuilds every stored executor (and reloads the kubeconfig) for each describe",
    )
