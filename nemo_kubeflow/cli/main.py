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
import dataclasses
import difflib
import functools
import importlib
import importlib.util
import inspect
import json
import logging
import os
import re
import shlex
import sys
import tempfile
import threading
import time
import typing
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import yaml

# Only light modules at the top: `--help` and `validate FILE` must not pay for importing
# NeMo-Run, fiddle, torchx or the Trainer models (seconds); each command imports what it uses.
from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.constants import (
    CLUSTER_RUNTIME_KIND,
    EXPERIMENT_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    RUNTIME_KIND,
    TRAINJOB_KIND,
    TTL_ANNOTATION,
)
from nemo_kubeflow.errors import ClusterError, ConfigError, NemoKubeflowError, TemplateError
from nemo_kubeflow.parts import naming, yamlio

if TYPE_CHECKING:
    import fiddle as fdl
    import nemo_run as run
    from nemo_run.cli.cli_parser import CLIException

    from nemo_kubeflow.build.plan import Submission
    from nemo_kubeflow.config.executor import KubeflowExecutor

DEFAULT_FACTORY = "kubeflow_gpu"
#: The experiment id ``render`` names objects after (NeMo-Run's is ``<title>_<timestamp>``).
DEFAULT_EXPERIMENT_ID = "experiment"
#: ``gc`` leaves younger runtimes alone: a submission creates its runtime a moment before
#: the TrainJob that references it.
DEFAULT_MIN_AGE_S = 300


#: What ``import nemo_run`` loads for its other executors (Lepton's SDK; kubernetes for its own Kubeflow
#: executor; requests for DGX Cloud), its SSH tunnels (paramiko, fabric), running an experiment's task
#: graph (networkx), notebook pictures (graphviz), Markdown help (markdown_it), and fiddle's code printing
#: and lambda sources (libcst): about 1.4 s of NeMo-Run's 1.8 s without torch, none of it used by ``render`` or
#: ``validate``, which defer them while they import NeMo-Run (``deferred_imports``).
NEMO_RUN_DEFERRED = (
    "leptonai",
    "paramiko",
    "fabric",
    "kubernetes",
    "requests",
    "networkx",
    "graphviz",
    "markdown_it",
    "libcst",
)


def _import_nemo_run(defer: bool = False):
    """``import nemo_run``, without the torch import it does only to register a YAML representer
    for ``torch.dtype`` (about half of NeMo-Run's import time; no executor field is a dtype).
    torch stays importable afterwards; only that representer is missing in this process.
    With ``defer`` (``render``, ``validate``), ``NEMO_RUN_DEFERRED`` are stand-ins while it imports."""
    if "nemo_run" not in sys.modules and "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ModuleNotFoundError
        try:
            if defer:
                from nemo_kubeflow.nemo_run.deferred_imports import import_deferring

                import_deferring("nemo_run", NEMO_RUN_DEFERRED)
            import nemo_run
        finally:
            if sys.modules.get("torch", 0) is None:
                del sys.modules["torch"]
    import nemo_run

    return nemo_run


# --- executor configuration --------------------------------------------------------------


def load_executor(
    factory: Optional[str] = None,
    executor_file: Optional[str] = None,
    overrides: Sequence[str] = (),
) -> KubeflowExecutor:
    """The executor of a factory (``kubeflow_gpu``, any registered ``run.Executor`` factory or a
    dotted path) or of ``FILE.py:NAME``, with ``FIELD=VALUE`` overrides in nemo_run's CLI syntax
    (the same as ``run.executor.FIELD=VALUE``)."""
    _import_nemo_run(defer=True)
    from nemo_kubeflow.config.executor import KubeflowExecutor

    source = executor_file or factory or DEFAULT_FACTORY
    obj = _from_file(executor_file) if executor_file else _from_factory(source)
    executor = _build(_with_overrides(_as_config(obj, source), overrides), overrides, source)
    if not isinstance(executor, KubeflowExecutor):
        raise ConfigError(f"{executor_file or factory} gives a {type(executor).__name__}, not a KubeflowExecutor")
    return executor


def _with_overrides(config: fdl.Buildable, overrides: Sequence[str]) -> fdl.Buildable:
    """``config`` with each ``--set FIELD=VALUE`` applied, in order."""
    for override in overrides:
        _apply_override(config, override)
    return config


def _build(config: fdl.Buildable, overrides: Sequence[str], source: str) -> Any:
    """``fdl.build(config)``; a value the settings class itself trips over (TypeError, ValueError...) is a
    ``ConfigError`` naming the field and its ``--set``."""
    import fiddle as fdl

    try:
        return fdl.build(config)
    except NemoKubeflowError:
        raise
    except Exception as e:
        raise ConfigError(_build_failure(e, overrides, source)) from None


def _build_failure(error: Exception, overrides: Sequence[str], source: str) -> str:
    """Why building the executor failed, naming the field (fiddle's ``<root>.FIELD`` note) and the
    ``--set`` that gave it its value."""
    field = _failed_field(error)
    given = _override_of(field, overrides)
    what = f"{field}: " if field else ""
    where = f"--set {given}" if given else source
    first_line = str(error).splitlines()[0] if str(error) else "no message"
    return (
        f"{where}: {what}cannot build the executor with this value ({type(error).__name__}: "
        f"{first_line}); give {field or 'the field'} a value "
        "of the type it documents (nemo-kubeflow render --help, docs/executor.md)"
    )


