"""Warm worker starts (``worker_preload``) and short rendezvous polls (``rendezvous_poll_seconds``) for
ft_launcher, on the local cluster (real HTTP, real processes): docs/resilience.md#warm-worker-starts."""

import json
import os
import re
import signal
import tempfile
import uuid
from pathlib import Path

import nemo_run as run
import pytest
import workloads
from polling import wait_for
from test_e2e import app_id_of
from test_resilience import ft_executor

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.errors import ConfigError
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.pod.warm_start import POD_FILE_PREFIX

FT = run.FaultTolerance(max_restarts=3, initial_rank_heartbeat_timeout=120, rank_heartbeat_timeout=60)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


#: In the env of every process of this module's jobs: other work on the machine (another test's ft_launcher,
#: say) is never taken for ours.
MARKER_ENV = "NEMO_KUBEFLOW_TEST_MARKER"


def clients(rank: int, marker: str) -> list[int]:
    """The processes ft_launcher started for global rank ``rank`` of the job whose env has ``marker``:
    warm_start.py's clients."""
    mine = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = cmdline(int(entry.name))
            env = (entry / "environ").read_bytes().split(b"\0")
        except (ValueError, OSError):
            continue
        if (
            "client" in argv
            and any("nemo-kubeflow-warm-start-" in a for a in argv)
            and f"RANK={rank}".encode() in env
            and mine in env
        ):
            found.append(int(entry.name))
    return found


def records(directory: Path) -> list[dict]:
    """What each worker wrote when it started (workloads.warm_steps), oldest first."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("rank*.json"), key=lambda p: p.stat().st_mtime_ns)]


@pytest.mark.needs_torch
def test_killed_rank_restarts_from_the_pods_template_and_a_cancel_leaves_no_process(cluster, tmp_path):
    executor = ft_executor(cluster, launcher=FT, worker_preload=["torch", "workloads"], rendezvous_poll_seconds=0.1)
    marker = uuid.uuid4().hex
    executor.env_vars = {**executor.env_vars, MARKER_ENV: marker}
    with run.Experiment("warm", executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(workloads.warm_steps, steps=100_000, pid_dir=str(tmp_path)), name="train")
        exp.run(detach=True)
    app_id = app_id_of(exp.jobs[0].handle)
    try:
        first = wait_for(
            lambda: len(records(tmp_path)) == 2 and records(tmp_path), "both ranks' first records", timeout=120
        )
        templates = {r["ppid"] for r in first}
        for record in first:
            # Forked: the parent is the pod's template (a fork of the launcher, with its command line), and
            # the preloaded module was imported there, not in the worker.
            assert record["imported_by"] != record["pid"]
            assert "launch" in cmdline(record["ppid"]) and "--preload" in cmdline(record["ppid"])
        assert len(templates) == 2  # one per pod
        launchers = {int(Path(f"/proc/{t}/stat").read_text().rsplit(")", 1)[1].split()[1]) for t in templates}
        copies = [Path(tempfile.gettempdir(), f"{POD_FILE_PREFIX}{pid}.py") for pid in launchers]
        assert all(c.exists() for c in copies), copies  # what the clients run, one per pod

        # SIGKILL of the process ft_launcher started for rank 1: its worker dies with it, every rank restarts.
        [client] = clients(1, marker)
        os.kill(client, signal.SIGKILL)
        wait_for(
            lambda: not alive(next(r["pid"] for r in first if r["rank"] == 1)),
            "the killed rank 1 to be gone",
            timeout=30,
        )
        second = wait_for(
            lambda: len(records(tmp_path)) == 4 and records(tmp_path)[2:], "the restarted ranks' records", timeout=120
        )
        assert {r["ppid"] for r in second} == templates  # the same templates: no new Python, no new pod
        assert not any(alive(r["pid"]) for r in first)

        # SIGKILL of rank 1's worker itself (the training process, as in the recovery benchmark).
        os.kill(next(r["pid"] for r in second if r["rank"] == 1), signal.SIGKILL)
        third = wait_for(
            lambda: len(records(tmp_path)) == 6 and records(tmp_path)[4:], "the second restart's records", timeout=120
        )
        assert {r["ppid"] for r in third} == templates
        started = [clients(rank, marker) for rank in (0, 1)]
        assert all(len(c) == 1 for c in started), started

        # A cancel: the pods get SIGTERM, ft_launcher passes it to the clients, they pass it to the workers.
        create_scheduler("t").cancel(app_id)
        wait_for(
            lambda: all((tmp_path / f"sigterm-{r['pid']}").exists() for r in third),
            "SIGTERM in every worker",
            timeout=60,
        )
        left = [*(r["pid"] for r in records(tmp_path)), *templates, *launchers, *(pid for c in started for pid in c)]
        wait_for(lambda: not any(alive(pid) for pid in left), "no process of the job left", timeout=60)
        # Nor the copies of warm_start.py that the pod scripts wrote (the pods' /tmp is this machine's).
        assert not any(c.exists() for c in copies), copies
    finally:
        create_scheduler("t").cancel(app_id)


def test_a_script_that_is_not_python_cannot_be_preloaded(cluster):
    """A bash script runs under ft_launcher --no-python: nothing to fork it from; refused offline."""
    executor = KubeflowExecutor(
        container_image="python:3.11",
        nodes=2,
        kubeconfig=str(cluster.kubeconfig_path),
        launcher="ft",
        worker_preload=["torch"],
    )
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "worker_preload forks Python workers, but this task's workers are not Python (ft_launcher --no-python: "
            "a run.Script whose entrypoint is not 'python'); leave worker_preload empty"
        ),
    ):
        with run.Experiment("warm-bash", executor=executor, log_level="WARN") as exp:
            exp.add(run.Script(inline="echo hi"), name="train")
            exp.run(sequential=True)


WORKER = """
import json, os, sys, time
# One write: the two ranks share the launcher's stdout, and `python -u`'s print writes the newline apart.
os.write(1, (json.dumps({"rank": os.environ["RANK"], "local": os.environ["LOCAL_RANK"], "argv": sys.argv,
                         "cwd": os.getcwd(), "torch": "torch" in sys.modules, "ppid": os.getppid()}) + "\\n").encode())
