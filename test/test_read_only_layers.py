"""Only cluster/ and repair/ (and the scheduler's submit and cancel) call the write verbs; observing is typed
with the read-only `ClusterReader`, so mypy refuses a write there too. Pure: reads the source."""

import ast
from pathlib import Path

import nemo_kubeflow

PACKAGE = Path(nemo_kubeflow.__file__).resolve().parent
WRITE_VERBS = {"create", "patch", "delete"}


def write_calls(tree: ast.AST) -> list[str]:
    """`<x>.create(...)`, `.patch(...)`, `.delete(...)` calls on something named like a cluster."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITE_VERBS:
            receiver = ast.unparse(node.func.value)
            if "cluster" in receiver.lower():
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}")
    return found


def test_observe_never_calls_a_write_verb_and_is_typed_with_the_reader():
    for path in sorted((PACKAGE / "observe").glob("*.py")):
        source = path.read_text()
        assert write_calls(ast.parse(source)) == [], path
        annotations = [
            ast.unparse(n.annotation)
            for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.arg) and n.arg == "cluster" and n.annotation is not None
        ]
        assert all("ClusterReader" in a for a in annotations), (path, annotations)


def test_the_scheduler_writes_only_to_submit_cancel_and_through_the_repair_step():
    tree = ast.parse((PACKAGE / "nemo_run" / "scheduler.py").read_text())
    scheduler = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KubeflowTrainerScheduler")
    writers = {f.name for f in scheduler.body if isinstance(f, ast.FunctionDef) and write_calls(f)}
    assert writers == {"_cancel_existing"}, writers
    methods = {f.name: ast.unparse(f) for f in scheduler.body if isinstance(f, ast.FunctionDef)}
    # The repair step is applied by look_after's _repair, and only there.
    assert "self._repair(" in methods["look_after"] and "steps.apply(" in methods["_repair"]
    assert [name for name, text in methods.items() if "steps.apply(" in text] == ["_repair"]
    for name in ("describe", "observe", "_observe_or_unknown", "log_iter"):
        text = methods[name]
        assert not any(call in text for call in ("steps.apply", "self._repair(", "node_avoidance.move")), name


def test_describe_and_observe_are_typed_to_read():
    from nemo_kubeflow.cluster.client import ClusterReader
    from nemo_kubeflow.nemo_run.scheduler import KubeflowTrainerScheduler
    from nemo_kubeflow.observe import node_faults
    from nemo_kubeflow.repair import node_avoidance

    # Annotations are strings (`from __future__ import annotations`): the name mypy checks against.
    assert KubeflowTrainerScheduler.observe.__annotations__["cluster"] == "ClusterReader"
    assert node_faults.assess.__annotations__["cluster"] == "ClusterReader"
    assert node_avoidance.move.__annotations__["cluster"] == "Cluster"
    assert not {"create", "patch", "delete"} & set(dir(ClusterReader))