def _failed_field(error: Exception) -> str:
    """The dotted field fiddle names in the error or its notes (``<root>.FIELD``), "" when none."""
    context = " ".join([str(error), *getattr(error, "__notes__", ())])
    found = re.search(r"<root>((?:\.\w+)*)", context)
    return found.group(1).lstrip(".") if found else ""


def _override_of(field: str, overrides: Sequence[str]) -> str:
    """The first ``--set`` of ``field`` or of a field inside it, "" when none (or no field) was given."""
    if not field:
        return ""
    return next((o for o in overrides if o.partition("=")[0] == field or o.startswith(field + ".")), "")


def _apply_override(config: fdl.Buildable, override: str) -> None:
    from nemo_run.cli.cli_parser import CLIException, parse_cli_args

    key, sep, value = override.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key):
        raise ConfigError(f"--set {override}: expected FIELD=VALUE, e.g. nodes=2 or tcpxo.nic_count=4")
    *parents, leaf = key.split(".")
    target = config
    for part in parents:
        target = _settings_of(target, part, override)
    _check_field(target, leaf, override)
    try:
        parse_cli_args(config, [override])  # sets the value on config in place
        return
    except CLIException as e:
        error = e
    # nemo_run's parser cannot read lists of dicts (tolerations, say); JSON can.
    parsed = _json_value(value)
    if parsed is None:
        raise ConfigError(f"--set {override}: {_parse_reason(error)}") from None
    setattr(target, leaf, parsed)


def _settings_of(parent: fdl.Buildable, part: str, override: str) -> fdl.Buildable:
    """The ``run.Config`` at field ``part`` of ``parent``, so that ``--set`` can set its fields one by one; a
    settings object left at None (its defaults, e.g. gke_rdma) starts from the defaults."""
    import fiddle as fdl

    try:
        target = getattr(parent, part)
    except (AttributeError, ValueError):  # fiddle raises ValueError for default_factory fields
        target = None
    settings_class = _optional_settings_class(parent, part) if target is None else None
    if settings_class is not None:
        target = fdl.Config(settings_class)
        setattr(parent, part, target)
    if not isinstance(target, fdl.Buildable):
        raise ConfigError(
            f"--set {override}: {part} is not a run.Config in this configuration, so its fields cannot "
            "be set one by one; use a factory that sets it (kubeflow_tcpxo sets tcpxo) or --executor-file"
        )
    return target


def _check_field(target: fdl.Buildable, leaf: str, override: str) -> None:
    """Refuse a ``--set`` of a field the settings class does not have, with the closest name."""
    fields = list(inspect.signature(target.__fn_or_cls__).parameters)
    if leaf in fields:
        return
    close = difflib.get_close_matches(leaf, fields, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ConfigError(f"--set {override}: {target.__fn_or_cls__.__name__} has no field {leaf!r}{hint}")


def _json_value(value: str) -> Any:
    """``value`` read as a JSON list or object; ``None`` when it is neither."""
    if value.lstrip()[:1] not in ("[", "{"):
        return None
    try:
        return json.loads(value)
    except ValueError:
        return None


def _optional_settings_class(config: fdl.Buildable, name: str) -> Optional[type]:
    """``X`` when field ``name`` of ``config``'s dataclass is ``Optional[X]`` with ``X`` a dataclass."""
    cls = getattr(config, "__fn_or_cls__", None)
    if not dataclasses.is_dataclass(cls):
        return None
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    return _optional_dataclass(types.get(name))


def _optional_dataclass(hint: Any) -> Optional[type]:
    """``X`` when the type ``hint`` is ``Optional[X]`` with ``X`` a dataclass, else ``None``."""
    if typing.get_origin(hint) is not typing.Union:
        return None
    members = [t for t in typing.get_args(hint) if t is not type(None)]
    if len(members) == 1 and isinstance(members[0], type) and dataclasses.is_dataclass(members[0]):
        return members[0]
    return None


def _parse_reason(e: CLIException) -> str:
    """The innermost reason of nemo_run's nested parse errors."""
    from nemo_run.cli.cli_parser import ParseError

    reason = str(e.args[0])
    cause: Optional[BaseException] = e
    while cause is not None:
        if isinstance(cause, ParseError):
            expected = getattr(cause.expected_type, "__name__", cause.expected_type)
            reason = f"cannot read {cause.value!r} as {expected}: {cause.reason}"
        cause = cause.__cause__
    return reason


def _from_factory(name: str) -> Any:
    run = _import_nemo_run()
    if "." in name:
        return _import_dotted(name)
    try:
        # nemo_run's registry: our factories and those of any other installed plugin.
        return run.cli.resolve_factory(run.Executor, name)
    except ValueError:
        known = sorted(f.__name__ for f in run.cli.list_factories(run.Executor))
        raise ConfigError(
            f"--factory {name}: no executor factory of that name; known: {', '.join(known) or 'none'}"
        ) from None


def _import_dotted(name: str) -> Any:
    """The object a dotted path ``module.attr`` names (``--factory``)."""
    module_name, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"--factory {name}: cannot import it ({e})") from None


