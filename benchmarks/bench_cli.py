"""Wall time of the ``nemo-kubeflow`` command a user types: ``--help``, ``render`` of one task and
``validate`` of one file, each in a fresh process, as the console script runs it; quiet, then beside a
busy loop per core.

The baselines are measured in the same run and alternated with ours: a bare ``python`` for ``--help``
and ``validate`` (Python's own start), and ``import nemo_run`` (without torch, all of it) for ``render``,
which builds the executor through NeMo-Run (a ``run.Executor``, its factories, its packaging) and
imports NeMo-Run with what only its other executors use deferred (``nemo_run_import.NEMO_RUN_DEFERRED``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import Metric, cpu_hog, interleaved, median, stopwatch

NAME = "cli"
#: "Well under a second after Python starts" for the commands that need no NeMo-Run.
TARGET_MS = 500
#: "Well under a second after Python starts" for render too, which imports NeMo-Run, builds the executor
#: and validates the manifests.
RENDER_TARGET_MS = 1000

#: What the ``nemo-kubeflow`` console script runs.
_CONSOLE_SCRIPT = "import sys\nfrom nemo_kubeflow.cli.main import main\nsys.exit(main())"


#: NeMo-Run's import as ``render`` does it: without torch (see ``nemo_run_import._import_nemo_run``).
_NEMO_RUN = "import sys\nsys.modules['torch'] = None\nimport nemo_run"


def _command(*args: str) -> list[str]:
    return [sys.executable, "-c", _CONSOLE_SCRIPT, *args]


def _timed(argv: list[str], cwd: str) -> float:
    with stopwatch() as elapsed:
        out = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=cwd,
            env={**os.environ, "PYTHONWARNINGS": "ignore", "NEMORUN_HOME": cwd},
        )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[3:]) or argv[-1]} failed: {out.stderr[-2000:]}")
    return elapsed[0] * 1000


def run(ctx):
    runs = 3 if ctx.quick else max(5, ctx.repeat)
    with tempfile.TemporaryDirectory(prefix="nk-bench-cli-", dir=ctx.workdir) as workdir:
        Path(workdir, "train.py").write_text("print('training')\n")
        render = _command("render", "--factory", "kubeflow_cpu", "--", "python", "train.py", "--lr", "0.1")
        manifests = Path(workdir, "manifests.yaml")
        manifests.write_text(
            subprocess.run(
                render,
                capture_output=True,
                text=True,
                check=True,
                cwd=workdir,
                env={**os.environ, "PYTHONWARNINGS": "ignore", "NEMORUN_HOME": workdir},
            ).stdout
        )
        variants = dict(
            python=lambda: _timed([sys.executable, "-c", "pass"], workdir),
            nemo_run=lambda: _timed([sys.executable, "-c", _NEMO_RUN], workdir),
            help=lambda: _timed(_command("--help"), workdir),
            validate=lambda: _timed(_command("validate", str(manifests)), workdir),
            render=lambda: _timed(render, workdir),
        )
        runs_of = {}
        for loaded in (False, True):
            with cpu_hog() if loaded else contextlib.nullcontext(0) as hogs:
                runs_of[hogs] = interleaved(runs, **variants)
    for hogs, samples in runs_of.items():
        python, nemo_run = median(samples["python"]), median(samples["nemo_run"])
        where = f", beside {hogs} busy loops (loaded)" if hogs else ""
        note = f"median of {runs} fresh processes"
        yield Metric(
            f"`nemo-kubeflow --help`{where}",
            median(samples["help"]),
            python,
            "ms",
            at_most=TARGET_MS,
            note=f"baseline: `python -c pass`; {note}",
        )
        yield Metric(
            f"`nemo-kubeflow validate` of one file (ClusterTrainingRuntime + TrainJob){where}",
            median(samples["validate"]),
            python,
            "ms",
            at_most=TARGET_MS,
            note=f"baseline: `python -c pass`; loads the Trainer models and core schemas; {note}",
        )
        yield Metric(
            f"`nemo-kubeflow render` of one task{where}",
            median(samples["render"]),
            nemo_run,
            "ms",
            at_most=RENDER_TARGET_MS,
            note=f"baseline: all of `import nemo_run` without torch; render defers what only "
            f"NeMo-Run's other executors use; {note}",
        )
