"""Warm starts across nvidia-resiliency-ext releases (docs/resilience.md#nvrx-versions): warm_start.py picks what
to patch by the release installed in the pod, and says so, once, where it cannot.

Only 0.4.1 installs here (0.5+ ship manylinux_2_39 wheels; 0.7 is Python 3.12 only), and the tests may not
reach the network. So these tests run warm_start.py against a STAND-IN package built in a temporary folder:
`nvidia_resiliency_ext` with the module layout and the names warm_start.py looks up in each release (0.4: the
legacy `_ft_rendezvous` only; 0.5/0.6: legacy and `ft_rendezvous_barrier`; 0.7: barrier only), and a
`launcher.main` that records what warm_start.py did. It is not NVRx: the real 0.6.0 and 0.7.0 sources were
checked by hand against the same code (docs/resilience.md says what was run); 0.4.1 runs for real in
test_warm_start.py and test_resilience.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_kubeflow.observe.restarts import Restarts, read_in_job_restarts
from nemo_kubeflow.pod import warm_start

# The stand-in's clock: it records the waits instead of sleeping, so what the rendezvous would wait is seen
# without timing anything.
_CLOCK = """
import time as _time

class RecordingClock:
    def __init__(self):
        self.slept = []

    def sleep(self, seconds):
        self.slept.append(seconds)

    def __getattr__(self, name):
        return getattr(_time, name)
"""

_LEGACY = (
    _CLOCK
    + """
clock = RecordingClock()

def _delay(seconds):
    clock.sleep(seconds)

class _BackendRendezvousStateHolder:
    def __init__(self, backend, settings, cache_duration=1):
        self._cache_duration = cache_duration
"""
)

_BARRIER = (
    _CLOCK
    + """
time = RecordingClock()

class _RendezvousBarrierState:
    {step2}

    def wait_for_round(self):
        time.sleep(1.0)   # a one-second poll
        time.sleep(0.1)   # a short one, left as it is
"""
)
_STEP2 = """@staticmethod
    def _compute_step2_poll_interval(min_nodes, segment_check_interval):
        return 1.0 if min_nodes < 2000 else min(segment_check_interval, min_nodes / 2000.0)"""

_LAUNCHER = """
import importlib, json, os, sys

def main():
    record = {"argv": sys.argv[1:]}
    ft = "nvidia_resiliency_ext.fault_tolerance"
    if importlib.util.find_spec(ft + "._ft_rendezvous"):
        legacy = importlib.import_module(ft + "._ft_rendezvous")
        legacy._delay(seconds=1)
        record["legacy_slept"] = legacy.clock.slept
        record["legacy_cache"] = legacy._BackendRendezvousStateHolder(None, None)._cache_duration
    if importlib.util.find_spec(ft + ".ft_rendezvous_barrier"):
        barrier = importlib.import_module(ft + ".ft_rendezvous_barrier")
        state = barrier._RendezvousBarrierState()
        state.wait_for_round()
        record["barrier_slept"] = barrier.time._clock.slept if hasattr(barrier.time, "_clock") else barrier.time.slept
        if hasattr(state, "_compute_step2_poll_interval"):
            record["step2"] = [state._compute_step2_poll_interval(2, 5.0), state._compute_step2_poll_interval(8000, 5.0)]
    with open(os.environ["STAND_IN_RECORD"], "w") as f:
        json.dump(record, f)
    return 0
