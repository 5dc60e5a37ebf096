"""The built wheel carries the runtime templates and the compiled schemas: a non-editable install renders
and validates with them."""

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_ships_templates_and_renders_from_them(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    [wheel] = (tmp_path / "dist").glob("nemo_kubeflow-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "nemo_kubeflow/templates/training_runtime.yaml.j2" in names
    assert "nemo_kubeflow/schema/schemas.json" in names  # the compiled schemas offline validation reads
    assert "nemo_kubeflow/py.typed" in names  # type checkers read the package's annotations (PEP 561)
    assert not any(n.startswith(("test/", "templates/")) for n in names)

    # Unpacked outside the repository, like site-packages: only the wheel's own files are found.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import nemo_kubeflow, nemo_kubeflow.build.plan as plan, nemo_kubeflow.build.render as r\n"
        "from nemo_kubeflow.parts.templates import templates_dir\n"
        f"assert nemo_kubeflow.__file__.startswith({str(site)!r}), nemo_kubeflow.__file__\n"
        "from nemo_kubeflow import KubeflowExecutor\n"
        "rt = r.render_runtime(r.runtime_context(plan.resolve(KubeflowExecutor(container_image='img', nodes=2))))\n"
        "from nemo_kubeflow.schema.validation import validate_manifest\n"
        "assert validate_manifest(rt) == [] and validate_manifest({**rt, 'spek': 1}) != [], 'schemas.json'\n"
        "print(templates_dir(), rt['metadata']['name'])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith(str(site / "nemo_kubeflow" / "templates"))
