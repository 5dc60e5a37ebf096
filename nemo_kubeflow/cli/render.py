"""``nemo-kubeflow render``: the manifests an executor configuration produces for a command, offline."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import TYPE_CHECKING, Optional, Sequence

from nemo_kubeflow.cli.executor_config import load_executor
from nemo_kubeflow.cli.nemo_run_import import _import_nemo_run
from nemo_kubeflow.errors import ConfigError
from nemo_kubeflow.parts import yamlio

if TYPE_CHECKING:
    import nemo_run as run

    from nemo_kubeflow.build.plan import Submission
    from nemo_kubeflow.config.executor import KubeflowExecutor


#: The experiment id ``render`` names objects after (NeMo-Run's is ``<title>_<timestamp>``).
DEFAULT_EXPERIMENT_ID = "experiment"


def script_for(command: Sequence[str]) -> run.Script:
    """The ``run.Script`` a user would write for ``command``."""
    run = _import_nemo_run()
    if not command:
        raise ConfigError("give the command to run after --, e.g. -- python train.py --lr 0.1")
    if len(command) == 1:
        return run.Script(inline=command[0])
    if _runs_module(command):
        return run.Script(path=command[2], args=list(command[3:]), entrypoint=command[0], m=True)
    return run.Script(path=command[1], args=list(command[2:]), entrypoint=command[0])


def _runs_module(command: Sequence[str]) -> bool:
    """Whether ``command`` is ``python -m MODULE ...``."""
    return command[0].startswith("python") and command[1] == "-m" and len(command) > 2


def render_submission(
    executor: KubeflowExecutor,
    command: Sequence[str],
    *,
    name: Optional[str] = None,
    experiment_id: str = DEFAULT_EXPERIMENT_ID,
) -> Submission:
    """What submitting ``command`` as a task would send, built as a NeMo-Run run builds it."""
    _import_nemo_run()
    from nemo_run.run.torchx_backend.packaging import package

    from nemo_kubeflow.build.plan import build_for_app

    script = script_for(command)
    task = name or script.get_name()
    executor.validate()
    # The steps of Experiment.add + Job.prepare, in a scratch experiment directory, then those
    # of the scheduler's dry run. NeMo-Run's metadata files (<task>_executor.yaml and
    # _config.yaml) are left out: they hold that directory's path, and the output would
    # change on every call for files the pod never reads.
    with tempfile.TemporaryDirectory(prefix="nemo-kubeflow-render-") as exp_dir:
        executor.assign(experiment_id, exp_dir, task_id=task, task_dir=task)
        executor.create_job_dir()
        app = package(task, script, executor=executor, serialize_to_file=True, serialize_metadata_for_scripts=False)
        # A command line may run a script that is only in the image (docs/cli.md: shipped when it exists here).
        return build_for_app(app, executor, local_script=False)


def cmd_render(args: argparse.Namespace) -> int:
    executor = load_executor(args.factory, args.executor_file, args.set)
    submission = render_submission(executor, args.command, name=args.name, experiment_id=args.experiment_id)
    if args.out:
        from nemo_kubeflow.nemo_run.scheduler import write_manifests

        write_manifests(submission, args.out)
        for filename in sorted(os.listdir(args.out)):
            if filename.endswith(".yaml"):
                print(os.path.join(args.out, filename))
    else:
        sys.stdout.write(yamlio.dump_all(submission.manifests()))
    return 0
