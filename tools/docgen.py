"""Generate the configuration reference (docs/executor.md) from the ``#:`` field comments, and the
table of network fabric profiles in docs/fabrics.md from the registry (``fabrics.PROFILES``).

    python -m tools.docgen > docs/executor.md
    python -m tools.docgen --fabrics-table     # the table at the top of docs/fabrics.md

The comments above each dataclass field are the single source: Sphinx autodoc reads the
same ``#:`` convention, and a test checks that docs/executor.md is up to date.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import typing


def field_docs(cls: type) -> dict[str, str]:
    """``{field: doc}`` from the ``#:`` comment lines directly above each field of ``cls``."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    tree = ast.parse(source)
    docs: dict[str, str] = {}
    [node] = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            comment: list[str] = []
            i = stmt.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#:"):
                comment.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            docs[stmt.target.id] = " ".join(comment)
    return docs


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return repr(value) if not dataclasses.is_dataclass(value) else f"{type(value).__name__}()"
    return "required"


def _type(f: dataclasses.Field) -> str:
    t = f.type
    # A plain class by its name; ``dict[str, str]`` as written (on Python 3.10 it also passes ``isinstance(t, type)``).
    text = t.__name__ if isinstance(t, type) and not typing.get_args(t) else str(t)
    text = re.sub(r"ForwardRef\('([\w.]+)'\)", r"\1", text)  # Optional["Initializer"]
    return re.sub(r"\b(typing|nemo_kubeflow(\.\w+)+)\.", "", text)


def _lands(name: str, with_runtime_name: bool) -> str:
    """Where a field lands (config/landing.py), for the "lands in" columns."""
    from nemo_kubeflow.config.landing import LANDINGS

    lands = LANDINGS[name]
    where = lands.where(with_runtime_name)
    kind, _, path = where.partition(": ")
    return f"{kind}: `{path}`" if path and " " not in path else where


def reference(cls: type, inherited: bool = False, landing: bool = False) -> str:
    """The fields of ``cls`` as a table; ``landing``: with where each lands, with a rendered runtime and with
    ``runtime_name`` (the executor's fields)."""
    docs = field_docs(cls)
    head = "| field | type | default | meaning |"
    if landing:
        head += " lands in (rendered runtime) | lands in (`runtime_name`) |"
    rows = [head, "|" + "---|" * head.count(" |")]
    for f in dataclasses.fields(cls):
        if not f.init or (f.name not in docs and not inherited):
            continue
        doc = docs.get(f.name, "").replace("|", "\\|")
        row = f"| `{f.name}` | `{_type(f)}` | `{_default(f)}` | {doc} |"
        if landing:
            row += f" {_lands(f.name, False)} | {_lands(f.name, True)} |"
        rows.append(row)
    return "\n".join(rows)


def render() -> str:
    from nemo_kubeflow.config.executor import KubeflowExecutor, PVCMount, SecretMount
    from nemo_kubeflow.config.packager import ConfigMapPackager
    from nemo_kubeflow.parts.fabrics import PROFILES
    from nemo_kubeflow.parts.initializers import InitializerSettings

    parts = [
        "# Configuration reference",
        "",
        "Generated from the `#:` comments of the dataclasses by `python -m tools.docgen`; do not edit by hand.",
        "",
        "## KubeflowExecutor",
        "",
        "Also inherits NeMo-Run's `Executor` fields: `packager` (default `ConfigMapPackager()`), "
        '`launcher` (`"torchrun"` or `run.Torchrun(...)` for distributed tasks), `env_vars` '
        "(plain environment of the training container), `retries` (gang restarts of the whole job, "
        "`failurePolicy.maxRestarts`; refused with `runtime_name`, whose runtime has its own). Their landing is "
        "declared with the others in nemo_kubeflow/config/landing.py.",
        "",
        "The last two columns say where each value lands (nemo_kubeflow/config/landing.py): `trainjob` (the "
        "TrainJob), `runtime` (the rendered runtime), `runtime_patch` (the TrainJob's `spec.runtimePatches`, "
        "the job's own pod changes), `script` (the launch script), `client` (the submitting machine only). "
        "With `runtime_name` (an admin's runtime, docs/templates.md) a field marked refused makes `validate()` "
        "fail when it is set; paths are from the object's root, `[node]` is the list item named `node`.",
        "",
        reference(KubeflowExecutor, landing=True),
    ]
    for cls in (
        PVCMount,
        SecretMount,
        *(p.settings for p in PROFILES.values()),
        InitializerSettings,
        ConfigMapPackager,
    ):
        doc = inspect.getdoc(cls) or ""
        parts += ["", f"## {cls.__name__}", "", doc.split("\n\n")[0], "", reference(cls)]
    return "\n".join(parts) + "\n"


def fabrics_table() -> str:
    """The profiles of docs/fabrics.md: machines, settings, and the Pod Security profile their pods pass
    (from what each profile's default settings build)."""
    from nemo_kubeflow.config.executor import KubeflowExecutor
    from nemo_kubeflow.parts.fabrics import PROFILES, build_fabric

    rows = [
        "| `network_fabric` | Machines | Parameters | Pod Security profile the namespace must allow |",
        "|---|---|---|---|",
        '| `"none"` (default) | anything | | baseline (restricted with `restricted_security`) |',
    ]
    for p in PROFILES.values():
        fabric = build_fabric(KubeflowExecutor(container_image="img", gpus_per_node=8, network_fabric=p.name))
        security = "privileged" if fabric.privileges() else "baseline, or restricted"
        rows.append(f'| `"{p.name}"` | {p.machines} | `{p.field}: {p.settings.__name__}` | {security} |')
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    import sys

    print(fabrics_table() if "--fabrics-table" in sys.argv[1:] else render(), end="")
