"""Requests per submitted task, and runtime reuse across identical tasks.

Counted from the local API server's request log, so nothing the client does is missed.
"""

from __future__ import annotations

from collections import Counter

from harness import NAMESPACE, UPSTREAM_RUNTIME, Detail, Metric, TaskSubmitter, launch, nemorun_home, ours, upstream

NAME = "requests"
RUNTIMES = "clustertrainingruntimes"
#: What a process's first submission to a namespace reads before writing (cluster/admission.py): the namespace
#: (its Pod Security level), its LimitRanges and ResourceQuotas; later tasks of the experiment reuse them.
ADMISSION_READS = 3


def _requests_per_task(ctx, executor, tasks: int = 1) -> list[list]:
    """The requests of each of ``tasks`` tasks submitted one after the other by one scheduler
    (as the tasks of one experiment are)."""
    cluster = ctx.cluster
    out = []
    with nemorun_home() as home:
        submitter = TaskSubmitter(executor, home)
        for _ in range(tasks):
            app, prepared = submitter.prepare()
            cluster.clear_requests()
            submitter.submit(app, prepared)
            out.append(cluster.requests)
    return out


def _describe(requests) -> str:
    return ", ".join(f"{r.method} {r.resource} {r.status_code}" for r in requests)


def _delete_our_runtimes(ctx) -> None:
    from kubernetes import client

    api = client.CustomObjectsApi(ctx.cluster.api)
    for runtime in ctx.cluster.objects(RUNTIMES):
        if runtime["metadata"]["name"] != UPSTREAM_RUNTIME:
            api.delete_cluster_custom_object("trainer.kubeflow.org", "v1alpha1", RUNTIMES, runtime["metadata"]["name"])


def run(ctx):
    cluster = ctx.cluster
    cluster.delete_trainjobs()
    _delete_our_runtimes(ctx)

    # 1. Requests per task: the first task creates the runtime; a task of another process finds it (409);
    #    the next task of the same process (experiment) does not send it again.
    [first] = _requests_per_task(ctx, ours(cluster.kubeconfig_path))
    again, known = _requests_per_task(ctx, ours(cluster.kubeconfig_path), tasks=2)
    [base] = _requests_per_task(ctx, upstream())
    yield Metric(
        "requests per task, ships code (first: creates runtime)",
        len(first),
        len(base),
        "req",
        at_most=4 + ADMISSION_READS,
        note=f"baseline ships no code; {ADMISSION_READS} reads of what the namespace admits, before writing",
    )
    yield Metric(
        "requests per task, ships code (runtime exists: 409)",
        len(again),
        len(base),
        "req",
        at_most=4 + ADMISSION_READS,
        note=f"first task of another process; {ADMISSION_READS} reads of what the namespace admits",
    )
    yield Metric(
        "requests per task, ships code (next task of the experiment)",
        len(known),
        len(base),
        "req",
        at_most=4,
        note="the runtime this process created or reused is not sent again, the namespace's rules not read again",
    )
    yield Detail(
        "Requests of one task",
        [
            f"- ours, first task: {_describe(first)}",
            f"- ours, runtime exists: {_describe(again)}",
            f"- ours, next task of the same process: {_describe(known)}",
            f"- baseline: {_describe(base)}",
        ],
    )
    cluster.delete_trainjobs()

    # 2. Job size: one task of N nodes sends what one of 2 nodes sends (the TrainJob says numNodes).
    sizes = (2, 8, 32) if ctx.quick else (2, 8, 32, 128)
    by_size = {}
    for nodes in sizes:
        [by_size[nodes]] = _requests_per_task(ctx, ours(cluster.kubeconfig_path, nodes=nodes))
        cluster.delete_trainjobs(timeout=120)
    for nodes in sizes[1:]:
        yield Metric(
            f"requests to submit one task of {nodes} nodes (first task of a process)",
            len(by_size[nodes]),
            None,
            "req",
            at_most=len(by_size[2]),
            note=f"{len(by_size[2])} for 2 nodes; " + _describe(by_size[nodes]),
        )

    # 3. Runtime reuse: N identical tasks in one parallel experiment (NeMo-Run's thread pool).
    tasks = 20 if ctx.quick else 100
    _delete_our_runtimes(ctx)
    cluster.clear_requests()
    with nemorun_home():
        launch(ours(cluster.kubeconfig_path), tasks, "bench-reuse")
    requests = cluster.requests
    runtimes = [r for r in cluster.objects(RUNTIMES) if r["metadata"]["name"] != UPSTREAM_RUNTIME]
    answers = Counter(r.status_code for r in requests if r.resource == RUNTIMES and r.verb == "create")
    trainjobs = sum(1 for r in requests if r.resource == "trainjobs" and r.verb == "create" and r.status_code == 201)
    yield Metric(
        f"runtimes created by {tasks} identical tasks",
        len(runtimes),
        None,
        "",
        at_most=1,
        note=f"runtime POSTs: {answers.get(201, 0)}x 201, {answers.get(409, 0)}x 409; "
        f"{trainjobs}/{tasks} TrainJobs created",
    )
    per_task = Counter((r.verb, r.resource) for r in requests)
    yield Detail(
        f"Requests of {tasks} identical tasks (one experiment, run in parallel)",
        [f"- {count / tasks:g} per task: {verb} {resource}" for (verb, resource), count in sorted(per_task.items())],
    )
    cluster.delete_trainjobs(NAMESPACE)
