"""Shared fixtures: an isolated NEMORUN_HOME for every test, its watches paused at its end, a local cluster per
module, the console scripts of this Python's environment; and the `needs_torch` marker."""

import gc
import importlib.util
import sys
from pathlib import Path

import pytest
from nemo_run.config import get_nemorun_home, set_nemorun_home

from nemo_kubeflow_local import LocalCluster

NO_TORCH = "torch is not installed: pip install torch==2.13.0"


def pytest_runtest_setup(item):
    """`@pytest.mark.needs_torch`: the test runs torch or torchrun (in this process or in the local
    cluster's pods, which run this Python's torchrun); without torch it skips, saying how to install it."""
    if item.get_closest_marker("needs_torch") and importlib.util.find_spec("torch") is None:
        pytest.skip(NO_TORCH)


#: How long a test may run past its pytest-timeout, and the interpreter take to end after the summary, before
#: the run is ended, failed, with every thread's stack (each takes seconds when nothing hangs).
EXIT_GRACE_S = 120


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """pytest-timeout fails a test that runs too long by raising once in the main thread; a test that then
    hangs again (leaving `with run.Experiment(...)` waits for its job in NeMo-Run's ThreadPoolExecutor, and
    the pool's exit joins that thread, which waits out a job that will not end) would run until CI's own
    timeout, its output unprinted. EXIT_GRACE_S past the timeout, faulthandler writes every thread's stack to
    stderr and exits 1."""
    import faulthandler

    marker = item.get_closest_marker("timeout")
    timeout = float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 0)
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout + EXIT_GRACE_S, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        if timeout > 0:
            faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """A run ends after its summary. A thread that the interpreter joins at exit (not a daemon: a
    ThreadPoolExecutor's worker, such as NeMo-Run's wait on a job that a timed-out test left running through
    an API server since stopped, which it waits out as an outage) would keep the process alive with no output,
    and CI would end on its own timeout, unexplained. If the process still runs EXIT_GRACE_S from now,
    faulthandler writes every thread's stack to stderr and exits 1."""
    import faulthandler

    sys.stdout.flush()
    sys.stderr.flush()
    faulthandler.dump_traceback_later(EXIT_GRACE_S, exit=True, file=sys.__stderr__)


@pytest.fixture(autouse=True)
def nemorun_home(tmp_path, monkeypatch):
    """Experiments, app records and job dirs go to a per-test directory, also for subprocesses."""
    home = tmp_path / "nemorun_home"
    home.mkdir()
    previous = get_nemorun_home()
    set_nemorun_home(str(home))
    monkeypatch.setenv("NEMORUN_HOME", str(home))
    yield home
    set_nemorun_home(previous)


@pytest.fixture(autouse=True)
def earlier_experiments_collected(request):
    """A test that reads its log records (`caplog`) starts with every unreachable object collected. NeMo-Run's
    `Experiment.__del__` removes the root logger's first handler (its `deconfigure_logging`): an earlier test's
    Experiment, left in a reference cycle and collected in the middle of this test, removed caplog's handler
    and the test saw no record (test_progress_reporter after test/unit/cli's experiments, in one run order)."""
    if "caplog" in request.fixturenames:
        gc.collect()


@pytest.fixture(autouse=True)
def watches_of_the_test_paused():
    """The sets of watches that a test's looks started are paused at its end (the next read starts them again).
    Each holds one of the process's `MAX_WATCHED_SETS` slots until nobody has read it for `IDLE_STOP_S` (2
    minutes), its module's local cluster stopped or not: a later test's job found the cap full, went unwatched,
    and its nodes were followed instead of read on trouble (CI: test_node_log_keeper's in-job restart tests)."""
    watched = sys.modules.get("nemo_kubeflow.cluster.watched")  # not imported by this fixture: nothing to pause
    before = set(watched._watching) if watched is not None else set()
    yield
    watched = sys.modules.get("nemo_kubeflow.cluster.watched")
    if watched is None:
        return
    with watched._watching_lock:
        started = [w for w in watched._sets.values() if id(w) in watched._watching and id(w) not in before]
    for watches in started:
        watches.pause()


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    """A local cluster shared by the tests of one module (a module may count requests, inject faults
    or list objects across namespaces, so modules do not share one); stopped after the module."""
    with LocalCluster(workdir=tmp_path_factory.mktemp("local-cluster")) as started:
        yield started


