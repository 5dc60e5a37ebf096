"""deferred_imports: a module imported with some packages as stand-ins (each case in a fresh
interpreter, whose sys.modules is its own; the stdlib's xmlrpc stands for a heavy package)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

#: imports xmlrpc's names at import time, subclasses one, calls one (a module-level client)
USES_NAMES = """
from xmlrpc.client import ServerProxy, Fault
import xmlrpc.server as server

class Proxy(ServerProxy):
    pass

DEFAULT = ServerProxy("http://127.0.0.1:1")

def connect(url):
    return ServerProxy(url)
"""

#: reads a dunder of the package at import time: a stand-in has none, so this module imports in full
READS_DUNDER = """
import xmlrpc
WHERE = xmlrpc.__file__
"""

CHECK = """
import importlib, json, sys
from nemo_kubeflow.nemo_run.deferred_imports import DeferredImportError, StandInModule, import_deferring
if {preload}:
    import xmlrpc.client
module = import_deferring("{module}", ["xmlrpc"])
report = {{
    "xmlrpc_loaded_by_then": "xmlrpc" in sys.modules,
    "stand_in_modules_left": [n for n, m in sys.modules.items() if isinstance(m, StandInModule)],
}}
import xmlrpc.client  # after the import: the real package
report["later_import_is_real"] = xmlrpc.client.__file__.endswith("client.py")
if hasattr(module, "connect"):
    try:
        module.connect("http://127.0.0.1:1")
    except DeferredImportError as e:
        report["error"] = str(e)
if hasattr(module, "WHERE"):
    report["where"] = module.WHERE
print(json.dumps(report))
"""


def run_check(tmp_path, module: str, source: str, preload: bool = False, **env) -> dict:
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    proc = subprocess.run(
        [sys.executable, "-c", CHECK.format(module=module, preload=preload)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path), **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_stand_ins_while_importing_then_the_real_package(tmp_path):
    report = run_check(tmp_path, "uses_names", USES_NAMES)
    assert report["xmlrpc_loaded_by_then"] is False
    assert report["stand_in_modules_left"] == []
    assert report["later_import_is_real"] is True
    # the module that imported a stand-in keeps it: using it says what happened and how to turn it off
    assert report["error"] == (
        "xmlrpc.client.ServerProxy is from xmlrpc, which this command does not import (it defers it to start "
        "faster); set NEMO_KUBEFLOW_FULL_IMPORT=1 to import it"
    )


def test_a_module_that_needs_the_package_while_importing_is_imported_in_full(tmp_path):
    report = run_check(tmp_path, "reads_dunder", READS_DUNDER)
    assert report["where"].endswith(os.path.join("xmlrpc", "__init__.py"))
    assert report["stand_in_modules_left"] == []


@pytest.mark.parametrize("how", ["env", "already imported"])
def test_imports_in_full_when_turned_off_or_the_package_is_already_there(tmp_path, how):
    env = {"NEMO_KUBEFLOW_FULL_IMPORT": "1"} if how == "env" else {}
    report = run_check(tmp_path, "uses_names", USES_NAMES, preload=how != "env", **env)
    assert report["xmlrpc_loaded_by_then"] is True
    assert "error" not in report  # the real ServerProxy: connecting lazily, it raises nothing yet
