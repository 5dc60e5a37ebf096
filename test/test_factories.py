"""The run.executor=kubeflow_* factories, as nemo_run's CLI finds and uses them in processes of their own
(in this process: test/unit/config/test_factories.py)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from nemo_kubeflow.config.factories import (
    LOCAL_KUBECONFIG_ENV,
)

REPO = Path(__file__).resolve().parent.parent


def cli_env(nemorun_home, **extra) -> dict:
    # Wide columns: nemo prints the executor through rich, which wraps at 80 otherwise.
    return {**os.environ, "NEMORUN_HOME": str(nemorun_home), "COLUMNS": "400", **extra}


def test_factories_resolve_in_a_fresh_process_without_importing_the_package(tmp_path, nemorun_home):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    code = textwrap.dedent("""
        import json, sys
        import fiddle as fdl
        import nemo_run as run
        before = set(sys.modules)
        assert not any(m.startswith("nemo_kubeflow") for m in before), "imported too early"
        out = {}
        for name in ("kubeflow_gpu", "kubeflow_cpu", "kubeflow_tcpxo", "kubeflow_local"):
            e = fdl.build(run.cli.resolve_factory(run.Executor, name)())
            out[name] = {k: getattr(e, k) for k in (
                "nodes", "nprocs_per_node", "gpus_per_node", "launcher", "shm_size", "cpu_request",
                "enable_tcpxo", "node_selector", "tolerations", "kubeconfig", "container_image")}
            out[name]["type"] = type(e).__name__
        out["imported"] = sorted(set(sys.modules) - before)
        print(json.dumps(out))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(nemorun_home, **{LOCAL_KUBECONFIG_ENV: str(kubeconfig)}),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    gpu, cpu, tcpxo, local = (out[n] for n in ("kubeflow_gpu", "kubeflow_cpu", "kubeflow_tcpxo", "kubeflow_local"))
    assert {gpu["type"], cpu["type"], tcpxo["type"], local["type"]} == {"KubeflowExecutor"}
    assert (gpu["nodes"], gpu["nprocs_per_node"], gpu["gpus_per_node"]) == (1, 8, 8)
    assert gpu["launcher"] == "torchrun" and gpu["shm_size"] == "16Gi"
    assert cpu["gpus_per_node"] == 0 and cpu["cpu_request"] == "1"
    assert tcpxo["enable_tcpxo"] and tcpxo["gpus_per_node"] == 8 and tcpxo["nodes"] == 2
    assert tcpxo["node_selector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"}
    assert tcpxo["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert local["kubeconfig"] == str(kubeconfig) and local["gpus_per_node"] == 0
    # The entry point is loaded for every `nemo` command: it must not drag in the heavy modules.
    heavy = {
        "nemo_kubeflow.nemo_run.scheduler",
        "nemo_kubeflow.schema.validation",
        "nemo_kubeflow.build.render",
        "jinja2",
        "kubeflow_trainer_api",
        "nemo_kubeflow.cli.main",
    }
    assert heavy.isdisjoint(out["imported"]), heavy & set(out["imported"])
    # nor any of offline validation's modules (schema/ is a module per what it validates)
    assert not [m for m in out["imported"] if m.startswith("nemo_kubeflow.schema.")]


def test_nemo_console_script_dry_runs_another_packages_entrypoint(tmp_path, nemorun_home, console_script):
    # A third-party package with its own nemo_run.cli entry point; it never imports nemo_kubeflow.
    site = tmp_path / "site"
    (site / "probe_pkg").mkdir(parents=True)
    (site / "probe_pkg" / "__init__.py").write_text(
        textwrap.dedent("""
        import nemo_run as run

        @run.cli.entrypoint(namespace="probe")
        def hello(name: str = "world") -> None:
            print(f"hello {name}")
    """)
    )
    dist = site / "probe_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: probe-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[nemo_run.cli]\nprobe = probe_pkg\n")
    pythonpath = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)

    proc = subprocess.run(
        [
            console_script("nemo"),
            "probe",
            "hello",
            "name=kubeflow",
            "run.executor=kubeflow_gpu",
            "run.executor.nodes=2",
            "run.executor.namespace=team",
            "--dryrun",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=cli_env(nemorun_home, PYTHONPATH=pythonpath),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "Error" not in out, out[-3000:]
    assert "Dry run for task probe_pkg:hello" in out
    assert "KubeflowExecutor(" in out and "nodes=2" in out and "namespace='team'" in out
    assert "gpus_per_node=8" in out and "launcher='torchrun'" in out


def test_nemo_finds_the_example_entrypoint_through_the_workspace_file(nemorun_home, console_script):
    proc = subprocess.run(
        [
            console_script("nemo"),
            "kubeflow",
            "train",
            "run.executor=kubeflow_gpu",
            "run.executor.nodes=2",
            "steps=7",
            "--dryrun",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO / "examples" / "kubeflow",
        env=cli_env(nemorun_home),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Dry run for task train_entrypoint:train" in proc.stdout, proc.stdout[-3000:]
    assert "nodes=2" in proc.stdout and "│ steps" in proc.stdout and "│ 7" in proc.stdout