def _from_file(spec: str) -> Any:
    path, sep, attr = spec.rpartition(":")
    if not sep or not path or not attr:
        raise ConfigError(f"--executor-file {spec}: expected FILE.py:NAME, e.g. my_executors.py:gpu")
    if not os.path.isfile(path):
        raise ConfigError(f"--executor-file {spec}: {path} does not exist")
    module = _run_file(spec, path)
    if not hasattr(module, attr):
        raise ConfigError(f"--executor-file {spec}: {path} defines no {attr!r}")
    return getattr(module, attr)


def _run_file(spec: str, path: str) -> Any:
    """The module that running the Python file ``path`` defines (``--executor-file spec``)."""
    module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"--executor-file {spec}: {path} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _as_config(obj: Any, source: str) -> fdl.Buildable:
    """A ``run.Config`` to apply overrides to, from a Config, an executor or a factory."""
    import fiddle as fdl

    from nemo_kubeflow.config.executor import KubeflowExecutor

    if callable(obj):  # a factory (Configs and executors are not callable)
        obj = obj()
    if isinstance(obj, fdl.Buildable):
        return obj
    if isinstance(obj, KubeflowExecutor):
        return obj.to_config()
    raise ConfigError(f"{source} is a {type(obj).__name__}, not a KubeflowExecutor, its run.Config or a factory")


# --- render --------------------------------------------------------------------------------


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


# --- validate ------------------------------------------------------------------------------


def _ident(obj: Any) -> str:
    if not isinstance(obj, dict):
        return "?/?"
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{obj.get('kind') or '?'}/{name or '?'}"


def _documents(source: str) -> tuple[list[Any], list[str]]:
    """The YAML documents of a file (``-``: stdin), or the reasons it cannot be read."""
    try:
        text = _read_source(source)
    except (OSError, UnicodeDecodeError) as e:
        return [], [f"cannot read: {getattr(e, 'strerror', None) or e}"]
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None], []
    except yaml.YAMLError as e:
        return [], [_yaml_problem(e)]


def _read_source(source: str) -> str:
    """The text of a file, or of stdin for ``-``."""
    return sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")


def _yaml_problem(error: yaml.YAMLError) -> str:
    """Why a text is not YAML, with the line where it is known."""
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark else ""
    return f"invalid YAML{where}: {getattr(error, 'problem', None) or error}"


def cmd_validate(args: argparse.Namespace) -> int:
    if not args.files and not args.template:
        raise ConfigError("give manifest files to validate (- for stdin), or --template")
    inputs, problems = _file_inputs(args.files)
    if args.template:
        problems += _add_template(args, inputs)
    found, checked = _problems_in(inputs)
    return _report_validation(problems + found, checked)


def _problems_in(inputs: Sequence[tuple[str, list[Any]]]) -> tuple[list[str], int]:
    """Each problem of the documents of ``inputs`` ((source, documents)), as ``source: kind/name: problem``,
    and how many documents there are."""
    from nemo_kubeflow.schema.validation import validate_manifests

    # Together: a TrainJob's pod names are checked against its runtime when both are given.
    sourced = [(source, doc) for source, docs in inputs for doc in docs]
    problems: list[str] = []
    for (source, doc), found in zip(sourced, validate_manifests([doc for _, doc in sourced])):
        problems += [f"{source}: {_ident(doc)}: {p}" for p in found]
    return problems, len(sourced)


def _file_inputs(files: Sequence[str]) -> tuple[list[tuple[str, list[Any]]], list[str]]:
    """(source name, its documents) of each file, and why a file could not be read."""
    inputs: list[tuple[str, list[Any]]] = []
    problems: list[str] = []
    for source in files:
        docs, errors = _documents(source)
        problems += [f"{source}: {e}" for e in errors]
        inputs.append(("<stdin>" if source == "-" else source, docs))
    return inputs, problems


def _add_template(args: argparse.Namespace, inputs: list[tuple[str, list[Any]]]) -> list[str]:
    """Render ``--template`` with the executor configuration into ``inputs``; why it could not be rendered."""
    from nemo_kubeflow.build.plan import resolve
    from nemo_kubeflow.build.render import render_runtime, runtime_context

    executor = load_executor(args.factory, args.executor_file, args.set)
    try:
        inputs.append((args.template, [render_runtime(runtime_context(resolve(executor)), args.template)]))
    except TemplateError as e:
        return [f"{args.template}: {e}"]
    return []


def _report_validation(problems: Sequence[str], checked: int) -> int:
    """Print each problem and the count; the exit code (1 when there are problems)."""
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} problem(s) in {checked} object(s)", file=sys.stderr)
        return 1
    print(f"{checked} object(s) valid", file=sys.stderr)
    return 0


# --- gc ------------------------------------------------------------------------------------

#: ``--older-than`` units: 30s, 45m, 12h, 7d, 2w, and sums such as 1d12h.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:(\d+)([smhdw]))+")


