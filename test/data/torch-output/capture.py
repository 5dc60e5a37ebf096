"""Capture real launcher output for test/unit/observe/test_rank_failure_real_output.py.

Runs a worker script of this folder under the launcher as a TrainJob's pods do: the container command that
``nemo_kubeflow.build.command.build_launch`` writes (``bash -c``, the rank prefix template, ``exec torchrun`` with
the PET flags, NeMo-Run's ``--tee 3``), once per node with the PET variables Trainer sets, two processes a node, on
the CPU (gloo). A pod's log is its stdout and stderr together: so is each ``.log`` file written here, into the
folder of its torch's minor version (``2.13/``). Run from the repository root:

    python test/data/torch-output/capture.py [--venv DIR] [NAME ...]

The launchers and workers are those of the virtual environment ``DIR`` (torch, and nvidia-resiliency-ext for
ft_launcher, installed in it), else of this Python's; this script itself needs only this project. A launcher the
environment does not have is left out (said on stdout). Each file's first line says the date, the versions of torch,
Python and nvidia-resiliency-ext, the exit code and the command that wrote it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from nemo_kubeflow.build.command import build_launch

HERE = Path(__file__).parent
#: What NeMo-Run's torchrun component passes (the PET flags replace its rendezvous and size flags).
TORCHRUN_ARGS = ["--nnodes", "1", "--nproc-per-node", "2", "--node-rank", "0", "--tee", "3"]
#: What NeMo-Run's ft_launcher component passes (its torchrun component's), less the fault tolerance settings.
FT_ARGS = [*TORCHRUN_ARGS, "--max-restarts", "0"]
#: The task's own prefix template, which the pod script keeps: torchrun's default prefix, ``[default1]:``.
ROLE_PREFIX = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${role_name}${local_rank}]:"}


@dataclass(frozen=True)
class Run:
    launcher: str
    args: list[str]
    script: str
    #: The variables the task sets.
    env: dict[str, str] = field(default_factory=dict)
    nodes: int = 1


RUNS = {
    "torchrun-raise-after-init": Run("torchrun", TORCHRUN_ARGS, "raise_after_init.py"),
    "torchrun-raise-before-init": Run("torchrun", TORCHRUN_ARGS, "raise_before_init.py"),
    "torchrun-role-prefix-raise-after-init": Run("torchrun", TORCHRUN_ARGS, "raise_after_init.py", ROLE_PREFIX),
    "torchrun-no-tee-raise-after-init": Run("torchrun", TORCHRUN_ARGS[:-2], "raise_after_init.py"),
    # Two nodes: rank 3 is node 1's local rank 1.
    "torchrun-role-prefix-2-nodes-rank-3-raises": Run(
        "torchrun", TORCHRUN_ARGS, "raise_after_init.py", {**ROLE_PREFIX, "FAIL_RANK": "3"}, nodes=2
    ),
    "ft_launcher-raise-after-init": Run("ft_launcher", FT_ARGS, "raise_after_init.py"),
}


def pet(node: int, nodes: int) -> dict[str, str]:
    """The PET variables Trainer sets in node ``node``'s pod."""
    return {
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": str(node),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29517",
    }


#: What the environment's Python prints: the versions of torch, Python and nvidia-resiliency-ext ("" if absent).
_VERSIONS = """
import json, sys
from importlib import metadata
try:
    nvrx = metadata.version("nvidia-resiliency-ext")
except metadata.PackageNotFoundError:
    nvrx = ""
print(json.dumps({"torch": metadata.version("torch"), "python": sys.version.split()[0], "nvrx": nvrx}))
"""


@dataclass(frozen=True)
class Env:
    """The environment whose launchers run: its variables (PATH first names its ``bin``) and versions."""

    variables: dict[str, str]
    torch: str
    python: str
    nvrx: str

    @classmethod
    def of(cls, venv: str) -> "Env":
        variables = dict(os.environ)
        if venv:
            bin_dir = str(Path(venv).absolute() / "bin")
            variables = {**variables, "PATH": bin_dir + os.pathsep + variables["PATH"], "VIRTUAL_ENV": venv}
        python = shutil.which("python", path=variables["PATH"]) or sys.executable
        versions = json.loads(subprocess.run([python, "-c", _VERSIONS], check=True, capture_output=True).stdout)
        return cls(variables, versions["torch"], versions["python"], versions["nvrx"])

    def has(self, launcher: str) -> bool:
        return shutil.which(launcher, path=self.variables["PATH"]) is not None

    def folder(self) -> Path:
        """``HERE/2.13`` for torch 2.13.0+cu130."""
        return HERE / ".".join(self.torch.split(".")[:2])

    def versions(self) -> str:
        nvrx = f", nvidia-resiliency-ext {self.nvrx}" if self.nvrx else ""
        return f"torch {self.torch}, python {self.python}{nvrx}"


def capture(name: str, run: Run, env: Env) -> None:
    if not env.has(run.launcher):
        print(name, f"left out: no {run.launcher} with torch {env.torch}")
        return
    launch = build_launch(run.launcher, [*run.args, run.script], args_are_quoted=False, distributed=True)
    # The kubelet's expansion of the container's args: build_launch escapes every "$" before "(" or "$" as "$$".
    command = [*launch.command, *(arg.replace("$$", "$") for arg in launch.args)]
    base = {key: value for key, value in env.variables.items() if key != "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"}
    env.folder().mkdir(exist_ok=True)
    files = [
        env.folder() / (f"{name}.log" if run.nodes == 1 else f"{name}-node-{node}.log") for node in range(run.nodes)
    ]
    outputs = [file.open("w") for file in files]
    procs = [
        subprocess.Popen(
            command, cwd=HERE, env={**base, **pet(node, run.nodes), **run.env}, stdout=out, stderr=subprocess.STDOUT
        )
        for node, out in enumerate(outputs)
    ]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    task_env = "".join(f"{key}={value!r} " for key, value in run.env.items())
    for node, (proc, out, file) in enumerate(zip(procs, outputs, files)):
        code = proc.wait(timeout=300)
        out.close()
        head = (
            f"# captured {when} with {env.versions()}, exit code {code}, "
            f"by test/data/torch-output/capture.py ({' '.join(f'{k}={v}' for k, v in pet(node, run.nodes).items())}): "
            f"{task_env}{launch.command_line}\n"
        )
        file.write_text(head + file.read_text())
        print(file.relative_to(HERE), "exit", code)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", default="", help="the virtual environment whose torch runs (default: this Python's)")
    parser.add_argument("names", nargs="*", help=f"the runs to capture (default: all): {', '.join(RUNS)}")
    options = parser.parse_args()
    wanted = {name.removesuffix(".log") for name in options.names}
    found = Env.of(options.venv)
    for name, run in RUNS.items():
        if not wanted or name in wanted:
            capture(name, run, found)