"""


def stand_in_nvrx(root: Path, version: str, legacy: bool, barrier: bool, step2: bool = True) -> Path:
    """A stand-in `nvidia_resiliency_ext` of `version` under `root` (see the module docstring)."""
    package = root / "nvidia_resiliency_ext"
    ft = package / "fault_tolerance"
    ft.mkdir(parents=True)
    (package / "__init__.py").write_text('"""STAND-IN for tests, not NVRx."""\n')
    (ft / "__init__.py").write_text("")
    (ft / "launcher.py").write_text(_LAUNCHER)
    if legacy:
        (ft / "_ft_rendezvous.py").write_text(_LEGACY)
    if barrier:
        (ft / "ft_rendezvous_barrier.py").write_text(_BARRIER.format(step2=_STEP2 if step2 else "pass"))
    meta = root / f"nvidia_resiliency_ext-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-resiliency-ext\nVersion: {version}\n")
    return root


def launch(root: Path, tmp_path: Path, *options: str) -> tuple[dict, str]:
    """warm_start.py run as the pod runs it, with the stand-in first on the path: (what main recorded, stderr)."""
    record = tmp_path / "record.json"
    out = subprocess.run(
        [sys.executable, warm_start.__file__, "launch", *options, "--nnodes", "1", "--", "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root), "STAND_IN_RECORD": str(record), "TMPDIR": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(record.read_text()), out.stderr


@pytest.mark.parametrize(
    "version, legacy, barrier",
    [("0.4.1", True, False), ("0.5.0", True, True), ("0.6.0", True, True), ("0.7.0", False, True)],
)
def test_every_known_release_polls_every_poll_seconds_in_each_rendezvous_it_ships(tmp_path, version, legacy, barrier):
    root = stand_in_nvrx(tmp_path / "site", version, legacy, barrier, step2=version >= "0.6")
    record, stderr = launch(root, tmp_path, "--preload", "json", "--poll", "0.1")
    assert warm_start.NOT_APPLIED not in stderr, stderr
    # warm worker starts: ft_launcher starts each worker as this file's client, forked from the template
    assert record["argv"][:3] == ["--nnodes", "1", "--no-python"] and record["argv"][-2:] == ["client", "train.py"]
    if legacy:
        assert (record["legacy_slept"], record["legacy_cache"]) == ([0.1], 0.1)
    else:
        assert "legacy_slept" not in record  # 0.7 has no legacy module, and none is patched into being
    if barrier:
        assert record["barrier_slept"] == [0.1, 0.1]  # the one-second poll is 0.1 s; the 0.1 s one stays
        if version >= "0.6":
            assert record["step2"] == [0.1, 4.0]  # the one-second floor is 0.1 s; a large rendezvous keeps its own


def test_an_unknown_release_runs_ft_launcher_plainly_and_says_so_once(tmp_path):
    root = stand_in_nvrx(tmp_path / "site", "0.9.0", legacy=False, barrier=True)
    record, stderr = launch(root, tmp_path, "--preload", "json", "--poll", "0.1")
    assert record["argv"] == ["--nnodes", "1", "train.py"]  # no template, no client: ft_launcher as without them
    assert record["barrier_slept"] == [1.0, 0.1]  # nothing patched
    [line] = [line for line in stderr.splitlines() if warm_start.NOT_APPLIED in line]
    assert line == (
        f"{warm_start.NOT_APPLIED} worker_preload and rendezvous_poll_seconds (nvidia-resiliency-ext "
        "0.9.0 is not a release this nemo-kubeflow knows: 0.4 to 0.7; ft_launcher runs without warm "
        "starts; use an image with one of those, or a nemo-kubeflow that knows this release)"
    )


def test_a_known_release_without_the_expected_internals_keeps_warm_starts_and_says_the_poll_is_off(tmp_path):
    root = stand_in_nvrx(tmp_path / "site", "0.7.1", legacy=False, barrier=True)
    (root / "nvidia_resiliency_ext" / "fault_tolerance" / "ft_rendezvous_barrier.py").write_text("x = 1\n")
    (root / "nvidia_resiliency_ext" / "fault_tolerance" / "launcher.py").write_text(
        "import json, os, sys\ndef main():\n    json.dump({'argv': sys.argv[1:]}, open(os.environ['STAND_IN_RECORD'], 'w'))\n"
    )
    record, stderr = launch(root, tmp_path, "--preload", "json", "--poll", "0.1")
    assert "--no-python" in record["argv"]  # the warm starts do not depend on the rendezvous
    [line] = [line for line in stderr.splitlines() if warm_start.NOT_APPLIED in line]
    assert line == (
        f"{warm_start.NOT_APPLIED} rendezvous_poll_seconds (nvidia-resiliency-ext 0.7.1: "
        "ft_rendezvous_barrier has no _RendezvousBarrierState or time module; the rendezvous polls "
        "every second)"
    )


def test_the_installed_release_is_known_and_patched_without_the_stand_in():
    """0.4.1, as pip installs it here: the legacy rendezvous, patched in this process (reverted after)."""
    pytest.importorskip("nvidia_resiliency_ext")
    from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous as rendezvous

    version = warm_start.nvrx_version()
    release = warm_start.nvrx_release(version)
    assert release in warm_start.RENDEZVOUS_BY_RELEASE, version
    delay, init = rendezvous._delay, rendezvous._BackendRendezvousStateHolder.__init__
    try:
        assert warm_start._faster_rendezvous(0.1, release) == ""
        assert rendezvous._delay is not delay
    finally:
        rendezvous._delay, rendezvous._BackendRendezvousStateHolder.__init__ = delay, init


# What ft_launcher's agents log, per release (read in nvidia-resiliency-ext 0.4.1's, 0.6.0's and 0.7.0's
# launcher.py and rendezvous modules): a failure of its own worker, a peer's restart, the rendezvous joined.
LOG_0_4 = [
    "[default] Worker group FAILED. 3/3 attempts left; will restart worker group",
    "The node 'n1' has joined round 1 of the rendezvous 'job' as rank 1 in a world of size 2.",
    "[default] Worker group FAILED. 2/3 attempts left; will restart worker group",
    "The node 'n1' has joined round 2 of the rendezvous 'job' as rank 1 in a world of size 2.",
]
LOG_0_7_OWN = [
    "[default] Worker group FAILED. 3/3 attempts left; will restart worker group",
    "The node 'n1' has joined the rendezvous 'job' as rank 1 in a world of size 2.",
]
LOG_0_7_PEER = [
    "[default] Joining cluster restart (group_rank=0)",
    "The node 'n0' has joined the rendezvous 'job' as rank 0 in a world of size 2.",
    "[default] Joining cluster restart (group_rank=0)",
    "The node 'n0' has joined the rendezvous 'job' as rank 0 in a world of size 2.",
]


@pytest.mark.parametrize(
    "lines, count",
    [(LOG_0_4, 2), (LOG_0_7_OWN, 1), (LOG_0_7_PEER, 2)],
    ids=["0.4-legacy", "0.7-own-failure", "0.7-peer-restart"],
)
def test_in_job_restarts_are_counted_from_each_releases_lines(lines, count):
    assert read_in_job_restarts(lines).count == count


def test_a_setting_the_pod_did_not_apply_reaches_the_status_note():
    off = (
        f"{warm_start.NOT_APPLIED} worker_preload and rendezvous_poll_seconds (nvidia-resiliency-ext 0.9.0 is not "
        "a release this nemo-kubeflow knows: 0.4 to 0.7; ...)"
    )
    found = read_in_job_restarts(["[rank0]: step 1", off, *LOG_0_7_PEER])
    assert found.not_applied.startswith("worker_preload and rendezvous_poll_seconds (nvidia-resiliency-ext 0.9.0")
    note = Restarts(in_job=found.count, not_applied=found.not_applied).note(finished=False)
    assert note == ("2 in-job restarts by ft_launcher (no pod recreated); warning: not applied: " + found.not_applied)
    assert read_in_job_restarts(LOG_0_4).not_applied == ""


_WAITING_LAUNCHER = """
import os, sys, time