# The modules call it `cluster`, or `local` where `cluster` is their KubernetesCluster client: two names
# for the one fixture above, so a module overriding either (test_submit, test_concurrency) stays simple.
@pytest.fixture(scope="module")
def cluster(local_cluster):
    return local_cluster


@pytest.fixture(scope="module")
def local(local_cluster):
    return local_cluster


@pytest.fixture(scope="session")
def console_script():
    """The path of a console script (`nemo`, `nemo-kubeflow`) of the environment running the tests: next to
    sys.executable, so the tests need not have that environment's bin directory on PATH."""

    def path(name: str) -> str:
        script = Path(sys.executable).parent / name
        if not script.is_file():
            pytest.fail(
                f"console script {name!r} not found next to {sys.executable}: install the project into "
                f"this environment (pip install -e .)"
            )
        return str(script)

    return path


# ---------------------------------------------------------------- the `real` control plane
# Tests marked `real` run on the upstream kube-apiserver, Trainer, JobSet and Kueue controllers
# (test/controlplane/, docs/real-control-plane.md). They are deselected by default (pyproject's
# addopts `-m "not real"`); `python -m pytest -q -m real` builds the binaries once (outside the
# test timeouts: here, at collection) and runs them.
REAL_BUILD = pytest.StashKey[object]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Build (or reuse) the control plane only when a selected test is marked `real`."""
    if config.option.collectonly or not any(item.get_closest_marker("real") for item in items):
        return
    from controlplane import BuildUnavailable, ensure_built

    try:
        config.stash[REAL_BUILD] = ensure_built(out=sys.__stderr__)
    except BuildUnavailable as exc:
        config.stash[REAL_BUILD] = exc


def pytest_itemcollected(item):
    """Mark `minor_sensitive` the `real` scenarios whose outcome depends on the Kubernetes minor, as listed (with
    why) once, in test/controlplane/versions.py's MINOR_SENSITIVE; before `-m` deselects, so `-m "real and
    minor_sensitive"` selects them (.ci/run, on the matrix entries other than the pinned one)."""
    from controlplane.versions import MINOR_SENSITIVE

    if item.nodeid.split("[")[0] in MINOR_SENSITIVE:
        item.add_marker("minor_sensitive")


