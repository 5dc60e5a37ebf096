"""Progress from global rank 0 that does not run in node 0's pod (issue 38, item 2): ft_launcher (NVRx 0.4) ranks
its agents by host name, then pid, so rank 0 can run in any node's pod. Status finds rank 0's log line where it
is: from a new process (`describe`, `nemo-kubeflow status`: every node's lines, which the look of an ft_launcher
job reads anyway) and from a process that keeps looking (`watch`'s looks: node 0's log followed, node 1's read
where the line was found, or where node 0's agent says it is not rank 0). The pure rules are in
test/unit/test_progress_fallback.py."""

import nemo_run as run
import progress_workload
import pytest
from backends import app_id_of, wait_for
from backends import logs as node_logs
from test_progress import PACKAGER, cli
from torchx.specs import AppState

from nemo_kubeflow import ConfigMapPackager
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

STEPS = 4000

#: Node 0's container starts 3 s after node 1's (its preflight init container waits), so its ft_launcher has
#: the higher pid. The pods of both back ends run on this machine, under one host name: NVRx ranks node 1's
#: agent first, and global rank 0 runs in node 1's pod (on a cluster, host names decide: `x-node-0-10` sorts
#: before `x-node-0-2`).
NODE_ZERO_LATE = '[ "$PET_NODE_RANK" != 0 ] || sleep 3'


# The local cluster only: there the pods share one host name, so ft_launcher ranks the agents by arrival and node
# 0's late start puts rank 0 in node 1. On the real control plane the pods' host names decide (node 0 was rank 0 in
# CI's run) and the progress reaches status through Trainer's status server, not the log line this test is about.
@pytest.mark.parametrize("backend", ["local"], indirect=True)
@pytest.mark.needs_torch
@pytest.mark.timeout(600)
def test_progress_of_rank_zero_in_node_1_under_ft_launcher(backend, console_script, nemorun_home):
    pytest.importorskip(
        "nvidia_resiliency_ext",
        reason="ft_launcher: pip install --no-deps nvidia-resiliency-ext (docs/resilience.md lists its dependencies)",
    )
    release = nemorun_home / "rank0.release"
    executor = backend.executor(
        packager=ConfigMapPackager(**PACKAGER),
        launcher=run.FaultTolerance(max_restarts=0, initial_rank_heartbeat_timeout=600, rank_heartbeat_timeout=600),
        preflight=NODE_ZERO_LATE,
    )
    with run.Experiment("prog-r0", executor=executor, log_level="WARN") as exp:
        train = run.Partial(
            progress_workload.train, steps=STEPS, seconds_per_step=0.15, interval=1.0, release_file=str(release)
        )
        exp.add(train, name="prog-r0")
        exp.run(detach=True)
    job = exp.jobs[0]
    app_id = app_id_of(job)
    try:
        # From a new process each time: describe's look of an ft_launcher job reads every node's last lines.
        desc = wait_for(
            lambda: (
                (d := create_scheduler("t").describe(app_id)).state == AppState.RUNNING
                and f" of {STEPS} (" in d.msg
                and "steps/s" in d.msg
                and d
            ),
            "progress in describe",
            timeout=240,
        )
        assert "ETA " in desc.msg and "loss=" in desc.msg, desc.msg
        lines = node_logs(job, "prog-r0")
        # Rank 0 ran in node 1's pod: its progress lines are there, node 0's agent joined as rank 1.
        assert any(line.startswith("[node-1] ") and "[nemo-kubeflow progress] {" in line for line in lines), lines
        assert not any(line.startswith("[node-0] ") and "[nemo-kubeflow progress]" in line for line in lines), lines
        assert any(line.startswith("[node-0] ") and "as rank 1 in a world of size 2" in line for line in lines), lines

        out = cli(console_script, nemorun_home, "nemo-kubeflow", "status", exp._id)
        assert out.returncode == 0 and "state: RUNNING" in out.stdout and f" of {STEPS} (" in out.stdout, out.stdout

        # A process that keeps looking (as `watch` and an attached wait): from its second look on it follows
        # node 0's log only, and reads node 1's for the line, where it was found.
        watcher = create_scheduler("watch")
        shown = [watcher.look_after(app_id)[0].msg for _ in range(2)]
        later = wait_for(
            lambda: (m := watcher.look_after(app_id)[0].msg) != shown[-1] and f" of {STEPS} (" in m and m,
            "a newer step in the looks of a waiting process",
            timeout=120,
        )
        assert all(f" of {STEPS} (" in m and "progress unknown" not in m for m in [*shown, later]), [*shown, later]
    finally:
        release.touch()
    done = wait_for(
        lambda: (d := create_scheduler("t").describe(app_id)).state != AppState.RUNNING and d,
        "the job to end",
        timeout=240,
    )
    assert done.state == AppState.SUCCEEDED, done.msg