def main():
    print("stand-in ft_launcher", sys.argv[1:], flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["STAND_IN_DONE"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return 0
"""


def test_status_warns_while_the_pods_run_an_nvrx_release_it_does_not_know(cluster, tmp_path):
    """On the local cluster: the pods import a stand-in nvidia-resiliency-ext 0.9.0 (PYTHONPATH); `status` of the
    running job says that worker_preload and rendezvous_poll_seconds were not applied."""
    import nemo_run as run
    from polling import wait_for
    from test_e2e import app_id_of
    from test_resilience import ft_executor
    from torchx.specs import AppState

    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    site = stand_in_nvrx(tmp_path / "site", "0.9.0", legacy=False, barrier=True)
    (site / "nvidia_resiliency_ext" / "fault_tolerance" / "launcher.py").write_text(_WAITING_LAUNCHER)
    done = tmp_path / "done"
    executor = ft_executor(
        cluster,
        launcher=run.FaultTolerance(max_restarts=1),
        worker_preload=["json"],
        rendezvous_poll_seconds=0.1,
        env_vars={"PYTHONPATH": str(site), "STAND_IN_DONE": str(done)},
    )
    with run.Experiment("nvrx-unknown", executor=executor, log_level="WARN") as exp:
        exp.add(run.Script(path="workloads.py", entrypoint="python"), name="train")
        exp.run(detach=True)
    app_id = app_id_of(exp.jobs[0].handle)
    scheduler = create_scheduler("t")
    try:
        desc = wait_for(
            lambda: "not applied" in ((d := scheduler.describe(app_id)).msg or "") and d,
            "status to say what was not applied",
            timeout=120,
        )
        assert desc.state == AppState.RUNNING
        assert (
            "warning: not applied: worker_preload and rendezvous_poll_seconds (nvidia-resiliency-ext 0.9.0 is "
            "not a release this nemo-kubeflow knows"
        ) in desc.msg, desc.msg
    finally:
        done.touch()
    wait_for(lambda: scheduler.describe(app_id).state == AppState.SUCCEEDED, "the job to succeed", timeout=120)