UNAVAILABLE = "real control plane unavailable"
_UNAVAILABLE_LINE = sys._getframe().f_lineno


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Report the skips of an unavailable control plane at one place, so `-ra` folds them into one line."""
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and isinstance(report.longrepr, tuple)
        and report.longrepr[2].startswith(f"Skipped: {UNAVAILABLE}")
    ):
        report.longrepr = (__file__, _UNAVAILABLE_LINE, report.longrepr[2])


@pytest.fixture(scope="session")
def real_control_plane(request, tmp_path_factory):
    """The upstream control plane on loopback, for the session; every process stopped at the end."""
    from controlplane import RealControlPlane

    built = request.config.stash.get(REAL_BUILD, None)
    if isinstance(built, Exception):
        pytest.skip(f"{UNAVAILABLE}: {built}")
    if built is None:
        pytest.fail("the real_control_plane fixture is only for tests marked `real`")
    with RealControlPlane(built, tmp_path_factory.mktemp("real-control-plane")) as control_plane:
        yield control_plane


@pytest.fixture()
def real_namespace(real_control_plane):
    """A fresh namespace on the real control plane, deleted after the test."""
    name = real_control_plane.create_namespace()
    yield name
    real_control_plane.delete_namespace(name)


# ---------------------------------------------------------------- the scenarios on both back ends
# test_backends.py and test_backends_resilience.py run each scenario through the `backend` fixture: on the
# local cluster and (marked `real`) on the upstream control plane with our node agent running the pods.
#: The node agent's Nodes for those scenarios (three, so that a node can be avoided by a 2-node job).
AGENT_NODES = ("agent-a", "agent-b", "agent-c")
#: The taint the real back end fails a node with (no pod tolerates it: the taint-eviction controller
#: deletes them at once).
NODE_FAULT_TAINT = {"key": "nemo-kubeflow.test/node-fault", "value": "broken", "effect": "NoExecute"}


@pytest.fixture(scope="module")
def node_agent(real_control_plane, tmp_path_factory):
    from controlplane.cluster import TRAINER_SERVICE_HOST

    from nemo_kubeflow_local.kubelet.nodeagent import NodeAgent, NodeSpec

    serving = real_control_plane.certs.issue("node-agent", "nemo-kubeflow-node-agent")
    nodes = [NodeSpec(name, cpu="8", memory="32Gi") for name in AGENT_NODES]
    with NodeAgent(
        real_control_plane.kubeconfig_path,
        nodes,
        tmp_path_factory.mktemp("agent"),
        serving_cert=serving,
        service_hosts=(TRAINER_SERVICE_HOST,),
    ) as running:
        yield running


@pytest.fixture(params=["local", pytest.param("real", marks=pytest.mark.real)])
def backend(request, tmp_path_factory):
    """A `backends.Backend` with a fresh namespace. `@pytest.mark.backend_nodes(3)`: the local one is a
    cluster of its own whose kubelet schedules onto three virtual nodes (the real one always has the
    node agent's three Nodes). `@pytest.mark.backend_gates("TrainJobStatus")`: the local one is a cluster of
    its own with those Trainer feature gates on (the real stage always runs Trainer with them)."""
    from backends import API_PATHS, Backend

    wanted = request.node.get_closest_marker("backend_nodes")
    gates = request.node.get_closest_marker("backend_gates")
    if request.param == "local":

        def local(cluster, namespace, **more):
            cluster.create_namespace(namespace)
            return Backend(
                "local",
                str(cluster.kubeconfig_path),
                namespace,
                lambda resource: cluster.objects(resource, namespace),
                **more,
            )

        if wanted or gates:
            names = tuple(f"node-{chr(ord('a') + i)}" for i in range(wanted.args[0] if wanted else 0))
            with LocalCluster(
                workdir=tmp_path_factory.mktemp("local-cluster"), feature_gates=tuple(gates.args) if gates else ()
            ) as cluster:
                if names:
                    cluster.add_virtual_nodes(*names)
                yield local(cluster, "local-0", fail_node=cluster.lose_node if names else None)
            return
        cluster = request.getfixturevalue("local_cluster")
        made = local(cluster, f"local-{len(cluster.objects('namespaces'))}")
        yield made
        made.clean_up()
        return
    cp = request.getfixturevalue("real_control_plane")
    request.getfixturevalue("node_agent")
    namespace = request.getfixturevalue("real_namespace")

    def list_objects(resource):
        return cp.request("GET", f"{API_PATHS[resource]}/namespaces/{namespace}/{resource}")["items"]

    volumes = []

    def provide_volume(claim, size):
        volumes.append(f"{namespace}-{claim}")
        cp.request(
            "POST",
            "/api/v1/persistentvolumes",
            {
                "metadata": {"name": volumes[-1]},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                    "hostPath": {"path": f"/tmp/{volumes[-1]}"},  # never read: the node agent keeps its own directory
                    "claimRef": {"namespace": namespace, "name": claim},
                    "persistentVolumeReclaimPolicy": "Retain",
                },
            },
        )

    def fail_node(node):
        def pods_on_node():
            return [p for p in list_objects("pods") if p["spec"].get("nodeName") == node]

        patch = "application/merge-patch+json"
        cp.request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"taints": [NODE_FAULT_TAINT]}}, content_type=patch)
        try:
            cp.wait_for(
                lambda: not pods_on_node(),
                f"the taint-eviction controller to delete the pods on {node}",
                timeout=120,
                component="kube-controller-manager",
            )
        finally:  # the node comes back
            cp.request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"taints": None}}, content_type=patch)

    real = Backend("real", str(cp.kubeconfig_path), namespace, list_objects, provide_volume, fail_node=fail_node)
    yield real
    real.clean_up()
    for volume in volumes:
        cp.request("DELETE", f"/api/v1/persistentvolumes/{volume}")