def parse_duration(text: str) -> float:
    """Seconds of ``7d``, ``12h``, ``1d12h``, ``90m``, ``3600s`` (argparse type of ``--older-than``)."""
    value = text.strip()
    if not _DURATION.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a duration such as 30m, 12h, 7d or 1d12h (units s, m, h, d, w)"
        )
    return float(sum(int(n) * DURATION_UNITS[u] for n, u in re.findall(r"(\d+)([smhdw])", value)))


#: The units of ``format_age``, largest first.
AGE_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def format_age(seconds: float) -> str:
    """``3d4h``, ``5h12m``, ``1m1s``, ``42s``: the largest unit and the next one, as kubectl shows ages."""
    if seconds == float("inf"):
        return "?"
    left = max(0, int(seconds))
    for i, (unit, size) in enumerate(AGE_UNITS):
        if left >= size or unit == "s":
            return _in_units(left, i)
    raise AssertionError("unreachable")  # pragma: no cover


def _in_units(seconds: int, i: int) -> str:
    """``seconds`` in unit ``i`` of ``AGE_UNITS``, and the rest in the next unit when it is not zero."""
    unit, size = AGE_UNITS[i]
    text = f"{seconds // size}{unit}"
    if i + 1 < len(AGE_UNITS):
        next_unit, next_size = AGE_UNITS[i + 1]
        if (seconds % size) // next_size:
            text += f"{(seconds % size) // next_size}{next_unit}"
    return text


def _since(stamp: Optional[str], now: datetime) -> float:
    if not stamp:
        return float("inf")
    return (now - datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))).total_seconds()


def _age_s(obj: dict, now: datetime) -> float:
    return _since(obj.get("metadata", {}).get("creationTimestamp"), now)


def _finished_age_s(trainjob: dict, now: datetime) -> float:
    """Seconds since the TrainJob's Complete or Failed condition turned true (else since its creation)."""
    finished = _finished_condition(trainjob)
    if finished is None:
        return _age_s(trainjob, now)
    return _since(finished.get("lastTransitionTime") or trainjob["metadata"].get("creationTimestamp"), now)


def _finished_condition(trainjob: dict) -> Optional[dict]:
    """The TrainJob's Complete or Failed condition, when one is true."""
    from nemo_kubeflow.observe.status import nested

    return next(
        (
            cond
            for cond in nested(trainjob, "status", "conditions", default=[])
            if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True"
        ),
        None,
    )


def experiment_labels(experiment: str) -> Callable[[str], bool]:
    """Whether an experiment label value belongs to ``experiment``, an experiment id or title.

    The label holds ``naming.label_value(id)`` and NeMo-Run's ids are ``<title>_<time_ns>``, so
    a title matches ``<title>_<digits>``. An id too long for a label value was shortened with a
    hash of the whole id: the ids of the title's experiments run from this machine
    (``$NEMORUN_HOME/experiments/<title>/``) are recognised too.
    """
    wanted = {naming.label_value(experiment)} | _local_experiment_labels(experiment)

    def matches(label: str) -> bool:
        if label in wanted:
            return True
        stamped = re.fullmatch(r".+_(\d+)", label)
        return stamped is not None and naming.label_value(f"{experiment}_{stamped.group(1)}") == label

    return matches


def _local_experiment_labels(title: str) -> set[str]:
    """The label values of the experiments titled ``title`` that this machine ran (NeMo-Run's home)."""
    try:
        title_dir = _title_dir(title)
        if title_dir is not None:
            return {naming.label_value(d.name) for d in title_dir.iterdir() if d.is_dir()}
    except OSError:
        pass
    return set()


def _title_dir(title: str) -> Optional[Path]:
    """NeMo-Run's directory of the experiments titled ``title`` on this machine; ``None`` when there is none,
    or ``title`` cannot be a title."""
    from nemo_run.config import get_nemorun_home

    title_dir = Path(get_nemorun_home()) / "experiments" / title
    if not title or "/" in title or not title_dir.is_dir():
        return None
    return title_dir


@dataclasses.dataclass
class FinishedJobs:
    """What ``gc`` decided about the TrainJobs nemo-kubeflow created."""

    #: (namespace, TrainJob, state name, seconds since it finished), to delete.
    selected: list[tuple[str, dict, str, float]] = dataclasses.field(default_factory=list)
    #: Not finished (pending, suspended, running): never deleted.
    unfinished: int = 0
    #: Finished, but more recently than ``--older-than`` (or, with ``--expired``, than their TTL).
    recent: int = 0
    #: Finished, without a ``ttl_seconds_after_finished`` (``--expired`` leaves them).
    without_ttl: int = 0


def job_ttl(trainjob: dict) -> Optional[int]:
    """The job's ``ttl_seconds_after_finished`` (its annotation), ``None`` without one."""
    from nemo_kubeflow.observe.status import nested

    value = nested(trainjob, "metadata", "annotations", TTL_ANNOTATION)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def select_finished_jobs(
    jobs: Sequence[tuple[str, dict]],
    now: datetime,
    *,
    experiments: Sequence[str] = (),
    older_than: Optional[float] = None,
    expired: bool = False,
) -> FinishedJobs:
    """The finished TrainJobs labelled as nemo-kubeflow's among ``jobs`` ((namespace, TrainJob)
    pairs) that belong to one of ``experiments`` (all when empty) and finished at least
    ``older_than`` seconds ago; with ``expired``, only those whose own ``ttl_seconds_after_finished``
    has passed. Talks to no cluster."""
    matchers = [experiment_labels(e) for e in experiments]
    result = FinishedJobs()
    for namespace, job in jobs:
        if _gc_may_consider(job, matchers):
            _sort_in(result, namespace, job, now, older_than, expired)
    return result


