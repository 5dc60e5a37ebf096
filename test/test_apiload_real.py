"""The API load of describing a running job, counted by the real kube-apiserver (its ``apiserver_request_total``
metric) and by the local cluster (``api_counters``), for the same scenario: the counts agree within 20 %
(benchmarks/bench_apiload.py measures the load at 1,024 nodes on the local cluster, and with ``real()`` an attached
wait's requests on both servers: a window of minutes, its timers' requests, a measurement rather than a test)."""

import re
import uuid

import nemo_run as run
import pytest
from polling import wait_for
from torchx.specs import AppState, parse_app_handle

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.nemo_run.scheduler import create_scheduler

#: The looks counted, each by a new scheduler (`nemo experiment status`; a wait's later looks read the same, and
#: its log keeper's reads, timed by threads of their own, would make the two counts differ by chance).
LOOKS = 6
#: What a describe of a running job may read; other requests on the real server are its controllers' and the
#: node agent's (informers' lists and watches across the cluster, leases, pod status).
COUNTED = {
    ("get", "trainjobs"),
    ("get", "jobsets"),
    ("list", "pods"),
    ("list", "jobs"),
    ("list", "events"),
    ("get", "pods/log"),
    ("list", "workloads"),
    ("list", "nodes"),
}
#: kube-apiserver's metric verbs -> the local server's. A pod log read is a GET on the wire, but kube-apiserver
#: records every pods/log request as CONNECT (kubernetes#50123, #114774: they can stream for a long time).
_VERBS = {"GET": "get", "LIST": "list", "CONNECT": "get", "WATCH": "watch"}
_SAMPLE = r"^{metric}\{{(?P<labels>[^}}]*)\}} (?P<value>\S+)$"


def _real_counts(control_plane, counted=frozenset(COUNTED), metric="apiserver_request_total") -> dict:
    """(verb, resource) -> requests so far of one object or one namespace (our client's scopes), all codes, of the
    ``counted`` ones: by ``metric``, which kube-apiserver counts as a request ends (a watch: when it ends); with
    ``apiserver_longrunning_requests``, the watches and log streams open now."""
    found: dict = {}
    sample = re.compile(_SAMPLE.format(metric=metric))
    for line in control_plane.request("GET", "/metrics").splitlines():
        m = sample.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
        verb = _VERBS.get(labels.get("verb", ""))
        if verb is None or labels.get("scope") not in ("resource", "namespace"):
            continue
        resource = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        if (verb, resource) in counted:
            found[verb, resource] = found.get((verb, resource), 0) + int(float(m["value"]))
    return found


def _no_namespace_emptied(control_plane) -> bool:
    """Whether no namespace is being deleted: the namespace controller empties one with namespace-scoped LISTs of
    every resource (jobs, events, workloads...), which the metric, without a namespace label, counts with ours
    (an earlier test's namespace, deleted at its end, is emptied after it)."""
    return not [
        ns
        for ns in control_plane.request("GET", "/api/v1/namespaces")["items"]
        if ns.get("status", {}).get("phase") == "Terminating"
    ]


def _namespaces_emptied(control_plane) -> str:
    """The namespaces being deleted and what their status says keeps them (for a wait's timeout message)."""
    return "; ".join(
        f"{ns['metadata']['name']}: "
        + ", ".join(c.get("message", c.get("type", "")) for c in ns.get("status", {}).get("conditions") or [])
        for ns in control_plane.request("GET", "/api/v1/namespaces")["items"]
        if ns.get("status", {}).get("phase") == "Terminating"
    )


def _looks(kubeconfig: str, namespace: str, counts, settled=lambda: True) -> dict:
    """Submit a 2-node job that runs, then (once ``settled``) count the requests of LOOKS describes of it."""
    executor = KubeflowExecutor(
        container_image="python:3.11", nodes=2, shm_size=None, namespace=namespace, kubeconfig=kubeconfig
    )
    with run.Experiment("apiload-real", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(inline="sleep 300"), name="sleeper")
        exp.run(detach=True)
    app_id = parse_app_handle(exp.jobs[0].handle)[2]
    wait_for(lambda: create_scheduler("t").describe(app_id).state == AppState.RUNNING, "running", timeout=180)
    wait_for(settled, "no other client's requests in the counts", timeout=180)
    before = counts()
    for _ in range(LOOKS):
        assert create_scheduler("status").describe(app_id).state == AppState.RUNNING
    after = counts()
    create_scheduler("t").cancel(app_id)
    return {
        key: after.get(key, 0) - before.get(key, 0)
        for key in set(after) | set(before)
        if after.get(key, 0) - before.get(key, 0)
    }


@pytest.mark.real
def test_the_real_api_server_counts_what_the_local_one_counts(real_control_plane, node_agent, real_namespace, tmp_path):
    from nemo_kubeflow_local import LocalCluster

    with LocalCluster(workdir=tmp_path / "local") as local:
        namespace = f"apiload-{uuid.uuid4().hex[:6]}"
        local.create_namespace(namespace)

        def local_counts():
            return {(c.verb, c.resource): c.requests for c in local.api_counters() if (c.verb, c.resource) in COUNTED}

        emulated = _looks(str(local.kubeconfig_path), namespace, local_counts)
    real = _looks(
        str(real_control_plane.kubeconfig_path),
        real_namespace,
        lambda: _real_counts(real_control_plane),
        settled=lambda: _no_namespace_emptied(real_control_plane),
    )
    assert emulated and sum(emulated.values()) >= LOOKS  # at least the TrainJob once per look
    for key in set(emulated) | set(real):
        mine, theirs = emulated.get(key, 0), real.get(key, 0)
        assert abs(theirs - mine) <= 0.2 * max(mine, theirs), (key, emulated, real)
