"""The container command: run with real bash, against a fake torchrun that prints its argv."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from nemo_run.run.torchx_backend.components import ft_launcher as nr_ft_launcher
from nemo_run.run.torchx_backend.components import torchrun as nr_torchrun

from nemo_kubeflow.build.command import build_launch, split_torchrun_args
from nemo_kubeflow.config.executor import KubeflowExecutor
from nemo_kubeflow_local.kubelet.environment import expand

PET = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "4",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "job-node-0-0.job",
    "PET_MASTER_PORT": "29500",
}


@pytest.fixture()
def fake_bin(tmp_path):
    """A bin dir with `torchrun` and `python` stand-ins that print their arguments as JSON."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("torchrun", "python", "ft_launcher"):
        path = bindir / tool
        path.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps([{tool!r}] + sys.argv[1:]))\n")
        path.chmod(0o755)
    return bindir


def run_launch(launch, fake_bin, workspace, extra_env=None):
    env = {"PATH": f"{fake_bin}:{os.environ['PATH']}", **PET, **(extra_env or {})}
    # As the kubelet passes them: after Kubernetes' `$(VAR)` expansion of command and args.
    argv = [expand(a, env) for a in launch.command + launch.args]
    out = subprocess.run(argv, env=env, cwd=workspace, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[")]


def torchrun_role(*script_args, script="train.py", m=None, nnodes=2, nproc=4):
    """The role NeMo-Run's Torchrun launcher really produces, after our macro values."""
    app = nr_torchrun.torchrun(
        *script_args, script=None if m else script, m=m, j=f"{nnodes}x{nproc}", rdzv_backend="c10d"
    )
    role = app.roles[0]
    return KubeflowExecutor(container_image="img").macro_values().apply(role)


def test_torchrun_launcher_gets_pet_flags_and_keeps_its_other_flags(fake_bin, tmp_path):
    role = torchrun_role("--lr", "0.1", "--name", 'it\'s a "test" run')
    launch = build_launch(role.entrypoint, role.args, args_are_quoted=True, distributed=True, workspace=str(tmp_path))
    [argv] = run_launch(launch, fake_bin, tmp_path)
    assert argv[:11] == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
        "--node-rank",
        "1",
        "--master-addr",
        "job-node-0-0.job",
        "--master-port",
        "29500",
    ]
    # NeMo-Run's c10d rendezvous flags are replaced; --tee is kept; arguments survive quoting.
    assert "--rdzv-backend" not in argv and "--rdzv-endpoint" not in argv
    assert argv[11:] == ["--tee", "3", "train.py", "--lr", "0.1", "--name", 'it\'s a "test" run']
    assert launch.uses_torchrun


def ft_role(*script_args, **ft_settings):
    """The role NeMo-Run's FaultTolerance launcher produces (packaging.py passes these), after our macros."""
    app = nr_ft_launcher.ft_launcher(*script_args, script="train.py", j="2x4", rdzv_backend="c10d", **ft_settings)
    return KubeflowExecutor(container_image="img").macro_values().apply(app.roles[0])


def test_ft_launcher_gets_a_c10d_rendezvous_per_trainjob_and_attempt(fake_bin, tmp_path):
    role = ft_role(
        "--lr",
        "0.1",
        max_restarts=3,
        rank_heartbeat_timeout=45.0,
        initial_rank_heartbeat_timeout=120.0,
        workload_check_interval=5.0,
        rank_termination_signal="SIGKILL",
        log_level="DEBUG",
    )
    launch = build_launch(
        role.entrypoint,
        role.args,
        args_are_quoted=True,
        distributed=True,
        workspace=str(tmp_path),
        rendezvous_id="exp-train",
    )
    for rank, attempt, is_host in (("0", {"NEMO_KUBEFLOW_RESTART_ATTEMPT": "2"}, "1"), ("1", {}, "0")):
        [argv] = run_launch(launch, fake_bin, tmp_path, {**attempt, "PET_NODE_RANK": rank})
        assert argv[:13] == [
            "ft_launcher",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "job-node-0-0.job:29500",
            "--rdzv-id",
            f"exp-train-{attempt.get('NEMO_KUBEFLOW_RESTART_ATTEMPT', '0')}",
            "--rdzv-conf",
            f"is_host={is_host}",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "4",
        ]
        # NeMo-Run's own rendezvous flags are gone, the FT settings and --max-restarts pass through.
        rest = argv[13:]
        assert "--node-rank" not in rest and "--rdzv-endpoint" not in rest and "--nnodes" not in rest
        assert rest == [
            "--ft-workload_check_interval",
            "5.0",
            "--ft-initial_rank_heartbeat_timeout",
            "120.0",
            "--ft-rank_heartbeat_timeout",
            "45.0",
            "--ft-rank_termination_signal",
            "SIGKILL",
            "--ft-log_level",
            "DEBUG",
            "--max-restarts",
            "3",
            "--tee",
            "3",
            "train.py",
            "--lr",
            "0.1",
        ]


def test_ft_launcher_without_settings_drops_the_deprecated_flag(fake_bin, tmp_path):
    role = ft_role()
    assert "--ignore-missing-fault-tol-cfg" in role.args  # what NeMo-Run 0.11 generates
    launch = build_launch(role.entrypoint, role.args, args_are_quoted=True, distributed=True, workspace=str(tmp_path))
    [argv] = run_launch(launch, fake_bin, tmp_path)
    assert "--ignore-missing-fault-tol-cfg" not in argv
    assert argv[-3:] == ["--tee", "3", "train.py"] and argv[6] == "nemo-0"


def test_torchrun_launcher_module(fake_bin, tmp_path):
    role = torchrun_role("-n", "task", "/nemo_run/job/configs/cfg", m="nemo_run.core.runners.fdl_runner")
    launch = build_launch(role.entrypoint, role.args, args_are_quoted=True, distributed=True, workspace="/nemo_run")
    kept, rest = split_torchrun_args(role.args)
    assert kept == ["--tee", "3", "-m"]
    assert rest == ["nemo_run.core.runners.fdl_runner", "-n", "task", "/nemo_run/job/configs/cfg"]
    assert launch.command_line.endswith("-m nemo_run.core.runners.fdl_runner -n task /nemo_run/job/configs/cfg")


@pytest.mark.parametrize(
    "call, expected",
    [
        # No flags: all five added before the user's arguments.
        (
            "torchrun train.py --epochs 2",
            [
                "--nnodes",
                "2",
                "--nproc-per-node",
                "4",
                "--node-rank",
                "1",
                "--master-addr",
                "job-node-0-0.job",
                "--master-port",
                "29500",
                "train.py",
                "--epochs",
                "2",
            ],
        ),
        # The user's own --nproc-per-node is kept; the script's "--nnodes 9" is a script argument.
        (
            "torchrun --nproc-per-node=3 train.py --nnodes 9",
            [
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--master-addr",
                "job-node-0-0.job",
                "--master-port",
                "29500",
                "--nproc-per-node=3",
                "train.py",
                "--nnodes",
                "9",
            ],
        ),
        # Explicit rendezvous: no master/rank flags forced on it.
        (
            "torchrun --rdzv-endpoint host:1234 --rdzv-backend c10d train.py",
            [
                "--nnodes",
                "2",
                "--nproc-per-node",
                "4",
                "--rdzv-endpoint",
                "host:1234",
                "--rdzv-backend",
                "c10d",
                "train.py",
            ],
        ),
        # --standalone is single-node by definition.
        ("torchrun --standalone --nproc_per_node 2 train.py", ["--standalone", "--nproc_per_node", "2", "train.py"]),
    ],
)
def test_bash_script_calling_torchrun_gets_missing_pet_flags(fake_bin, tmp_path, call, expected):
    script = tmp_path / "scripts" / "task.sh"
    script.parent.mkdir()
    script.write_text(f"#!/usr/bin/bash\nset -e\n{call}\n")
    launch = build_launch("bash", [str(script)], args_are_quoted=False, distributed=True, workspace=str(tmp_path))
    [argv] = run_launch(launch, fake_bin, tmp_path)
    assert argv == ["torchrun", *expected]
    assert not launch.uses_torchrun


def test_non_distributed_task_is_not_wrapped(fake_bin, tmp_path):
    launch = build_launch(
        "python",
        ["train.py", "--msg", "a b; rm -rf /"],
        args_are_quoted=False,
        distributed=False,
        workspace=str(tmp_path),
    )
    [argv] = run_launch(launch, fake_bin, tmp_path)
    assert argv == ["python", "train.py", "--msg", "a b; rm -rf /"]
    assert not launch.uses_torchrun


def test_distributed_python_without_launcher_runs_under_torchrun(fake_bin, tmp_path):
    launch = build_launch(
        "python",
        ["-m", "nemo_run.core.runners.fdl_runner", "-n", "t", "/nemo_run/t/configs/c"],
        args_are_quoted=False,
        distributed=True,
        workspace=str(tmp_path),
    )
    [argv] = run_launch(launch, fake_bin, tmp_path)
    assert argv[:11] == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
        "--node-rank",
        "1",
        "--master-addr",
        "job-node-0-0.job",
        "--master-port",
        "29500",
    ]
    # The workspace moved to tmp_path, so NeMo-Run's /nemo_run paths follow it.
    assert argv[11:] == ["-m", "nemo_run.core.runners.fdl_runner", "-n", "t", f"{tmp_path}/t/configs/c"]