def _sort_in(
    result: FinishedJobs, namespace: str, job: dict, now: datetime, older_than: Optional[float], expired: bool
) -> None:
    """Count ``job`` where it belongs in ``result``: unfinished, without a TTL (with ``expired``), recent, or
    selected."""
    state = _finished_state(job)
    if state is None:
        result.unfinished += 1
        return
    age = _finished_age_s(job, now)
    ttl = job_ttl(job)
    if expired and ttl is None:
        result.without_ttl += 1
    elif _too_recent(age, older_than, ttl if expired else None):
        result.recent += 1
    else:
        result.selected.append((namespace, job, state, age))


def _too_recent(age: float, older_than: Optional[float], ttl: Optional[int]) -> bool:
    """Whether a job that finished ``age`` seconds ago did so less than ``older_than`` ago, or within its
    ``ttl`` (``--expired``); ``None``: no such limit."""
    return _finished_within(age, older_than) or _finished_within(age, ttl)


def _finished_state(job: dict) -> Optional[str]:
    """``SUCCEEDED`` or ``FAILED``; ``None`` while the job has not finished (pending, suspended, running)."""
    from torchx.specs import AppState

    from nemo_kubeflow.observe.status import job_status

    state = job_status(job).state
    return state.name if state in (AppState.SUCCEEDED, AppState.FAILED) else None


def _gc_may_consider(job: dict, matchers: Sequence[Callable[[str], bool]]) -> bool:
    """Whether ``job`` is ours (never touch another's), of a wanted experiment (any without ``matchers``)
    and not already being deleted."""
    labels = job.get("metadata", {}).get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY_VALUE:
        return False
    if not _of_experiments(labels, matchers):
        return False
    return not job["metadata"].get("deletionTimestamp")


def _of_experiments(labels: dict, matchers: Sequence[Callable[[str], bool]]) -> bool:
    """Whether a job's experiment label matches one of ``matchers`` (every job, without them)."""
    return not matchers or any(m(labels.get(EXPERIMENT_LABEL, "")) for m in matchers)


def _finished_within(age: float, limit: Optional[float]) -> bool:
    """Whether a job that finished ``age`` seconds ago did so less than ``limit`` ago (no limit: no)."""
    return limit is not None and age < limit


def _describe(kind: str, name: str, namespace: Optional[str]) -> str:
    return f"{kind}/{name}" + (f" (namespace {namespace})" if namespace else "")


def cmd_gc(args: argparse.Namespace) -> int:
    cluster = KubernetesCluster(kubeconfig=args.kubeconfig, context=args.context)
    namespaces = _gc_namespaces(cluster, args)
    # Candidates are listed before the TrainJobs, so that a TrainJob created in between is seen.
    candidates = _gc_runtime_candidates(cluster, namespaces, args.all_namespaces)
    jobs = _list_trainjobs(cluster, namespaces)
    now = datetime.now(timezone.utc)
    finished = select_finished_jobs(
        jobs, now, experiments=args.experiment or (), older_than=args.older_than, expired=args.expired
    )
    verb = "would delete" if args.dry_run else "deleted"

    leaving: set[tuple[str, Optional[str]]] = set()
    if _gc_deletes_finished(args):
        leaving = _gc_finished_jobs(cluster, finished, args, verb)
    elif finished.selected:
        print(
            f"{len(finished.selected)} finished TrainJob(s) kept, with their pods, ConfigMaps and Secrets: "
            "pass --finished, --experiment, --older-than or --expired to delete them",
            file=sys.stderr,
        )
    _gc_runtimes(cluster, candidates, _runtimes_in_use(jobs, leaving), now, args, verb)
    return 0


def _list_trainjobs(cluster: KubernetesCluster, namespaces: Sequence[str]) -> list[tuple[str, dict]]:
    """(namespace, TrainJob) of every TrainJob of ``namespaces``."""
    return [(ns, job) for ns in namespaces for job in cluster.list(TRAINJOB_KIND, ns)]


def _gc_namespaces(cluster: KubernetesCluster, args: argparse.Namespace) -> list[str]:
    """The namespaces ``gc`` collects: every one with ``--all-namespaces``, else those given (``default``)."""
    if args.all_namespaces:
        # One list per namespace: cluster.Kind.path has no cluster-wide form for namespaced kinds.
        return [ns["metadata"]["name"] for ns in cluster.list("Namespace", None)]
    return args.namespace or ["default"]


def _gc_deletes_finished(args: argparse.Namespace) -> bool:
    """Whether the command line selects finished TrainJobs to delete (else gc only reports them)."""
    return bool(args.finished or args.experiment or args.older_than is not None or args.expired)


