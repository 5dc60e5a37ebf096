"""The log-line fallback of progress (no TrainJobStatus gate) reads node 0's log within a byte bound
(observe/progress_view.py: ``limitBytes``, at most two reads of ``LOG_READ_BYTES`` a look), finds the latest
progress line of a job that prints a lot between its progress lines, and says that progress is unknown,
never an old step as current, when rank 0's newest progress line is not within the bound. Bytes are counted
by the local cluster's API server."""

import nemo_run as run
import progress_workload
import pytest
from backends import app_id_of, wait_for
from test_progress import PACKAGER

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.observe import progress_view

LIMIT = progress_view.LOG_READ_BYTES


@pytest.fixture(scope="module")
def cluster(local_cluster):
    local_cluster.create_namespace("log-bound")
    return local_cluster


def launch(cluster, name, stall_warning_seconds=900, **chatty):
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=1,
        nprocs_per_node=1,
        namespace="log-bound",
        kubeconfig=str(cluster.kubeconfig_path),
        shm_size=None,
        packager=ConfigMapPackager(**PACKAGER),
        stall_warning_seconds=stall_warning_seconds,
    )
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(progress_workload.chatty_train, **chatty), name=name)
        exp.run(detach=True)
    return app_id_of(exp.jobs[0])


def log_reads(cluster, since):
    """The pod log reads of the namespace after the ``since``-th request: their response bytes."""
    return [r.bytes for r in cluster.requests[since:] if r.resource == "pods/log" and r.namespace == "log-bound"]


def describe_counting(cluster, app_id, scheduler=None):
    """One describe (from a new scheduler unless given) and the log bytes it read, read by read."""
    since = len(cluster.requests)
    desc = (scheduler or create_scheduler("t")).describe(app_id)
    return desc, log_reads(cluster, since)


def test_the_latest_progress_line_of_a_chatty_job_is_found_within_the_bound(cluster, nemorun_home):
    """2 KB of output after each step's progress line: node 0's last 500 lines are about 100 KB, more than a
    read may take; the second, smaller read reaches the log's end and its latest progress line."""
    app_id = launch(
        cluster, "chatty", steps=100000, seconds_per_step=0.05, interval=0, lines_per_step=10, line_bytes=200
    )
    # Once node 0's last 500 lines are more than a read takes (after a few steps), each look reads twice.
    desc, reads = wait_for(
        lambda: (d := describe_counting(cluster, app_id)) and " of 100000 (" in d[0].msg and len(d[1]) == 2 and d,
        "the chatty job's progress in describe",
        timeout=180,
    )
    assert desc.msg.startswith("step ") and "steps/s" in desc.msg, desc.msg
    assert reads[0] == LIMIT and reads[1] <= LIMIT, reads  # the first read cut at the bound, the second not
    # Again a little later, the step moved on (it is current), the same bound.
    step = int(desc.msg.split("step ")[1].split(" ")[0])
    desc, reads = wait_for(
        lambda: (
            (d := describe_counting(cluster, app_id))
            and " of 100000 (" in d[0].msg
            and int(d[0].msg.split("step ")[1].split(" ")[0]) > step
            and d
        ),
        "a later step",
        timeout=120,
    )
    assert desc.msg.startswith("step ") and len(reads) == 2 and sum(reads) <= 2 * LIMIT, (desc.msg, reads)
    create_scheduler("t").cancel(app_id)


def test_progress_is_unknown_when_the_newest_progress_line_is_beyond_the_bound(cluster, nemorun_home):
    """From step 40 on, no new step and a flood of output: a process that saw a step says progress is
    unknown and names that step as the last one reported; a new process shows no step at all. The stall
    warning does not judge by that step's age (it may not be the last one): by log silence, and the log is busy."""
    app_id = launch(
        cluster,
        "flood",
        steps=1000,
        seconds_per_step=0.25,
        interval=0,
        lines_per_step=0,
        line_bytes=300,
        flood_from=40,
        stall_warning_seconds=6,
    )
    watching = create_scheduler("t")  # one process that keeps looking (its reads throttled to one per 10 s)
    desc = wait_for(
        lambda: " of 1000 (" in (d := watching.describe(app_id)).msg and d, "the job's progress", timeout=180
    )
    assert desc.msg.startswith("step "), desc.msg
    desc = wait_for(
        lambda: "progress unknown" in (d := watching.describe(app_id)).msg and d,
        "progress unknown once the flood buries the progress line",
        timeout=120,
    )
    assert desc.msg.startswith("progress unknown (no progress line in node 0's last "), desc.msg
    # The newest step this process saw (its reads are 10 s apart), not said to be current.
    seen = int(desc.msg.split("; rank 0 last reported step ")[1].split(" of 1000 (")[0])
    assert 1 <= seen <= 40, desc.msg
    assert "warning:" not in desc.msg, desc.msg  # neither "no new step" nor "printed nothing"
    fresh, reads = describe_counting(cluster, app_id)
    assert "step " not in fresh.msg, fresh.msg  # nothing seen before, nothing current: no step shown
    # Two reads for progress (the first cut at the bound), then the log-silence check's short read.
    assert len(reads) >= 2 and reads[0] == LIMIT and reads[1] <= LIMIT and sum(reads[2:]) <= LIMIT, reads
    create_scheduler("t").cancel(app_id)