def test_prologue_exports_pythonpath_and_workdir(fake_bin, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    launch = build_launch(
        "bash",
        ["-c", 'echo "[\\"$PWD\\", \\"$PYTHONPATH\\", \\"$LD_LIBRARY_PATH\\"]"'],
        args_are_quoted=False,
        distributed=False,
        workspace=str(tmp_path),
        workdir=str(code),
        pythonpath=[str(code)],
        exports={"LD_LIBRARY_PATH": '/usr/local/nvidia/lib64"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"'},
    )
    [out] = run_launch(launch, fake_bin, tmp_path, extra_env={"PYTHONPATH": "/img", "LD_LIBRARY_PATH": "/img/lib"})
    assert out == [str(code), f"{code}:/img", "/usr/local/nvidia/lib64:/img/lib"]


def test_moved_workspace_rewrites_nemo_run_paths():
    launch = build_launch(
        "bash", ["/nemo_run/scripts/t.sh"], args_are_quoted=False, distributed=False, workspace="/workspace"
    )
    assert launch.command_line == "bash /workspace/scripts/t.sh"
    assert "set -x" not in launch.args[0]


def test_ft_launcher_with_worker_preload_runs_inside_warm_start(fake_bin, tmp_path):
    """worker_preload and rendezvous_poll_seconds: the script writes warm_start.py into the pod (bash builtins
    only) and runs ft_launcher through it with the same flags; ``-m`` becomes warm_start's ``--module``."""
    from nemo_kubeflow.pod import warm_start

    (fake_bin / "python3").write_text((fake_bin / "python").read_text().replace("'python'", "'python3'"))
    (fake_bin / "python3").chmod(0o755)
    app = nr_ft_launcher.ft_launcher(
        "-n", "task", m="nemo_run.core.runners.fdl_runner", j="2x4", rdzv_backend="c10d", max_restarts=2
    )
    role = KubeflowExecutor(container_image="img").macro_values().apply(app.roles[0])
    launch = build_launch(
        role.entrypoint,
        role.args,
        args_are_quoted=True,
        distributed=True,
        workspace=str(tmp_path),
        rendezvous_id="exp-train",
        worker_preload=["torch", "my_pkg.models"],
        rendezvous_poll_seconds=0.1,
    )
    [argv] = run_launch(launch, fake_bin, tmp_path, {"TMPDIR": str(tmp_path)})
    assert argv[0] == "python3" and re.fullmatch(rf"{tmp_path}/nemo-kubeflow-warm-start-\d+\.py", argv[1]), argv
    assert Path(argv[1]).read_text() == Path(warm_start.__file__).read_text()
    assert argv[2:9] == ["launch", "--preload", "torch,my_pkg.models", "--poll", "0.1", "--module", "--rdzv-backend"]
    assert argv[9:20] == [
        "c10d",
        "--rdzv-endpoint",
        "job-node-0-0.job:29500",
        "--rdzv-id",
        "exp-train-0",
        "--rdzv-conf",
        "is_host=0",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
    ]
    assert argv[20:] == ["--max-restarts", "2", "--tee", "3", "--", "nemo_run.core.runners.fdl_runner", "-n", "task"]
    # Without the settings, ft_launcher itself, as before.
    plain = build_launch(role.entrypoint, role.args, args_are_quoted=True, distributed=True, workspace=str(tmp_path))
    assert plain.command_line.startswith("ft_launcher ") and "warm" not in plain.args[0]
