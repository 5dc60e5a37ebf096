"""The training container's command, built from NeMo-Run's role.

Kubernetes expands only ``$(VAR)`` in commands, never ``$VAR``, so the container runs
one ``bash -c`` script: this is what lets ``$PET_NODE_RANK`` and friends (set by
Kubeflow Trainer in each pod) reach torchrun. Everything else in the script is
shell-quoted.

Three shapes of task:

* torchrun (NeMo-Run's ``Torchrun`` launcher, or a distributed Python task): the
  rendezvous and size flags NeMo-Run generated are replaced by Trainer's
  ``--nnodes/--nproc-per-node/--node-rank/--master-addr/--master-port`` from the
  ``PET_*`` variables (static rendezvous on the master pod, which is how Trainer
  wires torch jobs); the other flags (``--tee``, ``--no-python``...) are kept.
* ft_launcher (NeMo-Run's ``FaultTolerance`` launcher, nvidia-resiliency-ext): in-job restarts
  need an elastic rendezvous, so instead of the static one it gets a c10d rendezvous hosted by
  the ``agent`` of node rank 0 on ``$PET_MASTER_ADDR:$PET_MASTER_PORT``, with an id per TrainJob
  and gang attempt, and ``--nnodes/--nproc-per-node`` from ``PET_*``; its ``--ft-*`` flags and
  ``--max-restarts`` are kept (docs/resilience.md). With ``worker_preload`` or
  ``rendezvous_poll_seconds``, ft_launcher runs inside ``warm_start.py`` (written into the pod by
  the script), which forks the workers from a template process and shortens the rendezvous polls.
* a bash entrypoint (scripts): run as is; a ``torchrun`` shell function is exported
  so that a script calling ``torchrun`` gets the PET flags it does not pass itself.
* anything else that is not distributed: run as is, no torchrun.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from nemo_kubeflow.constants import NEMO_RUN_POD_DIR, RESTART_ATTEMPT_ENV
from nemo_kubeflow.parts.escapes import kube_escape
from nemo_kubeflow.pod import warm_start

#: torchrun's flags, in the order they are added, with the PET variable that feeds each.
PET_FLAGS: tuple[tuple[str, str], ...] = (
    ("--nnodes", "PET_NNODES"),
    ("--nproc-per-node", "PET_NPROC_PER_NODE"),
    ("--node-rank", "PET_NODE_RANK"),
    ("--master-addr", "PET_MASTER_ADDR"),
    ("--master-port", "PET_MASTER_PORT"),
)

# torchrun options that take a value (so the value is not mistaken for the script).
_VALUE_FLAGS = {
    "--nnodes",
    "--nproc-per-node",
    "--nproc_per_node",
    "--node-rank",
    "--node_rank",
    "--master-addr",
    "--master_addr",
    "--master-port",
    "--master_port",
    "--rdzv-backend",
    "--rdzv_backend",
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "--rdzv-id",
    "--rdzv_id",
    "--rdzv-conf",
    "--rdzv_conf",
    "--max-restarts",
    "--max_restarts",
    "--monitor-interval",
    "--monitor_interval",
    "--start-method",
    "--start_method",
    "--role",
    "--log-dir",
    "--log_dir",
    "-r",
    "--redirects",
    "-t",
    "--tee",
    "--local-addr",
    "--local_addr",
    "--logs-specs",
    "--logs_specs",
    "--local-ranks-filter",
    "--local_ranks_filter",
    "--event-log-handler",
    "--event_log_handler",
}
# Flags NeMo-Run's launcher sets that Trainer's PET values replace.
_REPLACED_FLAGS = {
    "--nnodes",
    "--nproc-per-node",
    "--nproc_per_node",
    "--node-rank",
    "--node_rank",
    "--master-addr",
    "--master_addr",
    "--master-port",
    "--master_port",
    "--rdzv-backend",
    "--rdzv_backend",
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "--rdzv-id",
    "--rdzv_id",
}

# NeMo-Run's ft_launcher component adds this when no FT setting is given; ft_launcher 0.4 calls it
# deprecated (removed in 0.5) and runs the same without it, so it is dropped.
_DROPPED_FT_FLAGS = {"--ignore-missing-fault-tol-cfg"}

# Exported into bash scripts: adds the PET flags a `torchrun` call does not already pass.
# Scanning stops at the script name so that the script's own arguments are not read as
# torchrun flags. `--standalone` and explicit rendezvous settings are left alone.
_TORCHRUN_FUNCTION = r"""torchrun() {
  local a skip= nn=1 np=1 nr=1 ma=1 mp=1 add=()
  for a in "$@"; do
    if [ -n "$skip" ]; then skip=; continue; fi
    case "$a" in
      --nnodes|--nnodes=*) nn=;;
      --nproc-per-node|--nproc_per_node|--nproc-per-node=*|--nproc_per_node=*) np=;;
      --node-rank|--node_rank|--node-rank=*|--node_rank=*) nr=;;
      --master-addr|--master_addr|--master-addr=*|--master_addr=*) ma=;;
      --master-port|--master_port|--master-port=*|--master_port=*) mp=;;
      --standalone|--rdzv-endpoint|--rdzv_endpoint|--rdzv-endpoint=*|--rdzv_endpoint=*) nr= ma= mp=;;
    esac
    case "$a" in
      --standalone) nn=;;
      VALUE_FLAGS) skip=1;;
      -*) ;;
      *) break;;
    esac
  done
  [ -n "$nn" ] && add+=(--nnodes "$PET_NNODES")
  [ -n "$np" ] && add+=(--nproc-per-node "$PET_NPROC_PER_NODE")
  [ -n "$nr" ] && add+=(--node-rank "$PET_NODE_RANK")
  [ -n "$ma" ] && add+=(--master-addr "$PET_MASTER_ADDR")
  [ -n "$mp" ] && add+=(--master-port "$PET_MASTER_PORT")
  command torchrun "${add[@]}" "$@"
}
export -f torchrun""".replace("VALUE_FLAGS", "|".join(sorted(_VALUE_FLAGS)))

# torchrun and ft_launcher prefix each line they tee (NeMo-Run's launcher passes `--tee 3`) with
# `[<role><local rank>]:`; this template makes it the global rank, `[rank3]:`, the prefix torch itself
# puts on its C++ warnings and the one rank_failure.py reads. A template the task sets itself is kept.
RANK_PREFIX_TEMPLATE = "[rank${rank}]:"
RANK_PREFIX_EXPORT = (
    '[ -n "${TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE+set}" ] || '
    f"export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE={shlex.quote(RANK_PREFIX_TEMPLATE)}"
)


# Where the pod script writes warm_start.py: a name per pod process ($BASHPID: the script's shell, which then
# becomes the launcher; not $$, which Kubernetes turns into "$" in a container's command).
WARM_START_FILE = f'"${{TMPDIR:-/tmp}}/{warm_start.POD_FILE_PREFIX}$BASHPID.py"'
_WARM_START_SOURCE = Path(warm_start.__file__)
# ft_launcher's flags that say how the worker program is started.
_MODULE_FLAGS = ("-m", "--module")
_NO_PYTHON_FLAGS = ("--no-python", "--no_python")


def substitute_macros(text: str, values: Mapping[str, str]) -> str:
    """NeMo-Run's executor placeholders (``${node_rank_var}``, ``$node_rank_var``...) replaced by ``values``,
    every other ``$`` kept as written. NeMo-Run's own ``ExecutorMacros.apply`` runs ``string.Template``,
    which also turns every ``$$`` of an argument or env value into ``$``: not done for this executor."""
    if not values:
        return text
    names = "|".join(re.escape(name) for name in values)
    pattern = re.compile(rf"\$(?:\{{({names})\}}|({names})(?![_a-zA-Z0-9]))")
    return pattern.sub(lambda m: values[m.group(1) or m.group(2)], text)


def warm_start_problem(entrypoint: str, args: Sequence[str]) -> str | None:
    """Why ``worker_preload`` cannot start this task's workers, or ``None`` when it can."""
    if entrypoint != "ft_launcher":
        return (
            f"worker_preload forks the workers that ft_launcher starts, but this task runs {entrypoint!r}: "
            "set launcher='ft' (or run.FaultTolerance(...)), or leave worker_preload empty"
        )
    kept, _ = split_torchrun_args(args)
    if any(flag in _NO_PYTHON_FLAGS for flag in kept):
        return (
            "worker_preload forks Python workers, but this task's workers are not Python (ft_launcher "
            "--no-python: a run.Script whose entrypoint is not 'python'); leave worker_preload empty"
        )
    return None


