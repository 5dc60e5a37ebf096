"""``nemo-kubeflow validate``: YAML manifests (and a runtime template) validated offline, as a submission
would validate them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

from nemo_kubeflow.cli.executor_config import load_executor
from nemo_kubeflow.errors import ConfigError, TemplateError


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
