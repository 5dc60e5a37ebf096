"""Following the logs of a busy multi-node job: nothing lost, and how far behind.

A job of N nodes, each running 8 processes that print 1,000 numbered, timestamped lines/s
(``log_emitter.py``). Ours: ``scheduler.log_iter(app_id, role, k, should_tail=True)`` for
every node k at once, each in its own thread. Baseline: the kubernetes client's raw
``read_namespaced_pod_log(follow=True)`` stream of each node's pod, following the same job at
the same time (the baseline executor's own log path needs ``kubectl exec`` and forwards only
torchrun lines of two ranks, so it cannot serve as one). Lag = time received - time printed,
same host clock.
"""

from __future__ import annotations

import threading
import time

from harness import NAMESPACE, WORKLOAD_FILE, Metric, launch, median, nemorun_home, ours, percentile

NAME = "logs"
PROCS_PER_NODE = 8
RATE = 1000  # lines per second per process
TIMEOUT = 180.0


def _task(lines: int):
    import nemo_run as run

    procs = " ".join(str(p) for p in range(PROCS_PER_NODE))
    return run.Script(inline=(
        f'for p in {procs}; do python3 {WORKLOAD_FILE} "$PET_NODE_RANK" "$p" {lines} {RATE} & done; wait'
    ))


def _submit(ctx, nodes: int, lines: int):
    """Submit the log job with our executor; returns (experiment, scheduler, app id, TrainJob name)."""
    executor = ours(ctx.cluster.kubeconfig_path, nodes=nodes, nprocs_per_node=1)
    _, exp = launch(executor, 1, "bench-logs", task=lambda: _task(lines))
    scheduler, _, app_id = exp._runner._scheduler_app_id(exp.jobs[0].handle, check_session=False)
    return exp, scheduler, app_id, app_id.split(":", 1)[1]


def _ours(scheduler, app_id: str, nodes: int, received: list) -> list:
    """One follower per node: ``scheduler.log_iter(..., should_tail=True)``."""
    def follow(k):
        for line in scheduler.log_iter(app_id, "t0", k, should_tail=True):
            received.append((time.time(), line))

    return [lambda k=k: follow(k) for k in range(nodes)]


def _raw(ctx, trainjob: str, nodes: int, received: list) -> list:
    """Like ours, one follower per node that waits for the node's pod to start, then follows it,
    but with the kubernetes client's raw ``read_namespaced_pod_log(follow=True)``."""
    from kubernetes import client

    core = client.CoreV1Api(ctx.cluster.api)

    def follow(k):
        selector = f"jobset.sigs.k8s.io/jobset-name={trainjob},batch.kubernetes.io/job-completion-index={k}"
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            pods = [p for p in core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
                    if p.status.phase != "Pending"]
            if pods:
                break
            time.sleep(0.2)
        else:
            return
        resp = core.read_namespaced_pod_log(pods[0].metadata.name, NAMESPACE, container="node", follow=True,
                                            _preload_content=False)
        pending = b""
        for chunk in resp.stream(64 * 1024):
            now = time.time()
            pending += chunk
            *lines, pending = pending.split(b"\n")
            received.extend((now, line.decode()) for line in lines)

    return [lambda k=k: follow(k) for k in range(nodes)]


def _run_all(functions) -> None:
    threads = [threading.Thread(target=fn, daemon=True) for fn in functions]
    for t in threads:
        t.start()
    deadline = time.monotonic() + TIMEOUT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def _score(received: list[tuple[float, str]]) -> tuple[int, int, list[float]]:
    """(unique lines, duplicates, lags in ms) of the workload's lines. Lag counts only lines
    printed after the follower of their node received its first line: before that it measures
    when the follower attached (pod start, polling), not how far behind it keeps up."""
    seen, lags, duplicates, attached = set(), [], 0, {}
    for now, line in received:
        parts = line.split()
        try:
            i = parts.index("LOG")
            key, printed = tuple(parts[i + 1:i + 4]), float(parts[i + 4])
        except (ValueError, IndexError):
            continue
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        node = key[0]
        attached.setdefault(node, now)
        if printed >= attached[node]:
            lags.append((now - printed) * 1000)
    return len(seen), duplicates, lags


def run(ctx):
    nodes, seconds = (4, 2) if ctx.quick else (8, 3)
    lines = RATE * seconds
    printed = nodes * PROCS_PER_NODE * lines
    scores = {"ours": [], "baseline": []}
    with nemorun_home():
        for _ in range(ctx.repeats(heavy=True)):
            # Both follow the same job at the same time: same pods, same server load.
            _, scheduler, app_id, trainjob = _submit(ctx, nodes, lines)
            received = {"ours": [], "baseline": []}
            _run_all(_ours(scheduler, app_id, nodes, received["ours"])
                     + _raw(ctx, trainjob, nodes, received["baseline"]))
            for name in scores:
                scores[name].append(_score(list(received[name])))
            ctx.cluster.delete_trainjobs()

    def med(name, fn):
        return median(fn(score) for score in scores[name])

    what = f"{nodes} nodes x {PROCS_PER_NODE} procs x {RATE} lines/s x {seconds} s"
    yield Metric(f"log lines received, % of printed ({what})", 100 * min(s[0] for s in scores["ours"]) / printed,
                 100 * min(s[0] for s in scores["baseline"]) / printed, "%", at_least=100,
                 note=f"worst of {len(scores['ours'])} run(s); {printed:,} printed per run; duplicates "
                      f"{sum(s[1] for s in scores['ours'])} ours, {sum(s[1] for s in scores['baseline'])} baseline")
    for q in (50, 99):
        yield Metric(f"log lag p{q} (printed -> received, once attached)", med("ours", lambda s: percentile(s[2], q)),
                     med("baseline", lambda s: percentile(s[2], q)), "ms",
                     note="both follow the same job at once; baseline: raw kubernetes client" if q == 50 else
                     f"max {max(max(s[2], default=0) for s in scores['ours']):,.0f} ms ours")
