"""Every request of ours names us in its ``User-Agent`` (``nemo-kubeflow/<version>``), as kubectl names itself: a
platform team reads our load apart from other clients' in its API server's audit log and request logs. Counted at the HTTP level on a local cluster of status-only pods: a submission, the
looks of an attached wait (its watches), a status query, a log read and a cancel."""

from importlib import metadata

import pytest
from polling import wait_for
from test_describe_reads_at_scale import status_only_cluster
from test_diagnosis import submit

from nemo_kubeflow.constants import JOBSET_NAME_LABEL
from nemo_kubeflow.nemo_run.scheduler import create_scheduler


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    yield from status_only_cluster(tmp_path_factory, 2)


def test_every_request_of_a_jobs_life_says_it_comes_from_nemo_kubeflow(local):
    local.clear_requests()
    _, app_id = submit(local, "ua", script="sleep 600")
    name = app_id.split(":")[-1]
    wait_for(
        lambda: (
            sum(
                p["status"].get("phase") == "Running"
                for p in local.objects("pods", "default")
                if p["metadata"]["labels"].get(JOBSET_NAME_LABEL) == name
            )
            == 2
        ),
        "both pods running",
        timeout=120,
    )
    waiting = create_scheduler("ua-wait")
    for _ in range(2):  # watched from the second look
        waiting.look_after(app_id)
    wait_for(lambda: all(waiting._watches[app_id].job_cache.current().values()), "the watches current", timeout=30)
    create_scheduler("ua-status").describe(app_id)
    list(create_scheduler("ua-logs").log_iter(app_id, "ua", k=0))
    waiting.cancel(app_id)

    requests = local.requests
    verbs = {(r.verb, r.resource) for r in requests}
    assert {
        ("create", "trainjobs"),
        ("watch", "trainjobs"),
        ("watch", "pods"),
        ("get", "pods/log"),
        ("delete", "trainjobs"),
    } <= verbs, verbs
    ours = f"nemo-kubeflow/{metadata.version('nemo-kubeflow')}"  # the installed version: one place for it
    assert [(r.method, r.path, r.user_agent) for r in requests if r.user_agent != ours] == []
