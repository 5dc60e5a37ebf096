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

import json
import os
import subprocess
import sys
import threading
import time

from harness import (
    BENCH_DIR,
    NAMESPACE,
    WORKLOAD_FILE,
    Detail,
    Metric,
    cpu_hog,
    fmt,
    launch,
    median,
    nemorun_home,
    ours,
    percentile,
)

from nemo_kubeflow_local.kubelet.log_emitters import EMITTER_ENV

NAME = "logs"
PROCS_PER_NODE = 8
RATE = 1000  # lines per second per process
TIMEOUT = 180.0


def _task(lines: int):
    import nemo_run as run

    procs = " ".join(str(p) for p in range(PROCS_PER_NODE))
    return run.Script(
        inline=(f'for p in {procs}; do python3 {WORKLOAD_FILE} "$PET_NODE_RANK" "$p" {lines} {RATE} & done; wait')
    )


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
            pods = [
                p
                for p in core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
                if p.status.phase != "Pending"
            ]
            if pods:
                break
            time.sleep(0.2)
        else:
            return
        resp = core.read_namespaced_pod_log(
            pods[0].metadata.name, NAMESPACE, container="node", follow=True, _preload_content=False
        )
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
            key, printed = tuple(parts[i + 1 : i + 4]), float(parts[i + 4])
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


# --- scale: many cheap nodes, followed by one process ---------------------------------------------

SCALE_RATE = 200  # lines per second per node
SCALE_BATCH = 0.1  # seconds between the emitter's writes (each line carries its own time)
#: Most of the lines printed before a follower caught up are excluded from lag (see ``_score``).
_FOLLOWER = r"""
import array, json, os, sys, threading, time
nodes, lines, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
from nemo_kubeflow.cli.nemo_run_import import _import_nemo_run
_import_nemo_run()  # as `nemo-kubeflow logs` imports it: without torch
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
print("ready", flush=True)
app_id = sys.stdin.readline().strip()  # imports done before the job starts: lag measures following only

def rss_mib(field="VmRSS"):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024

def sockets():
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count

scheduler = create_scheduler("bench-scale")
cpu_before = time.process_time()
before = {"rss": rss_mib(), "threads": threading.active_count(), "sockets": sockets()}
seen = [bytearray(lines) for _ in range(nodes)]
lags, other, duplicates, attached = array.array("d"), [0], [0], {}
lock = threading.Lock()
peak = {"rss": 0.0, "threads": 0, "readers": 0, "sockets": 0}
done = threading.Event()

def follow(k):
    # NeMo-Run's get_logs: one thread per replica, each reading log_iter(..., should_tail=True).
    for line in scheduler.log_iter(app_id, "t0", k, should_tail=True):
        now = time.time()
        parts = line.split()
        if len(parts) != 5 or parts[0] != "LOG":
            other[0] += 1
            continue
        node, seq, printed = int(parts[1]), int(parts[3]), float(parts[4])
        with lock:
            if seen[node][seq]:
                duplicates[0] += 1
                continue
            seen[node][seq] = 1
            first = attached.setdefault(node, now)
            if printed >= first:
                lags.append(now - printed)

def sample():
    while not done.wait(0.25):
        names = [t.name for t in threading.enumerate()]
        peak["rss"] = max(peak["rss"], rss_mib())
        peak["threads"] = max(peak["threads"], len(names))
        peak["readers"] = max(peak["readers"], sum(n.startswith("logs-") for n in names))
        peak["sockets"] = max(peak["sockets"], sockets())

threading.Thread(target=sample, daemon=True).start()
threads = [threading.Thread(target=follow, args=(k,), daemon=True) for k in range(nodes)]
started = time.monotonic()
for t in threads:
    t.start()
for t in threads:
    t.join(max(0.0, timeout - (time.monotonic() - started)))
done.set()
ordered = sorted(lags)
pct = lambda q: ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))] if ordered else float("nan")
print(json.dumps({"received": sum(sum(s) for s in seen), "duplicates": duplicates[0], "other": other[0],
                  "p50": pct(50), "p99": pct(99), "max": ordered[-1] if ordered else float("nan"),
                  "before": before, "peak": peak, "seconds": time.monotonic() - started,
                  "cpu": time.process_time() - cpu_before,
                  "unfinished": sum(t.is_alive() for t in threads)}))
"""


def _scale_task(lines: int):
    import nemo_run as run

    return run.Script(inline=f'python3 -S {WORKLOAD_FILE} "$PET_NODE_RANK" 0 {lines} {SCALE_RATE} {SCALE_BATCH}')


