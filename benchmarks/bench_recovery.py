"""Recovery from failures: how long until every rank trains again, and how many steps are redone.

1. **A killed rank.** A job of 2 nodes x 1 process (gloo, CPU) runs ``recovery_workload.py``: one
   all-reduce and one checkpoint per step, each rank logging ``step N rank R t=...``. Once every
   rank has stepped a few times, rank 1's training process gets SIGKILL. Measured: from the kill
   to the moment every rank has logged a step from a new process. Ours: ``launcher="ft"``
   (``ft_launcher`` restarts the ranks inside the running pods) with ``worker_preload=["torch"]``
   (each new worker process is forked from a template that has imported torch) and
   ``rendezvous_poll_seconds=0.1``; the same without the two settings is measured too. Baseline:
   plain torchrun with ``retries=1`` and ``fail_fast_exit_codes=[]``, so the failure restarts the
   gang (JobSet deletes and recreates every pod). Both again beside a busy loop per core
   (``cpu_hog``), as on a busy machine.
2. **A preemption.** The same 2 nodes run ``examples/kubeflow/preemptible_training.py``
   (checkpoint on SIGTERM, and every 25 steps). After some steps the TrainJob is suspended, as
   Kueue does when it preempts; once the pods are gone it is resumed at once (re-admitted).
   Measured: steps run twice, and the time from the suspension to the first step after the
   resume. Ours: ``termination_grace_period_seconds=30`` (the loop checkpoints on SIGTERM).
   Baseline: ``termination_grace_period_seconds=0`` (SIGKILL at once: only the periodic
   checkpoint is there to resume from).

The pods are host processes that share this machine's files, so the step lines are read from
files the workload writes (a gang restart deletes the pods and their logs).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from harness import BENCH_DIR, NAMESPACE, REPO, Detail, Metric, fmt, launch, median, nemorun_home, ours

NAME = "recovery"
WORKLOAD = "recovery_workload.py"
EXAMPLE_DIR = REPO / "examples" / "kubeflow"
NODES = 2
#: Steps every rank takes before the kill (torch imported, process group up, steady state).
WARM_STEPS = 5
STEP_SECONDS = 0.2
#: Preempt after this many steps; the job ends this many steps later.
PREEMPT_AT, PREEMPT_STEPS = 30, 60
CHECKPOINT_EVERY = 25
GRACE = 30
#: Longest wait for one phase (start, recovery, pods gone), generous for a loaded 2-core machine.
TIMEOUT = 240.0
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def _wait(predicate, timeout: float = TIMEOUT, interval: float = 0.05):
    """The first true value of ``predicate()``, or ``None`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = predicate()
    return value or None


def _trainjob_name(exp) -> str:
    return exp.jobs[0].handle.rsplit("/", 1)[-1].split(":", 1)[1]


def _pods(ctx, trainjob: str, deleting: bool = False) -> dict[str, str]:
    """The TrainJob's pods, name -> uid; those being deleted only with ``deleting``."""
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in ctx.cluster.objects("pods", NAMESPACE)
        if p["metadata"].get("labels", {}).get(JOBSET_NAME_LABEL) == trainjob
        and (deleting or not p["metadata"].get("deletionTimestamp"))
    }


# --------------------------------------------------------------------------------------------
# 1. A killed rank: in-job restart (ft_launcher) vs gang restart (torchrun + retries)
# --------------------------------------------------------------------------------------------


def _step_lines(out: Path) -> list[tuple[int, int, float, int]]:
    """(rank, step, time, pid) of every step line the ranks logged."""
    lines = []
    for path in out.glob("steps-rank*.log"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, IndexError):
                _, step, _, rank, t, pid = line.split()
                lines.append((int(rank), int(step), float(t[2:]), int(pid[4:])))
    return lines


#: Ours, fully: ft_launcher with warm worker starts and fast rendezvous polls (docs/resilience.md).
WARM_SETTINGS = dict(worker_preload=["torch"], rendezvous_poll_seconds=0.1)
#: A folder holding another nvidia-resiliency-ext (an unpacked wheel) for the pods to import instead of the
#: installed one: the in-job restarts are then measured on that release (docs/resilience.md, "NVRx versions").
#: NVRx 0.7 closes a rendezvous whose nodes share a hostname, as the local cluster's pods do (they are processes
#: of this machine), unless NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE=1 (its switch for that case).
NVRX_PATH_ENV = "NEMO_KUBEFLOW_BENCH_NVRX_PATH"


def _kill_one_rank(ctx, variant: str) -> dict:
    """Run the workload with ``variant`` ("warm", "ft" or "gang"), SIGKILL rank 1 once it is warm, and
    return what happened: ``recovery`` (seconds, ``None`` on a timeout), steps redone, pods."""
    import nemo_run as run

    from nemo_kubeflow import ConfigMapPackager

    out = Path(tempfile.mkdtemp(prefix=f"recovery-{variant}-", dir=ctx.workdir))
    settings = (
        dict(
            launcher=run.FaultTolerance(max_restarts=2, initial_rank_heartbeat_timeout=600, rank_heartbeat_timeout=600)
        )
        if variant in ("ft", "warm")
        else dict(retries=1, fail_fast_exit_codes=[])
    )
    if variant == "warm":
        settings.update(WARM_SETTINGS)
    if variant in ("ft", "warm") and os.environ.get(NVRX_PATH_ENV):
        settings["env_vars"] = {"PYTHONPATH": os.environ[NVRX_PATH_ENV], "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "1"}
    executor = ours(
        ctx.cluster.kubeconfig_path,
        nodes=NODES,
        nprocs_per_node=1,
        packager=ConfigMapPackager(relative_path=str(BENCH_DIR), include_pattern=WORKLOAD),
        **settings,
    )
    # A plain script, not a run.Partial: NeMo-Run's runner would add its own start (import nemo_run, about
    # 3 s unloaded) to every restarted process, in both variants alike.
    task = run.Script(path=str(BENCH_DIR / WORKLOAD), args=["100000", str(out), str(STEP_SECONDS)], entrypoint="python")
    result: dict = {"variant": variant, "recovery": None}
    with nemorun_home():
        submitted = time.time()
        _, exp = launch(executor, 1, f"rec-{variant}", task=lambda: task)
        trainjob = _trainjob_name(exp)
        try:

            def warm():
                lines = _step_lines(out)
                return all(sum(1 for r, *_ in lines if r == rank) >= WARM_STEPS for rank in range(NODES)) and lines

            before = _wait(warm)
            if not before:
                result["note"] = "never started"
                return result
            result["start"] = min(t for _, _, t, _ in before) - submitted
            pods_before = _pods(ctx, trainjob)
            victim = max((p for p in (out / "pids").glob("rank1-*")), key=lambda p: p.stat().st_mtime_ns)
            old_pids = {int(p.name.split("-")[1]) for p in (out / "pids").iterdir()}
            killed = time.time()
            os.kill(json.loads(victim.read_text())["pid"], signal.SIGKILL)

            def recovered():
                new = [line for line in _step_lines(out) if line[3] not in old_pids]
                return len({r for r, *_ in new}) == NODES and new

            new = _wait(recovered)
            if not new:
                result["note"] = f"no recovery within {TIMEOUT:.0f} s"
                return result
            first = {rank: min(t for r, _, t, _ in new if r == rank) for rank in range(NODES)}
            result["recovery"] = max(first.values()) - killed
            # Where the time went: when the last rank's new process was created, ran the script, had its
            # process group and stepped (each rank's milestones from its pid file).
            marks = {}
            for rank in range(NODES):
                pid = next(p for r, _, t, p in new if r == rank and t == first[rank])
                with contextlib.suppress(OSError, ValueError):
                    marks[rank] = json.loads((out / "pids" / f"rank{rank}-{pid}").read_text())
            if len(marks) == NODES:
                last = [killed] + [max(m[k] for m in marks.values()) for k in ("created", "entered", "ready")]
                result["phases"] = [b - a for a, b in zip(last, last[1:] + [max(first.values())])]
                result["ranks"] = "; ".join(
                    f"rank {r} +{m['created'] - killed:.1f}/+{m['entered'] - killed:.1f}/+{m['ready'] - killed:.1f}"
                    f"/+{first[r] - killed:.1f}"
                    for r, m in sorted(marks.items())
                )
            done_before = max(s for r, s, t, _ in _step_lines(out) if r == 0 and t <= killed)
            resumed_at = min(s for r, s, _, _ in new if r == 0)
            result["redone"] = max(0, done_before - resumed_at + 1)
            pods_after = _pods(ctx, trainjob)
            result["pods_recreated"] = len(set(pods_before.values()) - set(pods_after.values()))
            return result
        finally:
            ctx.cluster.delete_trainjobs(timeout=60.0)


# --------------------------------------------------------------------------------------------
# 2. A preemption: checkpoint on SIGTERM vs none (grace period 0)
# --------------------------------------------------------------------------------------------


def _events(path: Path) -> list[dict]:
    events = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line cut short by SIGKILL
                events.append(json.loads(line))
    return events


def _preempt_once(ctx, grace: int) -> dict:
    """Run the preemptible example, suspend it after ``PREEMPT_AT`` steps, resume it once its pods
    are gone; return steps run twice and the times of each phase (``None`` on a timeout)."""
    import nemo_run as run
    from kubernetes import client

    from nemo_kubeflow import ConfigMapPackager

    sys.path.insert(0, str(EXAMPLE_DIR))
    import preemptible_training

    out = Path(tempfile.mkdtemp(prefix=f"preempt-{grace}-", dir=ctx.workdir))
    events_file = out / "events.jsonl"
    executor = ours(
        ctx.cluster.kubeconfig_path,
        nodes=NODES,
        nprocs_per_node=1,
        termination_grace_period_seconds=grace,
        packager=ConfigMapPackager(relative_path=str(EXAMPLE_DIR), include_pattern="preemptible_training.py"),
    )
    task = run.Partial(
        preemptible_training.train,
        steps=PREEMPT_STEPS,
        step_seconds=0.1,
        checkpoint_every=CHECKPOINT_EVERY,
        checkpoint_dir=str(out),
    )
    custom = client.CustomObjectsApi(ctx.cluster.api)
    result: dict = {"grace": grace, "recovery": None}

    def steps():
        return [e["step"] for e in _events(events_file) if "step" in e]

    with nemorun_home():
        _, exp = launch(executor, 1, f"preempt-{grace}", task=lambda: task)
        trainjob = _trainjob_name(exp)

        def suspend(value: bool) -> None:
            custom.patch_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", NAMESPACE, "trainjobs", trainjob, {"spec": {"suspend": value}}
            )

        try:
            if not _wait(lambda: len(steps()) >= PREEMPT_AT):
                result["note"] = "never started"
                return result
            suspended = time.monotonic()
            suspend(True)  # Kueue's preemption: Trainer suspends the JobSet, the pods are deleted

            def gone():
                if "checkpointed" not in result and any(e.get("why") == "SIGTERM" for e in _events(events_file)):
                    result["checkpointed"] = time.monotonic() - suspended
                return not _pods(ctx, trainjob, deleting=True)

            if _wait(gone, interval=0.1) is None:
                result["note"] = "pods never went"
                return result
            result["stop"] = time.monotonic() - suspended
            first_run = steps()
            done_first = len(first_run)
            resumed = time.monotonic()
            suspend(False)  # re-admitted at once
            if not _wait(lambda: len(steps()) > done_first, interval=0.02):
                result["note"] = f"not training again within {TIMEOUT:.0f} s"
                return result
            result["restart"] = time.monotonic() - resumed
            result["recovery"] = time.monotonic() - suspended
            second_run = steps()[done_first:]
            result["redone"] = max(first_run) - second_run[0] + 1
            result["checkpoint"] = next(
                (e["checkpoint"] for e in _events(events_file) if e.get("why") == "SIGTERM"), None
            )
            result["finished"] = bool(_wait(lambda: any(e.get("why") == "done" for e in _events(events_file))))
            return result
        finally:
            ctx.cluster.delete_trainjobs(timeout=60.0)


# --------------------------------------------------------------------------------------------


def _median_of(samples: list[dict], key: str):
    values = [s[key] for s in samples if s.get(key) is not None]
    return median(values) if values else None


def _samples(samples: list[dict], key: str, unit: str = "") -> str:
    return ", ".join("n/a" if s.get(key) is None else f"{fmt(s[key])}{unit}" for s in samples)


def run(ctx):
    from harness import cpu_hog, interleaved, silence_nemo_run

    silence_nemo_run()
    load_before = os.getloadavg()
    repeat = ctx.repeats(heavy=True)  # quick: 1; full: 3
    kills = interleaved(
        repeat,
        warm=lambda: _kill_one_rank(ctx, "warm"),
        ft=lambda: _kill_one_rank(ctx, "ft"),
        gang=lambda: _kill_one_rank(ctx, "gang"),
    )
    load_between = os.getloadavg()
    with cpu_hog() as hogs:
        busy = interleaved(repeat, warm=lambda: _kill_one_rank(ctx, "warm"), gang=lambda: _kill_one_rank(ctx, "gang"))
    load_busy = os.getloadavg()
    warm, ft, gang = kills["warm"], kills["ft"], kills["gang"]
    for sample in busy["warm"] + busy["gang"]:
        sample["busy"] = True
    in_job, restart = _median_of(warm, "recovery"), _median_of(gang, "recovery")
    failed = [
        f"{s['variant']}{' (busy)' if s.get('busy') else ''}: {s['note']}"
        for s in warm + ft + gang + busy["warm"] + busy["gang"]
        if s.get("note")
    ]
    yield Metric(
        "SIGKILL of 1 rank -> every rank training again (2 nodes x 1 proc, gloo)",
        in_job,
        restart,
        "s",
        at_most=30,
        note=f"ours: in-job restart (ft_launcher) with worker_preload=['torch'], "
        f"rendezvous_poll_seconds=0.1, runs {_samples(warm, 'recovery', ' s')}; "
        f"baseline: gang restart (torchrun, retries=1), runs {_samples(gang, 'recovery', ' s')}"
        + (f"; {'; '.join(failed)}" if failed else ""),
    )
    yield Metric(
        "  gang restart / in-job restart (how many times faster in-job is)",
        restart / in_job if in_job and restart else None,
        None,
        "x",
        at_least=3,
        note="target: in-job at least 3x faster",
    )
    cold = _median_of(ft, "recovery")
    yield Metric(
        "  in-job restart without worker_preload and rendezvous_poll_seconds (plain launcher='ft')",
        cold,
        restart,
        "s",
        note=f"runs {_samples(ft, 'recovery', ' s')}: every restarted worker is a "
        "new Python that imports torch; the agents look at their rendezvous once a second",
    )
    busy_in_job, busy_restart = _median_of(busy["warm"], "recovery"), _median_of(busy["gang"], "recovery")
    yield Metric(
        f"  the same beside a busy loop per core ({hogs} cpu_hog processes)",
        busy_in_job,
        busy_restart,
        "s",
        note=f"ours {_samples(busy['warm'], 'recovery', ' s')}, baseline {_samples(busy['gang'], 'recovery', ' s')}",
    )
    yield Metric(
        "    busy: gang restart / in-job restart",
        busy_restart / busy_in_job if busy_in_job and busy_restart else None,
        None,
        "x",
        at_least=3,
    )
    spawn_ft = _median_of([{"x": s["phases"][0]} for s in warm if s.get("phases")], "x")
    spawn_gang = _median_of([{"x": s["phases"][0]} for s in gang if s.get("phases")], "x")
    yield Metric(
        "  kill -> every rank's new process exists (the restart itself, before the script starts)",
        spawn_ft,
        spawn_gang,
        "s",
        note="the rest is the new process's own start: Python, torch, gloo (see 'Recovery runs' below)",
    )
    yield Metric(
        "  steps redone after the kill (checkpoint every step)",
        _median_of(warm, "redone"),
        _median_of(gang, "redone"),
        "steps",
        note=f"pods recreated: {_samples(warm, 'pods_recreated')} in-job, {_samples(gang, 'pods_recreated')} gang",
    )

    preempts = interleaved(repeat, sigterm=lambda: _preempt_once(ctx, GRACE), none=lambda: _preempt_once(ctx, 0))
    sigterm, none = preempts["sigterm"], preempts["none"]
    failed = [f"grace {s['grace']}: {s['note']}" for s in sigterm + none if s.get("note")]
    yield Metric(
        f"preemption (suspend, pods gone, resume) after {PREEMPT_AT} steps: steps run twice",
        _median_of(sigterm, "redone"),
        _median_of(none, "redone"),
        "steps",
        at_most=0,
        note=f"ours: checkpoint on SIGTERM (grace {GRACE} s), runs {_samples(sigterm, 'redone')}, "
        f"checkpoints at step {_samples(sigterm, 'checkpoint')}; baseline: grace 0 (periodic checkpoint "
        f"every {CHECKPOINT_EVERY} steps only), runs {_samples(none, 'redone')}"
        + (f"; {'; '.join(failed)}" if failed else ""),
    )
    yield Metric(
        "  preemption -> training again (re-admitted as soon as the pods are gone)",
        _median_of(sigterm, "recovery"),
        _median_of(none, "recovery"),
        "s",
        note=f"ours {_samples(sigterm, 'recovery', ' s')}, baseline {_samples(none, 'recovery', ' s')}",
    )
    yield Metric(
        "    of which: suspend -> pods gone (checkpoint written)",
        _median_of(sigterm, "stop"),
        _median_of(none, "stop"),
        "s",
    )
    yield Metric(
        "    of which: resume -> training again (new pods, imports, process group)",
        _median_of(sigterm, "restart"),
        _median_of(none, "restart"),
        "s",
        note=f"final step reached after the resume: {_samples(sigterm + none, 'finished')}",
    )
    yield Detail(
        "Recovery runs",
        [
            "A kill's recovery splits into: the kill -> every rank's new process exists (failure noticed, peers "
            "stopped, rendezvous or new pods, spawn), -> every one runs the script (Python start), -> every one "
            "has its process group (torch import, gloo), -> every one has stepped. Per rank, the same four "
            "moments after the kill: created/script/process group/first step.",
            "",
        ]
        + [
            f"- {s['variant']}{' (busy)' if s.get('busy') else ''}: started {fmt(s.get('start'))} s after submission, "
            f"recovery {fmt(s.get('recovery'))} s"
            + (" = " + " + ".join(f"{x:.1f}" for x in s["phases"]) if s.get("phases") else "")
            + (f" ({s['ranks']})" if s.get("ranks") else "")
            + f", steps redone {s.get('redone', 'n/a')}, pods recreated {s.get('pods_recreated', 'n/a')}"
            + (f" ({s['note']})" if s.get("note") else "")
            for s in warm + ft + gang + busy["warm"] + busy["gang"]
        ]
        + [
            f"- preemption, grace {s['grace']} s: stop {fmt(s.get('stop'))} s (SIGTERM checkpoint written after "
            f"{fmt(s.get('checkpointed'))} s), restart {fmt(s.get('restart'))} s, "
            f"steps run twice {s.get('redone', 'n/a')}, SIGTERM checkpoint at {s.get('checkpoint')}, "
            f"finished {s.get('finished')}" + (f" ({s['note']})" if s.get("note") else "")
            for s in sigterm + none
        ]
        + [
            f"- load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in load_before)} before, "
            f"{' '.join(f'{x:.2f}' for x in load_between)} after the quiet kills, "
            f"{' '.join(f'{x:.2f}' for x in load_busy)} after the busy ones, "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end (cores shared with other sessions)"
        ],
    )