def _gc_runtime_candidates(
    cluster: KubernetesCluster, namespaces: Sequence[str], all_namespaces: bool
) -> list[tuple[str, Optional[str], dict]]:
    """Our runtimes that gc may delete, as (kind, namespace or None, object): ClusterTrainingRuntimes only
    with ``all_namespaces`` (TrainJobs of any namespace may use them)."""
    selector = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"
    candidates: list[tuple[str, Optional[str], dict]] = [
        (RUNTIME_KIND, ns, obj) for ns in namespaces for obj in cluster.list(RUNTIME_KIND, ns, selector)
    ]
    if all_namespaces:
        candidates += [(CLUSTER_RUNTIME_KIND, None, obj) for obj in cluster.list(CLUSTER_RUNTIME_KIND, None, selector)]
    else:
        print(
            "ClusterTrainingRuntimes skipped: TrainJobs of any namespace may use them; "
            "pass --all-namespaces to collect them too",
            file=sys.stderr,
        )
    return candidates


def _gc_finished_jobs(
    cluster: KubernetesCluster, finished: FinishedJobs, args: argparse.Namespace, verb: str
) -> set[tuple[str, Optional[str]]]:
    """Delete the selected finished TrainJobs (or say what would go, with ``--dry-run``); the (namespace,
    uid) of each one going, whose runtimes it no longer holds."""
    leaving = set()
    deleted_jobs = 0
    for ns, job, state, age in finished.selected:
        gone = _delete_finished_job(cluster, ns, job, args.dry_run)
        if gone is None:
            continue
        if gone:
            print(
                f"{verb} {_describe(TRAINJOB_KIND, job['metadata']['name'], ns)}: {state}, "
                f"finished {format_age(age)} ago"
            )
            deleted_jobs += 1
            if not args.dry_run:
                _remember_how_it_ended(ns, job, state, age)
        leaving.add((ns, job["metadata"].get("uid")))
    print(
        f"TrainJobs: {verb} {deleted_jobs} finished (their JobSets, pods, ConfigMaps and Secrets go with "
        f"them); kept {finished.unfinished} not finished{_finished_kept(finished, args)}",
        file=sys.stderr,
    )
    return leaving


def _delete_finished_job(cluster: KubernetesCluster, ns: str, job: dict, dry_run: bool) -> Optional[bool]:
    """Delete a finished TrainJob as listed: whether it is gone (with ``dry_run``: ``True``, nothing deleted),
    ``None`` when a new TrainJob has replaced it since (kept, and said so)."""
    name = job["metadata"]["name"]
    # Deleting the TrainJob lets the garbage collector remove what it owns: the JobSet and
    # its pods, the ConfigMaps, the Secret.
    try:
        # The uid: a TrainJob recreated under this name since the list is not the one that finished.
        return dry_run or cluster.delete(TRAINJOB_KIND, name, ns, uid=job["metadata"].get("uid"))
    except ClusterError as e:
        if e.status != 409:
            raise
    print(f"kept {_describe(TRAINJOB_KIND, name, ns)}: replaced by a new TrainJob since it was listed", file=sys.stderr)
    return None


def _finished_kept(finished: FinishedJobs, args: argparse.Namespace) -> str:
    """The finished TrainJobs gc kept, for its summary line: too recent, or without a TTL (``--expired``)."""
    recent = (
        f", {finished.recent} that finished less than {format_age(args.older_than)} ago"
        if args.older_than is not None
        else ""
    )
    if args.expired:
        if args.older_than is None:
            recent += f", {finished.recent} within their ttl_seconds_after_finished"
        recent += f", {finished.without_ttl} without ttl_seconds_after_finished"
    return recent


def _remember_how_it_ended(namespace: str, trainjob: dict, state: str, age: float) -> None:
    """A status of a job gc deleted says how it ended (from the app record, where this machine has one)."""
    from nemo_kubeflow.cluster import records
    from nemo_kubeflow.observe.status import job_status

    reason = job_status(trainjob).message
    deleted = f"its TrainJob was deleted by nemo-kubeflow gc {format_age(age)} after it finished"
    records.record_outcome(
        namespace, trainjob["metadata"]["name"], state, f"{reason} ({deleted})" if reason else deleted
    )


def _runtimes_in_use(
    jobs: Sequence[tuple[str, dict]], leaving: set[tuple[str, Optional[str]]]
) -> set[tuple[str, Optional[str], str]]:
    """The (kind, namespace or None, name) of the runtime each of ``jobs`` refers to, but for the jobs
    ``leaving`` ((namespace, uid): being deleted)."""
    referenced: set[tuple[str, Optional[str], str]] = set()
    for ns, job in jobs:
        if (ns, job["metadata"].get("uid")) in leaving:
            continue
        ref = job.get("spec", {}).get("runtimeRef", {})
        kind = ref.get("kind") or CLUSTER_RUNTIME_KIND  # Trainer's default
        referenced.add((kind, None if kind == CLUSTER_RUNTIME_KIND else ns, ref.get("name", "")))
    return referenced