def _follow_scale(ctx, nodes: int, seconds: int, rate: float = SCALE_RATE, emulated: bool = False) -> dict:
    """Submit ``nodes`` x 1 emitter at ``rate`` lines/s for ``seconds``, follow every node from a fresh
    process (NeMo-Run's way: a thread per node calling ``log_iter``), return its report. ``emulated``:
    the pods are the local kubelet's log emitters without a process (``NEMO_KUBEFLOW_LOCAL_LOG_EMITTER``,
    docs/local-cluster.md), printing the same lines; the job, its pods and the log endpoint are as usual."""
    lines = max(1, round(rate * seconds))
    timeout = TIMEOUT + (nodes / 8 if emulated else 4 * nodes)
    follower = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", _FOLLOWER, str(nodes), str(lines), str(timeout)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(BENCH_DIR)},
    )
    try:
        if follower.stdout.readline().strip() != "ready":
            raise RuntimeError(f"follower failed: {follower.communicate(timeout=30)[1][-2000:]}")
        env = {EMITTER_ENV: f"{lines} {rate}"} if emulated else {}
        executor = ours(ctx.cluster.kubeconfig_path, nodes=nodes, nprocs_per_node=1, env_vars=env)
        _, exp = launch(executor, 1, f"bench-scale-{nodes}", task=lambda: _scale_task(lines))
        _, _, app_id = exp._runner._scheduler_app_id(exp.jobs[0].handle, check_session=False)
        out, err = follower.communicate(app_id + "\n", timeout=timeout + 120)
    finally:
        if follower.poll() is None:
            follower.kill()
        ctx.cluster.delete_trainjobs(timeout=120)
    if follower.returncode != 0:
        raise RuntimeError(f"follower failed: {err[-2000:]}")
    report = json.loads(out.strip().splitlines()[-1])
    report["printed"] = nodes * lines
    return report


_RSS_AFTER_IMPORT = """
import sys
if sys.argv[1] == "without":
    from nemo_kubeflow.cli.nemo_run_import import _import_nemo_run
    _import_nemo_run()
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024)
"""


def _torch_import_mib() -> float:
    """What importing NeMo-Run as NeMo-Run's own commands do (torch included) adds to a follower."""

    def rss(how: str) -> float:
        out = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", _RSS_AFTER_IMPORT, how],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        return float(out.stdout.strip().splitlines()[-1])

    return rss("with") - rss("without")


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


#: The largest job, 200 lines/s in all: emulated log emitters (no process per pod, docs/local-cluster.md).
LARGE_NODES, LARGE_RATE = 1024, 200


