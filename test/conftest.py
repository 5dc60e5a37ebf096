"""Shared fixtures: an isolated NEMORUN_HOME for every test, a local cluster per module, the console
scripts of this Python's environment; and the `needs_torch` marker."""

import importlib.util
import sys
from pathlib import Path

import pytest
from nemo_run.config import get_nemorun_home, set_nemorun_home

from nemo_kubeflow.local import LocalCluster

NO_TORCH = "torch is not installed: pip install torch==2.13.0"


def pytest_runtest_setup(item):
    """`@pytest.mark.needs_torch`: the test runs torch or torchrun (in this process or in the local
    cluster's pods, which run this Python's torchrun); without torch it skips, saying how to install it."""
    if item.get_closest_marker("needs_torch") and importlib.util.find_spec("torch") is None:
        pytest.skip(NO_TORCH)


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
            pytest.fail(f"console script {name!r} not found next to {sys.executable}: install the project into "
                        f"this environment (pip install -e .)")
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


UNAVAILABLE = "real control plane unavailable"
_UNAVAILABLE_LINE = sys._getframe().f_lineno


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Report the skips of an unavailable control plane at one place, so `-ra` folds them into one line."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(report.longrepr, tuple) and report.longrepr[2].startswith(
            f"Skipped: {UNAVAILABLE}"):
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
