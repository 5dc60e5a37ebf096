"""The executor configuration of ``render``, ``validate`` and ``doctor``: a factory or ``--executor-file``,
with ``--set FIELD=VALUE`` overrides in NeMo-Run's CLI syntax."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import json
import os
import re
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from nemo_kubeflow.cli.nemo_run_import import _import_nemo_run
from nemo_kubeflow.errors import ConfigError, NemoKubeflowError

if TYPE_CHECKING:
    import fiddle as fdl
    from nemo_run.cli.cli_parser import CLIException

    from nemo_kubeflow.config.executor import KubeflowExecutor


DEFAULT_FACTORY = "kubeflow_gpu"


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