def _gc_runtimes(
    cluster: KubernetesCluster,
    candidates: Sequence[tuple[str, Optional[str], dict]],
    referenced: set[tuple[str, Optional[str], str]],
    now: datetime,
    args: argparse.Namespace,
    verb: str,
) -> None:
    """Delete the candidate runtimes no TrainJob uses that are at least ``--min-age`` old."""
    removed = kept = young = 0
    for kind, ns, obj in candidates:
        name = obj["metadata"]["name"]
        if (kind, ns, name) in referenced:
            kept += 1
        elif _age_s(obj, now) < args.min_age:
            young += 1
        elif _delete_runtime(cluster, kind, name, ns, args.dry_run):
            removed += 1
    print(
        f"{verb} {removed}, kept {kept} in use, {young} younger than {args.min_age:g}s",
        file=sys.stderr,
    )


def _delete_runtime(cluster: KubernetesCluster, kind: str, name: str, ns: Optional[str], dry_run: bool) -> bool:
    """Delete a runtime (with ``dry_run``, say that it would go), printing it; whether it went (or would)."""
    what = _describe(kind, name, ns)
    if dry_run:
        print(f"would delete {what}")
        return True
    if cluster.delete(kind, name, ns):
        print(f"deleted {what}")
        return True
    return False


def _experiment_tasks(experiment_id: str, session: str):
    """The experiment, a scheduler, and each task as (index, job, app id or None, why not ours)."""
    exp = _load_experiment(experiment_id)  # imports NeMo-Run first, without torch
    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    scheduler = create_scheduler(session)
    # (index, job, app id or None, why not)
    tasks: list[tuple[int, Any, Optional[str], str]] = [
        (index, job, *_app_id_of(job, scheduler.backend)) for index, job in enumerate(exp.jobs)
    ]
    return exp, scheduler, tasks


def _load_experiment(experiment_id: str):  # -> nemo_run.Experiment
    """The NeMo-Run experiment of that id, or a ``ConfigError`` saying where it was looked for."""
    run = _import_nemo_run()
    from nemo_run.run.experiment import Experiment

    try:
        exp = Experiment.from_id(experiment_id)
    except (AssertionError, FileNotFoundError, ValueError):
        exp = None
    if exp is None:
        raise ConfigError(
            f"no experiment {experiment_id!r} under {run.config.get_nemorun_home()}/experiments: "
            "give the id NeMo-Run printed (<title>_<number>), e.g. from `nemo experiment list <title>`"
        )
    return exp


def _app_id_of(job: Any, backend: str) -> tuple[Optional[str], str]:
    """(the app id of a task launched on Kubeflow Trainer, "") or (None, why it has none)."""
    from torchx.specs import parse_app_handle

    handle = getattr(job, "handle", "") or ""
    if not handle:
        return None, "not launched"
    scheduler_name, _, app_id = parse_app_handle(handle)
    if scheduler_name != backend:
        return None, f"run by {scheduler_name}, not by Kubeflow Trainer"
    return app_id, ""


def _exit_code(states: Sequence[Any]) -> int:
    """1 when a task failed, else 0 (``status``, ``watch``)."""
    return 1 if any(state.name == "FAILED" for state in states) else 0


def cmd_status(args: argparse.Namespace) -> int:
    """Each task of an experiment: its TrainJob, state and why (the reason NeMo-Run's status omits)."""
    exp, scheduler, tasks = _experiment_tasks(args.experiment, "nemo-kubeflow-status")
    print(f"Experiment {exp._id}")
    states = []
    for index, job, app_id, why_not in tasks:
        if app_id is None:
            print(f"Task {index}: {job.id}: {why_not}")
            continue
        desc = scheduler.describe(app_id)
        namespace, name = app_id.split(":", 1)
        print(f"Task {index}: {job.id} (TrainJob {namespace}/{name})")
        print(f"  state: {desc.state.name}")
        if desc.msg:
            print("  why:   " + desc.msg.replace("\n", "\n         "))
        states.append(desc.state)
    return _exit_code(states)


def cmd_watch(args: argparse.Namespace) -> int:
    """Look at an experiment's tasks until they finish, printing each change of state or reason, and apply
    the repairs each look recommends (repair/steps.py: move a job off a node that failed it, delete a job
    that can never start, keep the node logs of a failed one), printing each; so this keeps a detached job
    looked after with no `nemo experiment run` attached. A status query only reads."""
    from torchx.specs import is_terminal

    exp, scheduler, tasks = _experiment_tasks(args.experiment, "nemo-kubeflow-watch")
    ours = _launched(tasks)
    if not ours:
        raise ConfigError(f"experiment {exp._id} has no task launched on Kubeflow Trainer: nothing to watch")
    print(f"Watching experiment {exp._id} (every {args.interval:g}s; Ctrl-C stops watching, not the jobs)", flush=True)
    shown: dict[int, str] = {}
    while True:
        states = [_look_after_task(scheduler, index, job, app_id, shown) for index, job, app_id in ours]
        if all(is_terminal(state) for state in states):
            return _exit_code(states)
        time.sleep(args.interval)


def _launched(tasks: list) -> list[tuple[int, Any, str]]:
    """(index, job, app id) of the tasks launched on Kubeflow Trainer."""
    return [(index, job, app_id) for index, job, app_id, _ in tasks if app_id is not None]


