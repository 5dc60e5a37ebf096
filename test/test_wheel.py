"""The built wheel carries the runtime templates and the compiled schemas: a non-editable install renders
and validates with them. The local cluster is a distribution of its own (local/): the product's wheel carries
none of it and does not require what only it needs (cryptography)."""

import subprocess
import sys
import zipfile
from email.parser import Parser
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
    assert not any(n.startswith(("nemo_kubeflow_local/", "local/")) for n in names), "the local cluster is local/'s"
    assert "cryptography" not in _requirements(wheel), "only the local cluster needs cryptography"

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


def _requirements(wheel: Path) -> set[str]:
    """The names of the distributions ``wheel`` requires (its METADATA's Requires-Dist, extras' included)."""
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(archive.read(metadata).decode())
    names = set()
    for requirement in message.get_all("Requires-Dist") or []:
        name = requirement.split(";")[0].strip()
        for stop in "<>=!~[ (":
            name = name.split(stop)[0]
        names.add(name.lower().replace("_", "-"))
    return names


def test_local_cluster_wheel_holds_the_package_and_its_requirements(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(REPO / "local")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    [wheel] = (tmp_path / "dist").glob("nemo_kubeflow_local-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "nemo_kubeflow_local/local_cluster.py" in names
    assert "nemo_kubeflow_local/kubelet/container_init.py" in names  # run by path, as each container's init
    assert not any(n.startswith(("nemo_kubeflow/", "test/")) for n in names)
    requirements = _requirements(wheel)
    assert "cryptography" in requirements and "nemo-kubeflow" not in requirements, requirements