if os.environ["RANK"] == "0":
    open("rank0-printed", "w").close()
    sys.exit(0)
deadline = time.monotonic() + 120  # fail once rank 0 has printed: ft_launcher would stop it otherwise
while not os.path.exists("rank0-printed") and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3)
"""


@pytest.mark.needs_torch
@pytest.mark.parametrize(
    "options", [["--preload", "torch", "--poll", "0.1"], ["--poll", "0.1"]], ids=["preload", "poll-only"]
)
def test_two_local_ranks_get_their_own_argv_env_and_exit_code(tmp_path, options):
    """warm_start.py run as the pod runs it, 1 node x 2 processes: each worker gets its rank's environment, the
    script's arguments and directory; rank 1's exit code 3 reaches ft_launcher as a plain Python's would."""
    import socket
    import subprocess
    import sys

    from nemo_kubeflow.pod import warm_start

    pytest.importorskip("nvidia_resiliency_ext")
    (tmp_path / "worker.py").write_text(WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = subprocess.Popen(
        [
            sys.executable,
            warm_start.__file__,
            "launch",
            *options,
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "t",
            "--rdzv-conf",
            "is_host=1",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "0",
            "--",
            "worker.py",
            "--lr",
            "0.1",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    out = subprocess.CompletedProcess(launcher.args, 0, *launcher.communicate(timeout=180))
    lines = sorted(
        (json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")), key=lambda r: r["rank"]
    )
    assert [(r["rank"], r["local"], r["argv"], r["cwd"]) for r in lines] == [
        (str(rank), str(rank), ["worker.py", "--lr", "0.1"], str(tmp_path)) for rank in (0, 1)
    ], out.stdout
    # Preloaded: torch is there before the script imports it, and the workers' parent is the template, not the
    # launcher (ft_launcher runs in it). Without it, new Pythons that ft_launcher started itself.
    assert {r["torch"] for r in lines} == {"--preload" in options}
    assert {r["ppid"] == launcher.pid for r in lines} == {"--preload" not in options}
    # ft_launcher saw rank 1 end as a plain Python would have (it then exits 0 when rank 0 succeeded: its policy).
    assert "failed (exitcode: 3) local_rank: 1" in out.stderr, out.stderr[-3000:]
    assert not list(tmp_path.glob("nemo-kubeflow-warm-*")), "the template's socket is removed when the launcher ends"


def test_a_client_without_its_template_starts_the_worker_in_a_new_python(tmp_path):
    """The template gone (killed by hand, out of memory): the worker still starts, as a new Python, and says so."""
    import subprocess
    import sys

    from nemo_kubeflow.pod import warm_start

    (tmp_path / "worker.py").write_text("import sys; print('args', sys.argv[1:]); sys.exit(4)")
    out = subprocess.run(
        [sys.executable, "-I", "-S", warm_start.__file__, "client", "worker.py", "x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, warm_start.SOCKET_ENV: str(tmp_path / "gone.sock")},
    )
    assert (out.returncode, out.stdout) == (4, "args ['x']\n"), out
    assert out.stderr.startswith(
        "nemo-kubeflow: warm start unavailable (FileNotFoundError(2, 'No such file or "
        "directory')); starting the worker in a new Python"
    ), out.stderr
