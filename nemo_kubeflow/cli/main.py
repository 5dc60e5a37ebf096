"""``nemo-kubeflow``: render and validate manifests, look after experiments' jobs and clean up, from the shell.

    nemo-kubeflow render --factory kubeflow_gpu --set nodes=2 -- python train.py --lr 0.1
    nemo-kubeflow validate manifests/*.yaml --template my_runtime.yaml.j2
    nemo-kubeflow status pretrain_1795319744650370646
    nemo-kubeflow logs pretrain_1795319744650370646 --follow
    nemo-kubeflow gc --all-namespaces --dry-run
    nemo-kubeflow gc --namespace team --experiment llama3-pretrain --older-than 7d

``render`` and ``validate`` never contact a cluster. ``status``, ``watch``, ``logs`` and ``gc`` talk to
one only through ``cluster.KubernetesCluster``. Errors of this package are printed as one message (no
traceback) with exit code 2; ``validate`` exits 1 when it finds problems.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from typing import Callable, Optional, Sequence

# Only light modules at the top: `--help` and `validate FILE` must not pay for importing
# NeMo-Run, fiddle, torchx or the Trainer models (seconds); each command imports what it uses.
from nemo_kubeflow.cli.executor_config import DEFAULT_FACTORY
from nemo_kubeflow.cli.gc import DEFAULT_MIN_AGE_S, cmd_gc, parse_duration
from nemo_kubeflow.cli.logs import cmd_logs
from nemo_kubeflow.cli.render import DEFAULT_EXPERIMENT_ID, cmd_render
from nemo_kubeflow.cli.status import cmd_status
from nemo_kubeflow.cli.validate import cmd_validate
from nemo_kubeflow.cli.watch import cmd_watch
from nemo_kubeflow.constants import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from nemo_kubeflow.errors import NemoKubeflowError


def _add_executor_options(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--factory",
        metavar="NAME",
        help=f"executor factory (default {DEFAULT_FACTORY}): kubeflow_gpu, kubeflow_cpu, kubeflow_tcpxo, "
        "kubeflow_local, any factory registered for run.Executor, or a dotted path",
    )
    source.add_argument(
        "--executor-file",
        metavar="FILE.py:NAME",
        help="a KubeflowExecutor, its run.Config or a function returning either, defined in FILE.py",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override an executor field, as run.executor.FIELD=VALUE would (nodes=2, tcpxo.nic_count=4, "
        "'tolerations=[]'); repeatable",
    )


def _experiment_command(
    sub, func: Callable[[argparse.Namespace], int], summary: str, description: str
) -> argparse.ArgumentParser:
    """A subcommand about one NeMo-Run experiment, named after its function (``cmd_NAME``)."""
    parser = sub.add_parser(func.__name__.removeprefix("cmd_"), help=summary, description=description)
    parser.add_argument("experiment", metavar="EXPERIMENT_ID", help="the id NeMo-Run printed, <title>_<number>")
    parser.set_defaults(func=func)
    return parser


def _add_task_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--task",
        "-t",
        action="append",
        metavar="INDEX_OR_NAME",
        help="only this task, by index, name or TrainJob name (repeatable; default: every task)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        # The module docstring is reStructuredText; a terminal shows `x`, not ``x``.
        prog="nemo-kubeflow",
        description=__doc__.split("\n\n")[0].replace("``", "`"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")

    render = sub.add_parser(
        "render",
        help="print the manifests an executor configuration produces for a command",
        description="Print the manifests (YAML, --- separated, for `kubectl apply -f -`) that submitting "
        "COMMAND would send, secrets masked. Offline. Usage: render [options] -- COMMAND...",
    )
    _add_executor_options(render)
    render.add_argument("--name", help="task name (default: from the command, as NeMo-Run names it)")
    render.add_argument(
        "--experiment-id",
        default=DEFAULT_EXPERIMENT_ID,
        help=f"experiment id the objects are named after (default {DEFAULT_EXPERIMENT_ID})",
    )
    render.add_argument(
        "--out", metavar="DIR", help="write one file per object into DIR (replacing *.yaml there) instead of printing"
    )
    render.set_defaults(func=cmd_render)

    validate = sub.add_parser(
        "validate",
        help="validate YAML manifests offline",
        description="Validate manifests (multi-document YAML; - reads stdin) as a submission would. "
        "Prints each problem as `file: kind/name: path: message`; exit code 1 if any.",
    )
    validate.add_argument("files", nargs="*", metavar="FILE")
    validate.add_argument(
        "--template",
        metavar="PATH",
        help="also render this runtime template with the executor configuration and validate it",
    )
    _add_executor_options(validate)
    validate.set_defaults(func=cmd_validate)

    status = _experiment_command(
        sub,
        cmd_status,
        "say what each task of an experiment is doing, and why it failed",
        "For each task of a NeMo-Run experiment: its TrainJob, its state, and the reason (the failed rank and its "
        "exception, exit code or signal, the last lines of the node; or what a pending job waits for). Exit code 1 "
        "if a task failed. The tasks of an experiment are read together (a few lists): a running task's node logs "
        "(its progress line, where Trainer's status carries none) are read when it is asked alone (--task).",
    )
    _add_task_option(status)

    watch = _experiment_command(
        sub,
        cmd_watch,
        "look after an experiment's running tasks until they finish (for detached jobs)",
        "Describe each task of a NeMo-Run experiment every INTERVAL seconds and print each change of state or "
        "reason, until every task has finished (exit code 1 if one failed). While it looks, a job whose node "
        "failed it is moved off that node, as an attached run would do (docs/resilience.md#bad-nodes).",
    )
    watch.add_argument(
        "--interval", type=float, default=30.0, metavar="SECONDS", help="seconds between looks (default 30)"
    )

    logs = _experiment_command(
        sub,
        cmd_logs,
        "print or follow the logs of an experiment's tasks",
        "Print the log of every node of each task of a NeMo-Run experiment, each line after <task>/<node> as "
        "`nemo experiment logs` prints it; with --follow, follow them until the jobs end, across gang restarts. "
        "Lighter than NeMo-Run's command: torch is not imported.",
    )
    _add_task_option(logs)
    logs.add_argument("--follow", "-f", action="store_true", help="follow the logs until the jobs end")

    gc = sub.add_parser(
        "gc",
        help="delete finished TrainJobs and rendered runtimes that no TrainJob references",
        description=f"Delete training runtimes labelled {MANAGED_BY_LABEL}={MANAGED_BY_VALUE} that no TrainJob "
        "references and, with --finished, --experiment, --older-than or --expired, the finished TrainJobs "
        "with that label (their JobSets, pods, ConfigMaps and Secrets go with them). Jobs that "
        "have not finished and objects without the label are never deleted. Without "
        "--all-namespaces only TrainingRuntimes of the given namespaces are collected: "
        "ClusterTrainingRuntimes need the TrainJobs of every namespace.",
    )
    gc.add_argument(
        "--namespace", "-n", action="append", metavar="NS", help="namespace to collect (repeatable; default: default)"
    )
    gc.add_argument(
        "--all-namespaces",
        "-A",
        action="store_true",
        help="collect in every namespace, and ClusterTrainingRuntimes (lists namespaces)",
    )
    gc.add_argument("--dry-run", action="store_true", help="print what would be deleted, delete nothing")
    gc.add_argument(
        "--finished", action="store_true", help="delete every finished (succeeded or failed) TrainJob of nemo-kubeflow"
    )
    gc.add_argument(
        "--experiment",
        "-e",
        action="append",
        metavar="ID_OR_TITLE",
        help="delete the finished TrainJobs of this experiment, by id or title (repeatable)",
    )
    gc.add_argument(
        "--older-than",
        type=parse_duration,
        metavar="AGE",
        help="delete the finished TrainJobs that finished at least AGE ago, e.g. 12h, 7d, 1d12h",
    )
    gc.add_argument(
        "--expired",
        action="store_true",
        help="delete the finished TrainJobs whose ttl_seconds_after_finished has passed since they "
        "finished (run it on a schedule: docs/reliability.md#finished-jobs)",
    )
    gc.add_argument(
        "--min-age",
        type=float,
        default=DEFAULT_MIN_AGE_S,
        metavar="SECONDS",
        help=f"leave runtimes younger than this alone (default {DEFAULT_MIN_AGE_S})",
    )
    gc.add_argument("--kubeconfig", help="kubeconfig path (default: $KUBECONFIG, ~/.kube/config)")
    gc.add_argument("--context", help="kubeconfig context (default: its current context)")
    gc.set_defaults(func=cmd_gc)

    from nemo_kubeflow.cli.doctor import cmd_doctor

    doctor = sub.add_parser(
        "doctor",
        help="check a cluster for an executor configuration before the first job",
        description="Check what the cluster offers the executor configuration: the APIs and versions served "
        "(Trainer, JobSet, Kueue), the Trainer version and its known-bad combinations, your RBAC "
        "rights and what each missing one disables, the namespace's Pod Security level, the "
        "LocalQueue and its ClusterQueue, the named runtime, the nodes offering the GPUs, and a "
        "server-side dry run of the runtime and TrainJob (webhooks). One line per check, each "
        "problem with its fix. Writes nothing. Exit code 0 when a job can run, 1 otherwise.",
    )
    _add_executor_options(doctor)
    doctor.add_argument("--namespace", "-n", metavar="NS", help="namespace to check (default: the executor's)")
    doctor.add_argument("--kubeconfig", help="kubeconfig path (default: the executor's, $KUBECONFIG, ~/.kube/config)")
    doctor.add_argument("--context", help="kubeconfig context (default: the executor's, else the current one)")
    doctor.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv, command = _split_command(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    if command and args.subcommand != "render":
        build_parser().error(f"{args.subcommand} takes no command after --: {shlex.join(command)}")
    args.command = command
    # nemo_run logs each parse error it raises; ours says the same thing once, in context.
    logging.getLogger("nemo_run.cli.cli_parser").setLevel(logging.CRITICAL)
    try:
        return args.func(args)
    except NemoKubeflowError as e:
        print(f"nemo-kubeflow: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the options, the task's command): everything after ``--`` is the command, options included."""
    if "--" not in argv:
        return argv, []
    split = argv.index("--")
    return argv[:split], argv[split + 1 :]


if __name__ == "__main__":
    sys.exit(main())
