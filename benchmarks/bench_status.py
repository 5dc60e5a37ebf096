"""What status costs: one ``describe``, and ``exp.status()`` of many jobs (time, requests, growth)."""

from __future__ import annotations

import json
import os
import time

from harness import (Metric, in_fresh_process, launch, median, nemorun_home, ours, quick_task, quiet, stopwatch,
                     upstream)

NAME = "status"


def _sleeper():
    import nemo_run as run

    return run.Script(inline="sleep 60")


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.2)


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
    variants = {"ours": lambda: ours(kubeconfig), "baseline": upstream}
    small, large = (5, 20) if ctx.quick else (10, 100)

    # --- one describe: of a running job and of a finished one; in a fresh process ---------------
    gets, states, fresh = {}, {}, {}
    with nemorun_home():
        for name, make in variants.items():
            for when, task in (("running", _sleeper), ("finished", quick_task)):
                _, exp = launch(make(), 1, f"bench-describe-{name}", task=task)
                scheduler, backend, app_id = exp._runner._scheduler_app_id(exp.jobs[0].handle, check_session=False)
                if when == "running":
                    _wait_for(lambda: scheduler.describe(app_id).state.name in ("RUNNING", "FAILED", "SUCCEEDED"))
                else:
                    cluster.wait_finished()
                cluster.clear_requests()
                response = scheduler.describe(app_id)
                gets[name, when] = _gets(cluster.requests)
                states[name, when] = response.state.name if response else "None"
                if when == "finished":
                    fresh[name] = [in_fresh_process(_FRESH_DESCRIBE, backend=backend, app_id=app_id)["seconds"] * 1000
                                   for _ in range(1 if ctx.quick else ctx.repeats(heavy=True))]
                cluster.delete_trainjobs()
    for when in ("running", "finished"):
        yield Metric(f"GETs per describe of one {when} job", gets["ours", when], gets["baseline", when], "req",
                     at_most=1, note=f"state {states['ours', when]} ours, {states['baseline', when]} baseline")
    yield Metric("first describe in a fresh process (after import nemo_run)", median(fresh["ours"]),
                 median(fresh["baseline"]), "ms", note="what `nemo experiment status` pays per process")

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

    for tasks in (small, large):
        (mine, my_gets), (theirs, their_gets) = results["ours", tasks], results["baseline", tasks]
        yield Metric(f"exp.status() of {tasks} finished jobs", mine * 1000, theirs * 1000, "ms",
                     note=f"GETs per job: {my_gets / tasks:g} ours (NeMo-Run describes each job twice), "
                          f"{their_gets / tasks:g} baseline (its state file kept {kept['baseline', tasks]}/{tasks} "
                          "jobs: concurrent saves lose entries)")

    def growth(name):
        return (results[name, large][0] / large) / (results[name, small][0] / small)

    yield Metric(f"status time per job, {large} jobs vs {small} (1 = linear)", growth("ours"), growth("baseline"),
                 "x", at_most=1.5,
                 note="baseline rebuilds every stored executor (and reloads the kubeconfig) for each describe")