def _look_after_task(scheduler: Any, index: int, job: Any, app_id: str, shown: dict[int, str]) -> Any:
    """One look at a task (``watch``): print the repairs it made and its state line when that changed
    (``shown``: the last line printed per task); its state."""
    desc, repaired = scheduler.look_after(app_id)
    for what in repaired:
        print(f"{time.strftime('%H:%M:%S')} Task {index}: {job.id}: repaired: {what}", flush=True)
    line = desc.state.name + (f": {desc.msg}" if desc.msg else "")
    if shown.get(index) != line:
        shown[index] = line
        print(f"{time.strftime('%H:%M:%S')} Task {index}: {job.id}: {line}", flush=True)
    return desc.state


def _select_tasks(tasks: list, wanted: Optional[Sequence[str]]) -> list:
    """The tasks ``--task`` names (by index or by name), in the experiment's order; all without it."""
    if not wanted:
        return tasks
    names = _task_names(tasks)
    _check_task_names(wanted, names, tasks)
    chosen = {names[w] for w in wanted}
    return [task for task in tasks if task[0] in chosen]


def _check_task_names(wanted: Sequence[str], names: dict[str, int], tasks: list) -> None:
    """Refuse a ``--task`` that names no task, listing the tasks."""
    for name in wanted:
        if name not in names:
            choices = ", ".join(f"{index} ({job.id})" for index, job, *_ in tasks)
            raise ConfigError(f"--task {name}: the experiment has no such task; its tasks: {choices}")


def _task_names(tasks: list) -> dict[str, int]:
    """The index of each task by the names ``--task`` takes: its index, and its name (which wins)."""
    return {str(index): index for index, *_ in tasks} | {job.id: index for index, job, *_ in tasks}


def cmd_logs(args: argparse.Namespace) -> int:
    """Print, or follow, the logs of an experiment's tasks: each line after ``<task>/<node>``, as
    ``nemo experiment logs`` prints it, from a process that leaves torch out (``_import_nemo_run``):
    about 470 MiB less than NeMo-Run's own command holds while it follows (benchmarks, `logs`)."""
    exp, scheduler, tasks = _experiment_tasks(args.experiment, "nemo-kubeflow-logs")
    streams = _log_streams(scheduler, _select_tasks(tasks, args.task))
    if not streams:
        raise ConfigError(f"experiment {exp._id}: no task of it has a TrainJob to read logs from")
    show = functools.partial(_print_log, scheduler, args.follow, threading.Lock())
    if not args.follow:
        for stream in streams:
            show(*stream)
        return 0
    _follow_logs(streams, show)
    return 0


def _log_streams(scheduler: Any, tasks: list) -> list[tuple[str, str, int]]:
    """(app id, role, node index) of each node of each task that has a TrainJob; why a task has none
    goes to stderr."""
    streams = []
    for index, job, app_id, why_not in tasks:
        streams += _task_streams(scheduler, index, job, app_id, why_not)
    return streams


def _task_streams(
    scheduler: Any, index: int, job: Any, app_id: Optional[str], why_not: str
) -> list[tuple[str, str, int]]:
    """The log streams of one task's nodes, or none, saying why on stderr (not ours, or no TrainJob)."""
    if app_id is None:
        print(f"Task {index}: {job.id}: {why_not}", file=sys.stderr)
        return []
    desc = scheduler.describe(app_id)
    if desc is None or not desc.roles:
        print(f"Task {index}: {job.id}: TrainJob {app_id.replace(':', '/')} not found", file=sys.stderr)
        return []
    # named after the task, as its TrainJob's role is (which a TrainJob cleaned up no longer tells)
    return [(app_id, job.id, k) for k in range(desc.roles[0].num_replicas)]


def _print_log(scheduler: Any, follow: bool, printing: threading.Lock, app_id: str, role: str, k: int) -> None:
    """Print the log of node ``k``, each line after NeMo-Run's prefix (the role cut to its last 10 characters);
    ``printing`` keeps the lines of different nodes whole."""
    prefix = f"{role[-10:]}/{k} "
    for line in scheduler.log_iter(app_id, role, k, should_tail=follow):
        with printing:
            sys.stdout.write(prefix + line)
            sys.stdout.flush()


def _follow_logs(streams: Sequence[tuple[str, str, int]], show: Callable[[str, str, int], None]) -> None:
    """``show`` each stream in a thread of its own until all end, as NeMo-Run follows them; the scheduler's
    log follower reads them all with a fixed number of connections (log_follower.LOG_READERS)."""
    threads = [
        threading.Thread(target=show, args=stream, daemon=True, name=f"follow-{stream[2]}") for stream in streams
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # wakes for Ctrl-C


# --- command line --------------------------------------------------------------------------


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

    _experiment_command(
        sub,
        cmd_status,
        "say what each task of an experiment is doing, and why it failed",
        "For each task of a NeMo-Run experiment: its TrainJob, its state, and the reason (the failed rank and its "
        "exception, exit code or signal, the last lines of the node; or what a pending job waits for). Exit code 1 "
        "if a task failed.",
    )

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
    logs.add_argument(
        "--task",
        "-t",
        action="append",
        metavar="INDEX_OR_NAME",
        help="only this task, by index or name (repeatable; default: every task)",
    )
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