def _warm_start_lines() -> list[str]:
    """Shell that writes warm_start.py into the pod (bash builtins only: the image needs no tools)."""
    source = _WARM_START_SOURCE.read_text()
    marker = "NEMO_KUBEFLOW_WARM_START_PY"
    assert marker not in source
    return [
        f"IFS= read -r -d '' {marker} <<'{marker}' || true",
        source.rstrip("\n"),
        marker,
        f'printf %s "${marker}" > {WARM_START_FILE}',
    ]


@dataclass(frozen=True)
class LaunchSpec:
    """What the training container runs: ``command`` + ``args`` for ``spec.trainer``."""

    command: list[str]
    args: list[str]
    #: The final command line (for summaries and tests).
    command_line: str
    #: Whether torchrun was injected or rewritten with the PET flags.
    uses_torchrun: bool


def pet_flags() -> str:
    return " ".join(f'{flag} "${var}"' for flag, var in PET_FLAGS)


def split_torchrun_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split torchrun's arguments into (kept launcher flags, script and its arguments),
    dropping the flags that the PET values replace."""
    kept: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        flag = token.split("=", 1)[0]
        if not token.startswith("-"):
            break
        takes_value = _takes_value(token)
        if flag in _DROPPED_FT_FLAGS:
            i += 1
            continue
        if flag in _REPLACED_FLAGS:
            i += 2 if takes_value else 1
            continue
        kept.append(token)
        if takes_value and i + 1 < len(args):
            kept.append(args[i + 1])
            i += 1
        i += 1
    return kept, list(args[i:])


def _takes_value(token: str) -> bool:
    """Whether launcher option ``token`` takes the next argument as its value."""
    # Every ft_launcher `--ft-*` option takes a value (nvidia-resiliency-ext 0.4).
    return token in _VALUE_FLAGS or (token.startswith("--ft-") and "=" not in token)


def ft_rendezvous_flags(rendezvous_id: str) -> str:
    """ft_launcher's c10d rendezvous across the job's pods.

    The agent of node rank 0 hosts the store (``is_host`` is given, not guessed from the
    hostname: on the local cluster every pod has the master's address). The id changes with
    each gang restart (``RESTART_ATTEMPT_ENV``), so a new attempt never joins an old round.
    """
    return " ".join(
        [
            "--rdzv-backend c10d",
            '--rdzv-endpoint "$PET_MASTER_ADDR:$PET_MASTER_PORT"',
            f'--rdzv-id {shlex.quote(rendezvous_id)}-"${{{RESTART_ATTEMPT_ENV}:-0}}"',
            '--rdzv-conf "is_host=$([ "$PET_NODE_RANK" = 0 ] && echo 1 || echo 0)"',
            '--nnodes "$PET_NNODES"',
            '--nproc-per-node "$PET_NPROC_PER_NODE"',
        ]
    )


def rewrite_workspace(arg: str, workspace: str) -> str:
    """NeMo-Run hard-codes ``/nemo_run/...`` pod paths; follow a moved workspace."""
    if workspace.rstrip("/") == NEMO_RUN_POD_DIR:
        return arg
    return arg.replace(NEMO_RUN_POD_DIR + "/", workspace.rstrip("/") + "/")


def _warm_start_line(
    quoted: list[str], rendezvous_id: str, worker_preload: Sequence[str], rendezvous_poll_seconds: float | None
) -> str:
    """ft_launcher through warm_start.py: workers forked from a template that preloaded modules."""
    kept, rest = split_torchrun_args(quoted)
    options = _warm_start_options(worker_preload, rendezvous_poll_seconds)
    if any(flag in _MODULE_FLAGS for flag in kept):
        options.append("--module")
        kept = [flag for flag in kept if flag not in _MODULE_FLAGS]
    return " ".join(
        ["python3", WARM_START_FILE, "launch", *options, ft_rendezvous_flags(rendezvous_id), *kept, "--", *rest]
    )


def _warm_start_options(worker_preload: Sequence[str], rendezvous_poll_seconds: float | None) -> list[str]:
    """warm_start.py's options: the modules to preload, the rendezvous poll interval."""
    options = []
    if worker_preload:
        options += ["--preload", shlex.quote(",".join(worker_preload))]
    if rendezvous_poll_seconds is not None:
        options += ["--poll", repr(float(rendezvous_poll_seconds))]
    return options


def _pythonpath_export(pythonpath: Sequence[str]) -> list[str]:
    """The line that puts ``pythonpath`` before the image's ``PYTHONPATH`` (none when it is empty)."""
    if not pythonpath:
        return []
    joined = ":".join(shlex.quote(p) for p in pythonpath)
    return [f'export PYTHONPATH={joined}"${{PYTHONPATH:+:$PYTHONPATH}}"']


def _setup_lines(
    prologue: str, exports: Mapping[str, str] | None, pythonpath: Sequence[str], workdir: str | None
) -> list[str]:
    """The script's lines before the command: the prologue, the exports, PYTHONPATH, the directory."""
    lines = [prologue.rstrip()] if prologue.strip() else []
    lines += [f"export {name}={value}" for name, value in (exports or {}).items()]
    lines += _pythonpath_export(pythonpath)
    if workdir:
        lines.append(f"cd {shlex.quote(workdir)}")
    return lines


def _runs_warm_start(entrypoint: str, worker_preload: Sequence[str], rendezvous_poll_seconds: float | None) -> bool:
    """Whether ft_launcher runs inside warm_start.py: with modules to preload or a rendezvous poll interval."""
    return entrypoint == "ft_launcher" and (bool(worker_preload) or rendezvous_poll_seconds is not None)


def _needs_torchrun(entrypoint: str, distributed: bool) -> bool:
    """Whether a Python task without a launcher needs torchrun: when distributed, every process does,
    otherwise each node would run a single, non-distributed process."""
    return entrypoint in ("python", "python3") and distributed


def _command_line(entrypoint: str, quoted: list[str], distributed: bool, rendezvous_id: str) -> str:
    """The command the script ``exec``s (but ft_launcher through warm_start.py): torchrun and ft_launcher
    with Trainer's PET values, a distributed Python task under torchrun, any other as it is."""
    if entrypoint == "torchrun":
        kept, rest = split_torchrun_args(quoted)
        return " ".join(["torchrun", pet_flags(), *kept, *rest])
    if entrypoint == "ft_launcher":
        kept, rest = split_torchrun_args(quoted)
        return " ".join(["ft_launcher", ft_rendezvous_flags(rendezvous_id), *kept, *rest])
    if _needs_torchrun(entrypoint, distributed):
        return " ".join(["torchrun", pet_flags(), *quoted])
    return " ".join([shlex.quote(entrypoint), *quoted])


def _launcher_lines(uses_torchrun: bool, warm: bool) -> list[str]:
    """The script's lines that prepare the launchers: the rank prefix of their output, the ``torchrun``
    function for a task not started under torchrun (a bash script, say), warm_start.py."""
    # Every shape: a script or a Python task may start torchrun itself (the function below).
    lines = [RANK_PREFIX_EXPORT]
    if not uses_torchrun:
        lines.append(_TORCHRUN_FUNCTION)
    if warm:
        lines.extend(_warm_start_lines())
    return lines


def build_launch(
    entrypoint: str,
    args: Sequence[str],
    *,
    args_are_quoted: bool,
    distributed: bool,
    workspace: str = NEMO_RUN_POD_DIR,
    workdir: str | None = None,
    pythonpath: Sequence[str] = (),
    prologue: str = "",
    exports: Mapping[str, str] | None = None,
    rendezvous_id: str = "nemo",
    worker_preload: Sequence[str] = (),
    rendezvous_poll_seconds: float | None = None,
) -> LaunchSpec:
    """Build the container command.

    Args:
        entrypoint: the role's entrypoint (``torchrun``, ``python``, ``bash``...).
        args: the role's arguments after NeMo-Run's macro substitution.
        args_are_quoted: NeMo-Run's torchrun component shell-quotes its arguments itself
            (leaving ``$PET_*`` unquoted); plain roles carry raw arguments.
        distributed: more than one process in the job (nodes x processes > 1).
        workspace: where the task's files are mounted.
        workdir: directory to ``cd`` into before the command (``None``: stay in the image's).
        pythonpath: directories prepended to ``PYTHONPATH``.
        prologue: shell run first (e.g. unpacking a sharded code package).
        exports: variables exported by the script, values may use ``${VAR:+...}`` forms
            (used to extend ``LD_LIBRARY_PATH`` without replacing the image's).
        rendezvous_id: the prefix of ft_launcher's rendezvous id (the TrainJob's name).
        worker_preload: modules the template process imports; ft_launcher's workers are forked
            from it (``warm_start.py``). Empty: workers start as new Pythons.
        rendezvous_poll_seconds: how often ft_launcher's agents look at their rendezvous
            (``None``: ft_launcher's 1 s).
    """
    args = [rewrite_workspace(a, workspace) for a in args]
    quoted = list(args) if args_are_quoted else [shlex.quote(a) for a in args]
    warm = _runs_warm_start(entrypoint, worker_preload, rendezvous_poll_seconds)
    if warm:
        line = _warm_start_line(quoted, rendezvous_id, worker_preload, rendezvous_poll_seconds)
    else:
        line = _command_line(entrypoint, quoted, distributed, rendezvous_id)
    uses_torchrun = entrypoint in ("torchrun", "ft_launcher") or _needs_torchrun(entrypoint, distributed)

    lines = [
        "set -eo pipefail",
        *_setup_lines(prologue, exports, pythonpath, workdir),
        *_launcher_lines(uses_torchrun, warm),
    ]
    # exec: the training process becomes the shell's replacement, so signals from the
    # kubelet (SIGTERM on cancel) reach it directly.
    lines.append(f"exec {line}")
    script = "\n".join(lines) + "\n"
    # Escaped whole: the user's arguments (and our own `$(...)`) reach bash as written.
    return LaunchSpec(
        command=["bash", "-c"], args=[kube_escape(script)], command_line=line, uses_torchrun=uses_torchrun
    )