def scale(ctx):
    from nemo_kubeflow.observe.log_follower import LOG_READERS

    # (nodes, seconds, lines/s per node, emulated pods, beside busy loops)
    cases = (
        [(8, 6, SCALE_RATE, False, False), (32, 6, SCALE_RATE, False, False)]
        if ctx.quick
        else [
            (8, 12, SCALE_RATE, False, False),
            (32, 12, SCALE_RATE, False, False),
            (128, 12, SCALE_RATE, False, False),
        ]
    )
    large = 256 if ctx.quick else LARGE_NODES
    cases += (
        [(large, 30, LARGE_RATE / large, True, False)]
        if ctx.quick
        else [(large, 60, LARGE_RATE / large, True, False), (large, 60, LARGE_RATE / large, True, True)]
    )
    torch_mib = _torch_import_mib()
    rows = []
    with nemorun_home():
        for nodes, seconds, rate, emulated, loaded in cases:
            load = _load()
            if loaded:
                with cpu_hog() as hogs:
                    r = _follow_scale(ctx, nodes, seconds, rate, emulated)
                where = f", beside {hogs} busy loops"
            else:
                r = _follow_scale(ctx, nodes, seconds, rate, emulated)
                where = ""
            growth_rss = r["peak"]["rss"] - r["before"]["rss"]
            what = (
                f"{nodes} emulated emitters, {LARGE_RATE} lines/s in all"
                if emulated
                else f"{nodes} nodes x {fmt(rate)} lines/s"
            ) + f" x {seconds} s{where}"
            label = f"scale {nodes} nodes{where}"
            yield Metric(
                f"{label}: log lines received, % of printed ({what})",
                100 * r["received"] / r["printed"],
                None,
                "%",
                at_least=100,
                note=f"{r['duplicates']} duplicates (target 0); {r['unfinished']} followers unfinished; load {load}",
            )
            yield Metric(
                f"{label}: log lag p99 (printed -> received, once attached)",
                r["p99"] * 1000,
                None,
                "ms",
                at_most=5000 if emulated else 2000,
                note=f"p50 {r['p50'] * 1000:,.0f} ms, max {r['max'] * 1000:,.0f} ms",
            )
            if emulated:
                yield Metric(
                    f"{label}: follower memory, RSS growth while following",
                    growth_rss,
                    None,
                    "MiB",
                    at_most=100,
                    note=f"peak {r['peak']['rss']:,.0f} MiB, {r['before']['rss']:,.0f} MiB "
                    f"before; CPU {r['cpu']:,.1f} s in {r['seconds']:,.0f} s",
                )
            else:
                yield Metric(
                    f"{label}: follower memory, peak RSS",
                    r["peak"]["rss"],
                    None,
                    "MiB",
                    at_most=300,
                    note=f"{growth_rss:,.0f} MiB while following, {r['before']['rss']:,.0f} MiB before "
                    f"(NeMo-Run imported as `nemo-kubeflow logs` does, without torch; with torch, as "
                    f"`nemo experiment logs` does, {torch_mib:,.0f} MiB more)",
                )
            yield Metric(
                f"{label}: log reader threads (and connections) of ours",
                r["peak"]["readers"],
                None,
                "",
                at_most=LOG_READERS,
                note=f"sockets {r['peak']['sockets']} peak ({r['before']['sockets']} before); threads "
                f"{r['peak']['threads']} in all (NeMo-Run's one per node included)",
            )
            rows.append(
                f"| {nodes}{' (emulated)' if emulated else ''} | {fmt(rate)} | {where.lstrip(', ') or 'quiet'} | "
                f"{100 * r['received'] / r['printed']:.2f}% | {r['duplicates']} | "
                f"{r['p50'] * 1000:,.0f} | {r['p99'] * 1000:,.0f} | {growth_rss:,.0f} | {r['peak']['rss']:,.0f} | "
                f"{r['peak']['readers']} | {r['peak']['sockets']} | {r['peak']['threads']} | {r['cpu']:,.1f} | "
                f"{load} |"
            )
    yield Detail(
        "Log following by job size (log_emitter.py pods; the largest: emulated emitters; one follower process)",
        [
            "| nodes | lines/s per node | machine | received | duplicates | p50 lag ms | p99 lag ms | RSS growth MiB "
            "| peak RSS MiB | reader threads | sockets | threads in all | follower CPU s | load (1/5/15 min) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        + rows,
    )


def run(ctx):
    yield from scale(ctx)
    nodes, seconds = (4, 2) if ctx.quick else (8, 3)
    lines = RATE * seconds
    printed = nodes * PROCS_PER_NODE * lines
    scores = {"ours": [], "baseline": []}
    with nemorun_home():
        for _ in range(ctx.repeats(heavy=True)):
            # Both follow the same job at the same time: same pods, same server load.
            _, scheduler, app_id, trainjob = _submit(ctx, nodes, lines)
            received = {"ours": [], "baseline": []}
            _run_all(
                _ours(scheduler, app_id, nodes, received["ours"]) + _raw(ctx, trainjob, nodes, received["baseline"])
            )
            for name in scores:
                scores[name].append(_score(list(received[name])))
            ctx.cluster.delete_trainjobs()

    def med(name, fn):
        return median(fn(score) for score in scores[name])

    what = f"{nodes} nodes x {PROCS_PER_NODE} procs x {RATE} lines/s x {seconds} s"
    yield Metric(
        f"log lines received, % of printed ({what})",
        100 * min(s[0] for s in scores["ours"]) / printed,
        100 * min(s[0] for s in scores["baseline"]) / printed,
        "%",
        at_least=100,
        note=f"worst of {len(scores['ours'])} run(s); {printed:,} printed per run; duplicates "
        f"{sum(s[1] for s in scores['ours'])} ours, {sum(s[1] for s in scores['baseline'])} baseline",
    )
    for q in (50, 99):
        yield Metric(
            f"log lag p{q} (printed -> received, once attached)",
            med("ours", lambda s: percentile(s[2], q)),
            med("baseline", lambda s: percentile(s[2], q)),
            "ms",
            note="both follow the same job at once; baseline: raw kubernetes client"
            if q == 50
            else f"max {max(max(s[2], default=0) for s in scores['ours']):,.0f} ms ours",
        )
