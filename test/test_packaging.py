"""Tests for nemo_kubeflow.build.packaging and nemo_kubeflow.config.packager: ConfigMap manifests, the unpack prologue, and collect().

Golden files live in test/data/packaging/; set NEMO_KUBEFLOW_UPDATE_GOLDEN=1 to rewrite them.
"""

import base64
import io
import logging
import os
import random
import re
import shutil
import string
import subprocess
import tarfile
from pathlib import Path

import fiddle as fdl
import pytest
import yaml
from nemo_run.core.serialization.yaml import YamlSerializer
from nemo_run.core.serialization.zlib_json import ZlibJSONSerializer

from nemo_kubeflow.build import packaging
from nemo_kubeflow.build.packaging import CodePackage, build_code_package, describe_package
from nemo_kubeflow.config import packager
from nemo_kubeflow.config.packager import BundleFile, ConfigMapPackager, redact_executor_yaml
from nemo_kubeflow.constants import BUNDLE_HASH_ANNOTATION, CONFIGMAP_MAX_BYTES
from nemo_kubeflow.errors import ConfigError, PackageTooLargeError, PackagingError

GOLDEN = Path(__file__).parent / "data" / "packaging"
KEY_RE = re.compile(r"[-._a-zA-Z0-9]+")
CANARY = "canary-s3cr3t-7f3a9c"
BINARY = bytes(range(256)) + b"\xff\xfe\x00\x80"


# --- helpers -------------------------------------------------------------------------------------


def small_files() -> list[BundleFile]:
    return [
        BundleFile(path="__main__.py", data=b"import nemo_run as run\n"),
        BundleFile(path="task-0/configs/task-0_fn_or_script", data=b"eJzLSM3JyVcozy/KSQEAGgQEXQ=="),
        BundleFile(path="scripts/task-0.sh", data=b"#!/usr/bin/bash\necho hello\n", mode=0o755),
        BundleFile(path="code/pkg/model.py", data=b"class Model:\n    pass\n"),
        BundleFile(path="code/assets/logo.bin", data=BINARY),
    ]


def plain_tree(pkg: CodePackage) -> dict[str, tuple[bytes, int]]:
    """What the kubelet would project into the pod: path -> (bytes, mode), from the volume items."""
    (cm,) = pkg.configmaps
    (volume,) = pkg.volumes
    tree = {}
    for item in volume["configMap"]["items"]:
        key = item["key"]
        if key in cm["data"]:
            data = cm["data"][key].encode("utf-8")
        else:
            data = base64.b64decode(cm["binaryData"][key])
        tree[item["path"]] = (data, item["mode"])
    return tree


def archive_bytes(pkg: CodePackage) -> bytes:
    return b"".join(base64.b64decode(cm["binaryData"][packaging.SHARD_KEY]) for cm in pkg.configmaps)


def sharded_tree(pkg: CodePackage) -> dict[str, tuple[bytes, int]]:
    with tarfile.open(fileobj=io.BytesIO(archive_bytes(pkg)), mode="r:gz") as tar:
        return {m.name: (tar.extractfile(m).read(), m.mode) for m in tar.getmembers() if m.isfile()}


def expected_tree(files: list[BundleFile]) -> dict[str, tuple[bytes, int]]:
    return {f.path: (f.data, f.mode) for f in files}


def all_text(pkg: CodePackage) -> str:
    """Every byte the package puts anywhere, decoded, for leak checks."""
    parts = [yaml.safe_dump([pkg.configmaps, pkg.volumes, pkg.volume_mounts]), pkg.prologue]
    tree = plain_tree(pkg) if pkg.mode == "plain" else sharded_tree(pkg)
    parts += [data.decode("utf-8", errors="replace") for data, _ in tree.values()]
    return "\n".join(parts)


def fake_python(rng: random.Random, size: int) -> str:
    """Random but realistic Python: identifiers from a vocabulary, usual keywords and shapes."""
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(2500)]
    types = [
        "int",
        "str",
        "float",
        "bool",
        "list[int]",
        "dict[str, Any]",
        "Optional[Tensor]",
        "Tensor",
    ]
    out: list[str] = ["from typing import Any, Optional\n\nimport torch\nfrom torch import Tensor\n\n"]
    length = 0
    while length < size:
        w = rng.choices(words, k=14)
        n = rng.randint(0, 4096)
        block = (
            f"\n\nclass {w[0].title()}{w[1].title()}(torch.nn.Module):\n"
            f'    """{w[2].capitalize()} the {w[3]} of a {w[4]} before {w[5]} {w[6]}."""\n\n'
            f"    def __init__(self, {w[7]}: {rng.choice(types)}, "
            f"{w[8]}: {rng.choice(types)} = {n}) -> None:\n"
            f"        super().__init__()\n"
            f"        self.{w[7]} = {w[7]}\n"
            f"        self.{w[8]} = torch.nn.Linear({w[7]}, {n % 512 + 1})\n\n"
            f"    def {w[9]}_{w[10]}(self, {w[11]}: Tensor) -> Tensor:\n"
            f"        if {w[11]}.dim() != {n % 5}:\n"
            f'            raise ValueError(f"expected {w[12]} to have {n % 5} dims, '
            f'got {{{w[11]}.shape}}")\n'
            f"        for {w[13]} in range({n % 97}):\n"
            f"            {w[11]} = self.{w[8]}({w[11]}) * {rng.random():.6f}\n"
            f"        return {w[11]}.{rng.choice(['sum', 'mean', 'relu', 'softmax'])}(dim=-1)\n"
        )
        out.append(block)
        length += len(block)
    return "".join(out)


class _GoldenDumper(yaml.SafeDumper):
    """Writes multi-line strings (scripts, the prologue) as literal blocks, for readable diffs."""


_GoldenDumper.add_representer(
    str,
    lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None),
)


def check_golden(name: str, actual: dict) -> None:
    path = GOLDEN / name
    if os.environ.get("NEMO_KUBEFLOW_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.dump(actual, Dumper=_GoldenDumper, sort_keys=False, width=120))
    assert actual == yaml.safe_load(path.read_text())


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """An experiment dir as nemo_run leaves it: __main__.py, <task>/configs, <task>/scripts."""
    exp = tmp_path / "exp"
    job = exp / "task-0"
    (job / "configs").mkdir(parents=True)
    (job / "scripts").mkdir()
    (exp / "__main__.py").write_text("def main():\n    pass\n")
    (job / "configs" / "task-0_fn_or_script").write_text("eJzLSM3JyVcozy/KSQEAGgQEXQ==")
    (job / "configs" / "task-0_executor.yaml").write_text(
        "_target_: nemo_kubeflow.config.executor.KubeflowExecutor\n"
        f"env_vars:\n  HF_TOKEN: {CANARY}\n  WANDB_API_KEY: {CANARY}-2\n"
        "namespace: team-a\nretries: 2\n"
        "packager:\n  _target_: nemo_kubeflow.config.packager.ConfigMapPackager\n  mode: auto\n"
    )
    script = job / "scripts" / "task-0.sh"
    script.write_text("#!/usr/bin/bash\necho hello\n")
    script.chmod(0o755)
    (job / "task-0.log").write_text("not shipped\n")
    return job


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """User code with the usual clutter next to it."""
    root = tmp_path / "repo"
    for rel, text in {
        "train.py": "print('train')\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "class Model: ...\n",
        "pkg/sub/layers.py": "X = 1\n",
        "pkg/data.json": "{}\n",
        ".git/config": "[core]\n",
        ".venv/lib/site.py": "venv\n",
        "pkg/__pycache__/model.cpython-311.pyc": "bytecode",
        "pkg/stale.pyc": "bytecode",
        "node_modules/x/index.js": "js\n",
    }.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def collect(packager: ConfigMapPackager, job_dir: Path, repo: Path) -> dict[str, BundleFile]:
    return {f.path: f for f in packager.collect(job_dir=str(job_dir), base_path=str(repo))}


# --- plain mode ----------------------------------------------------------------------------------


def test_plain_golden():
    pkg = build_code_package(small_files(), name="exp-1-task-0", namespace="team-a", labels={"app": "x"})
    assert pkg.mode == "plain" and pkg.prologue == ""
    check_golden(
        "plain_small.yaml",
        {
            "configmaps": pkg.configmaps,
            "volumes": pkg.volumes,
            "volume_mounts": pkg.volume_mounts,
            "digest": pkg.digest,
            "file_count": pkg.file_count,
            "total_bytes": pkg.total_bytes,
        },
    )


def test_plain_items_restore_tree_binary_and_modes():
    files = small_files()
    pkg = build_code_package(files, name="cm", namespace="ns", mode="plain")
    assert plain_tree(pkg) == expected_tree(files)
    (cm,) = pkg.configmaps
    # Text goes to data, anything else to binaryData.
    assert set(cm["binaryData"]) == {packaging._configmap_key("code/assets/logo.bin")}
    assert cm["data"][packaging._configmap_key("code/pkg/model.py")] == "class Model:\n    pass\n"
    modes = {i["path"]: i["mode"] for i in pkg.volumes[0]["configMap"]["items"]}
    assert modes["scripts/task-0.sh"] == 0o755 and modes["code/pkg/model.py"] == 0o644
    assert pkg.volume_mounts == [{"name": packaging.CODE_VOLUME, "mountPath": "/nemo_run", "readOnly": True}]


def test_keys_are_valid_and_unique_on_collisions():
    paths = [
        "a/b.py",
        "a-b.py",
        "a_b.py",
        "a b.py",
        "a/b/c.py",
        "a_b/c.py",
        "..weird",
        ".hidden",
        "ü.py",
    ]
    paths.append("d/" * 150 + "deep.py")
    files = [BundleFile(path=p, data=p.encode()) for p in paths]
    pkg = build_code_package(files, name="cm", namespace="ns", mode="plain")
    items = pkg.volumes[0]["configMap"]["items"]
    keys = [i["key"] for i in items]
    assert len(set(keys)) == len(paths)
    for key in keys:
        assert KEY_RE.fullmatch(key) and len(key) <= 253 and not key.startswith(".."), key
    assert plain_tree(pkg) == expected_tree(files)
    by_path = {i["path"]: i["key"] for i in items}
    assert by_path["a-b.py"] == "a-b.py" and by_path["a_b.py"] == "a_b.py"  # valid names stay readable
    assert by_path["a/b.py"].startswith("a_b.py.")


def test_plain_too_large_names_largest_files():
    rng = random.Random(1)
    files = [BundleFile(path=f"big/{i}.bin", data=rng.randbytes(150_000 + i)) for i in range(8)]
    files.append(BundleFile(path="small.py", data=b"x = 1\n"))
    with pytest.raises(PackageTooLargeError) as err:
        build_code_package(files, name="cm", namespace="ns", mode="plain")
    largest = [(f"big/{i}.bin", 150_000 + i) for i in (7, 6, 5, 4, 3)]
    assert err.value.largest == largest
    message = str(err.value)
    assert "big/7.bin (146.5 KiB)" in message and 'mode="sharded"' in message and "PVC" in message
    assert "big/2.bin" not in message


def test_plain_limit_counts_values_like_the_api_server():
    budget = CONFIGMAP_MAX_BYTES - packaging.CONFIGMAP_MARGIN_BYTES
    fits = [BundleFile(path="a.bin", data=b"\x00" * (budget - 100))]  # binaryData counts decoded bytes
    assert build_code_package(fits, name="cm", namespace="ns", mode="plain").mode == "plain"
    over = [BundleFile(path="a.txt", data=b"x" * (budget + 1))]
    with pytest.raises(PackageTooLargeError):
        build_code_package(over, name="cm", namespace="ns", mode="plain")
    assert build_code_package(over, name="cm", namespace="ns").mode == "sharded"


def test_auto_goes_sharded_past_the_file_count_limit():
    files = [BundleFile(path=f"f{i}.py", data=b"x") for i in range(packaging.PLAIN_MAX_FILES + 1)]
    assert build_code_package(files, name="cm", namespace="ns").mode == "sharded"
    with pytest.raises(PackageTooLargeError, match="plain-mode limit"):
        build_code_package(files, name="cm", namespace="ns", mode="plain")


# --- sharded mode --------------------------------------------------------------------------------


def test_sharded_golden():
    pkg = build_code_package(small_files(), name="exp-1-task-0", namespace="team-a", mode="sharded")
    assert pkg.mode == "sharded"
    # The archive bytes depend on the zlib build, so the golden file holds everything else.
    configmaps = [{**cm, "binaryData": {k: "<archive>" for k in cm["binaryData"]}} for cm in pkg.configmaps]
    prologue = re.sub(r"\b[0-9a-f]{64}\b", "<sha256>", pkg.prologue)
    check_golden(
        "sharded_small.yaml",
        {
            "configmaps": configmaps,
            "volumes": pkg.volumes,
            "volume_mounts": pkg.volume_mounts,
            "prologue": prologue,
        },
    )
    assert sharded_tree(pkg) == expected_tree(small_files())


def test_sharded_prologue_unpacks_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bundle_root = tmp_path / "var run" / "bundle"  # a space, to prove the paths are quoted
    monkeypatch.setattr(packaging, "BUNDLE_MOUNT_ROOT", str(bundle_root))
    workspace = tmp_path / "work space"
    workspace.mkdir()
    rng = random.Random(7)
    files = small_files() + [
        BundleFile(path=f"code/lib/mod_{i}.py", data=fake_python(rng, 30_000).encode()) for i in range(60)
    ]
    files.append(BundleFile(path="code/" + "long_directory_name/" * 8 + "f.py", data=b"pass\n"))
    files.append(BundleFile(path="code/noise.bin", data=rng.randbytes(1_500_000)))
    pkg = build_code_package(files, name="job", namespace="ns", mount_path=str(workspace), mode="sharded")
    assert len(pkg.configmaps) >= 2
    assert "set -x" not in pkg.prologue and "set -" not in pkg.prologue

    materialize_shards(pkg, bundle_root)
    result = subprocess.run(["bash", "-c", pkg.prologue + "echo unpacked"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "unpacked\n"

    unpacked = {}
    for path in workspace.rglob("*"):
        if path.is_file():
            unpacked[path.relative_to(workspace).as_posix()] = (
                path.read_bytes(),
                path.stat().st_mode & 0o777,
            )
    assert unpacked == expected_tree(files)


def test_sharded_prologue_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(packaging, "BUNDLE_MOUNT_ROOT", str(tmp_path / "bundle"))
    (tmp_path / "ws").mkdir()
    files = [BundleFile(path=f"f{i}.bin", data=random.Random(i).randbytes(700_000)) for i in range(3)]
    pkg = build_code_package(files, name="job", namespace="ns", mount_path=str(tmp_path / "ws"), mode="sharded")
    materialize_shards(pkg, tmp_path / "bundle")

    shard = tmp_path / "bundle" / "1" / packaging.SHARD_KEY
    shard.write_bytes(shard.read_bytes()[:-10])
    result = subprocess.run(["bash", "-c", pkg.prologue + "echo ran"], capture_output=True, text=True)
    assert result.returncode == 1 and "ran" not in result.stdout
    assert "checksum mismatch" in result.stderr and "job-0..job-2" in result.stderr

    shard.unlink()
    result = subprocess.run(["bash", "-c", pkg.prologue], capture_output=True, text=True)
    assert result.returncode == 1
    assert f"shard {shard} is missing" in result.stderr


def materialize_shards(pkg: CodePackage, bundle_root: Path) -> None:
    """Lay the shard ConfigMaps out as the kubelet mounts them."""
    for volume, mount in zip(pkg.volumes[1:], pkg.volume_mounts[1:]):
        assert volume["name"] == mount["name"] and mount["readOnly"]
        cm = next(c for c in pkg.configmaps if c["metadata"]["name"] == volume["configMap"]["name"])
        index = mount["mountPath"].rsplit("/", 1)[1]
        target = bundle_root / index / packaging.SHARD_KEY
        target.parent.mkdir(parents=True)
        target.write_bytes(base64.b64decode(cm["binaryData"][packaging.SHARD_KEY]))


def test_eight_mib_of_python_fits_default_shards():
    rng = random.Random(42)
    files = [BundleFile(path=f"code/src/m{i:03d}.py", data=fake_python(rng, 42_000).encode()) for i in range(200)]
    total = sum(len(f.data) for f in files)
    assert total >= 8 * 1024 * 1024
    pkg = build_code_package(files, name="job", namespace="ns")
    assert pkg.mode == "sharded" and len(pkg.configmaps) <= 16
    compressed = len(archive_bytes(pkg))
    assert compressed > 1024 * 1024  # the text is not trivially compressible
    assert describe_package(pkg) == (
        f"sharded, 200 files, {total / 2**20:.1f} MiB ({compressed / 2**20:.1f} MiB compressed) "
        f"in {len(pkg.configmaps)} ConfigMaps"
    )


def test_too_many_shards_names_largest_files():
    rng = random.Random(3)
    files = [BundleFile(path=f"ckpt/{i}.bin", data=rng.randbytes(600_000)) for i in range(4)]
    with pytest.raises(PackageTooLargeError) as err:
        build_code_package(files, name="job", namespace="ns", max_shards=2)
    assert "max_shards is 2" in str(err.value) and "compressed" in str(err.value)
    assert [p for p, _ in err.value.largest] == [f"ckpt/{i}.bin" for i in range(4)]


def test_five_thousand_files_are_sharded():
    # How fast: benchmarks/bench_packaging.py (the same 5,000 files / 20 MiB), not a timed test.
    rng = random.Random(5)
    pool = fake_python(rng, 2 * 1024 * 1024).encode()
    files = []
    for i in range(5000):
        start = rng.randrange(len(pool) - 4200)
        files.append(BundleFile(path=f"code/pkg{i % 50}/mod_{i}.py", data=pool[start : start + 4200]))
    pkg = build_code_package(files, name="job", namespace="ns")
    assert pkg.total_bytes >= 20_000_000 and pkg.mode == "sharded"


# --- both modes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["plain", "sharded"])
def test_deterministic(mode: str):
    files = small_files()
    a = build_code_package(files, name="job", namespace="ns", mode=mode)
    b = build_code_package(list(reversed(files)), name="job", namespace="ns", mode=mode)
    assert a == b
    assert a.configmaps[0]["metadata"]["annotations"] == {BUNDLE_HASH_ANNOTATION: a.digest}
    changed = [*files[:-1], BundleFile(path=files[-1].path, data=files[-1].data, mode=0o755)]
    assert build_code_package(changed, name="job", namespace="ns", mode=mode).digest != a.digest


def test_digest_ignores_mode_and_names():
    plain = build_code_package(small_files(), name="a", namespace="ns", mode="plain")
    sharded = build_code_package(small_files(), name="b", namespace="other", mode="sharded")
    assert plain.digest == sharded.digest


def test_manifests_do_not_share_metadata():
    files = [BundleFile(path=f"f{i}", data=random.Random(i).randbytes(900_000)) for i in range(2)]
    pkg = build_code_package(files, name="job", namespace="ns", labels={"a": "b"}, mode="sharded")
    pkg.configmaps[0]["metadata"]["labels"]["extra"] = "x"
    assert pkg.configmaps[1]["metadata"]["labels"] == {"a": "b"}


def test_describe_plain():
    pkg = build_code_package(small_files(), name="job", namespace="ns")
    assert describe_package(pkg) == f"plain, 5 files, {pkg.total_bytes} B in 1 ConfigMap"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "Job_1"}, "DNS-1123 subdomain"),
        ({"name": "x" * 254}, "DNS-1123 subdomain"),
        ({"name": "job-"}, "DNS-1123 subdomain"),
        ({"namespace": "Team.A"}, "DNS-1123 label"),
        ({"mount_path": "relative"}, "mount_path"),
        ({"mount_path": "/"}, "mount_path"),
        ({"mode": "zip"}, "mode must be one of"),
        ({"max_shards": 0}, "max_shards"),
    ],
)
def test_invalid_arguments(kwargs: dict, message: str):
    args = {"name": "job", "namespace": "ns", **kwargs}
    with pytest.raises(ConfigError, match=message):
        build_code_package(small_files(), **args)


def test_shard_names_must_fit():
    files = [BundleFile(path="f", data=random.Random(0).randbytes(1_200_000))]
    with pytest.raises(ConfigError, match="shard name"):
        build_code_package(files, name="x" * 252, namespace="ns", mode="sharded")


@pytest.mark.parametrize("path", ["/abs.py", "a/../b.py", "./a.py", "a//b.py", ""])
def test_bundle_file_rejects_unsafe_paths(path: str):
    with pytest.raises(PackagingError):
        BundleFile(path=path, data=b"")


def test_duplicate_paths_rejected():
    with pytest.raises(PackagingError, match="same path"):
        build_code_package(
            [BundleFile(path="a", data=b"1"), BundleFile(path="a", data=b"2")],
            name="j",
            namespace="n",
        )


# --- collect -------------------------------------------------------------------------------------


def test_collect_layout_and_modes(job_dir: Path, repo: Path):
    files = collect(ConfigMapPackager(include_pattern="**/*.py"), job_dir, repo)
    assert sorted(files) == list(files)  # sorted by path
    assert set(files) == {
        "__main__.py",
        "task-0/configs/task-0_executor.yaml",
        "task-0/configs/task-0_fn_or_script",
        "scripts/task-0.sh",
        "code/train.py",
        "code/pkg/__init__.py",
        "code/pkg/model.py",
        "code/pkg/sub/layers.py",
    }
    assert files["scripts/task-0.sh"].mode == 0o755
    assert files["code/train.py"].mode == 0o644
    assert files["code/pkg/model.py"].data == b"class Model: ...\n"


def test_collect_without_patterns_ships_no_code(job_dir: Path, repo: Path):
    files = collect(ConfigMapPackager(), job_dir, repo)
    assert not [p for p in files if p.startswith("code/")]


def test_collect_job_dir_without_configs_or_scripts(tmp_path: Path):
    job = tmp_path / "exp" / "path-task"
    job.mkdir(parents=True)
    assert ConfigMapPackager().collect(job_dir=str(job)) == []


def test_collect_defaults_to_the_current_directory(job_dir: Path, repo: Path, monkeypatch: pytest.MonkeyPatch):
    shutil.rmtree(repo / ".git")  # a bare tmp dir: no git toplevel, so the cwd is the base
    monkeypatch.chdir(repo / "pkg")
    files = ConfigMapPackager(include_pattern="*.py").collect(job_dir=str(job_dir))
    assert [f.path for f in files if f.path.startswith("code/")] == [
        "code/__init__.py",
        "code/model.py",
    ]


def test_collect_absolute_pattern_outside_base(job_dir: Path, repo: Path, tmp_path: Path):
    with pytest.raises(PackagingError, match="outside its base path"):
        collect(ConfigMapPackager(include_pattern=str(tmp_path / "*.py")), job_dir, repo)


def test_collect_directory_pattern_and_relative_path(job_dir: Path, repo: Path):
    files = collect(ConfigMapPackager(include_pattern=["sub", "*.json"], relative_path="pkg"), job_dir, repo)
    assert [p for p in files if p.startswith("code/")] == ["code/data.json", "code/sub/layers.py"]
    absolute = ConfigMapPackager(include_pattern=[str(repo / "pkg" / "sub")], relative_path=[str(repo / "pkg")])
    assert [p for p in collect(absolute, job_dir, repo) if p.startswith("code/")] == ["code/sub/layers.py"]


def test_collect_excludes(job_dir: Path, repo: Path):
    files = collect(ConfigMapPackager(include_pattern="**"), job_dir, repo)
    code = sorted(p for p in files if p.startswith("code/"))
    assert code == [
        "code/pkg/__init__.py",
        "code/pkg/data.json",
        "code/pkg/model.py",
        "code/pkg/sub/layers.py",
        "code/train.py",
    ]
    custom = ConfigMapPackager(
        include_pattern="**",
        exclude=["*.json", "pkg/sub", ".git", ".venv", "node_modules", "*.pyc", "__pycache__"],
    )
    assert "code/pkg/data.json" not in collect(custom, job_dir, repo)
    assert "code/pkg/sub/layers.py" not in collect(custom, job_dir, repo)


def test_collect_missing_pattern(job_dir: Path, repo: Path):
    with pytest.raises(PackagingError) as err:
        collect(ConfigMapPackager(include_pattern=["**/*.py", "configs/*.yaml"]), job_dir, repo)
    assert "'configs/*.yaml'" in str(err.value) and str(repo) in str(err.value)


def test_collect_pattern_matching_only_excluded_files(job_dir: Path, repo: Path):
    with pytest.raises(PackagingError, match="matched no files"):
        collect(ConfigMapPackager(include_pattern="**/*.pyc"), job_dir, repo)


def test_collect_missing_base_path_and_job_dir(tmp_path: Path, job_dir: Path, repo: Path):
    with pytest.raises(PackagingError, match="does not exist"):
        collect(ConfigMapPackager(include_pattern="*.py", relative_path="nope"), job_dir, repo)
    with pytest.raises(PackagingError, match="job_dir"):
        ConfigMapPackager().collect(job_dir=str(tmp_path / "missing"))


def test_collect_symlink_outside_root(job_dir: Path, repo: Path, tmp_path: Path):
    secret = tmp_path / "outside" / "id_rsa.py"
    secret.parent.mkdir()
    secret.write_text("PRIVATE\n")
    link = repo / "pkg" / "keys.py"
    link.symlink_to(secret)
    with pytest.raises(PackagingError) as err:
        collect(ConfigMapPackager(include_pattern="**/*.py"), job_dir, repo)
    assert str(link) in str(err.value) and str(secret) in str(err.value)
    # Not selected: no error.
    collect(ConfigMapPackager(include_pattern="train.py"), job_dir, repo)


def test_collect_symlinked_directory_outside_root(job_dir: Path, repo: Path, tmp_path: Path):
    outside = tmp_path / "shared-lib"
    outside.mkdir()
    (outside / "util.py").write_text("U = 1\n")
    (repo / "lib").symlink_to(outside)
    with pytest.raises(PackagingError, match="points outside"):
        collect(ConfigMapPackager(include_pattern="**/*.py"), job_dir, repo)


def test_collect_symlinks_inside_root_are_dereferenced(job_dir: Path, repo: Path):
    (repo / "alias.py").symlink_to(repo / "train.py")
    (repo / "pkg" / "loop").symlink_to(repo / "pkg")  # a cycle must not hang
    (repo / "sub_alias").symlink_to(repo / "pkg" / "sub")
    files = collect(ConfigMapPackager(include_pattern="**/*.py"), job_dir, repo)
    assert files["code/alias.py"].data == b"print('train')\n"
    assert files["code/sub_alias/layers.py"].data == b"X = 1\n"


def test_collect_unreadable_file(job_dir: Path, repo: Path, monkeypatch: pytest.MonkeyPatch):
    real_open = open

    def deny_train(path, *args, **kwargs):
        # chmod 0 would not stop root, so fail the open itself.
        if str(path).endswith("train.py"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(packager, "open", deny_train, raising=False)
    with pytest.raises(PackagingError, match=r"cannot read .*train\.py: Permission denied"):
        collect(ConfigMapPackager(include_pattern="*.py"), job_dir, repo)


def test_collect_max_file_bytes(job_dir: Path, repo: Path):
    (repo / "weights.py").write_bytes(b"#" * 2048)
    with pytest.raises(PackagingError, match="weights.py is 2.0 KiB, over max_file_bytes"):
        collect(ConfigMapPackager(include_pattern="*.py", max_file_bytes=1024), job_dir, repo)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_collect_use_git(job_dir: Path, repo: Path):
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)

    shutil.rmtree(repo / ".git")
    git("init", "-q")
    (repo / ".gitignore").write_text("*.json\nbuild/\n")
    (repo / "build").mkdir()
    (repo / "build" / "out.py").write_text("ignored\n")
    (repo / "gone.py").write_text("deleted later\n")
    git("add", ".gitignore", "train.py", "pkg/model.py", "gone.py")
    (repo / "gone.py").unlink()
    (repo / "pkg" / "model.py").write_text("edited in the working tree\n")

    files = collect(ConfigMapPackager(use_git=True), job_dir, repo)
    code = {p: f.data for p, f in files.items() if p.startswith("code/")}
    # Tracked files with working-tree contents, plus untracked-but-not-ignored ones; the default
    # excludes still apply (.venv, __pycache__ are untracked here).
    assert code == {
        "code/.gitignore": b"*.json\nbuild/\n",
        "code/pkg/__init__.py": b"",
        "code/pkg/model.py": b"edited in the working tree\n",
        "code/pkg/sub/layers.py": b"X = 1\n",
        "code/train.py": b"print('train')\n",
    }
    filtered = collect(ConfigMapPackager(use_git=True, include_pattern="pkg/**/*.py"), job_dir, repo)
    assert [p for p in filtered if p.startswith("code/")] == [
        "code/pkg/__init__.py",
        "code/pkg/model.py",
        "code/pkg/sub/layers.py",
    ]


def test_collect_use_git_outside_a_repository(job_dir: Path, tmp_path: Path):
    plain_dir = tmp_path / "not-a-repo"
    plain_dir.mkdir()
    with pytest.raises(PackagingError, match="git ls-files failed"):
        ConfigMapPackager(use_git=True).collect(job_dir=str(job_dir), base_path=str(plain_dir))


# --- executor yaml redaction ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["plain", "sharded"])
def test_executor_yaml_redacted(job_dir: Path, repo: Path, mode: str):
    files = ConfigMapPackager().collect(job_dir=str(job_dir), base_path=str(repo))
    pkg = build_code_package(files, name="job", namespace="ns", mode=mode)
    assert CANARY not in all_text(pkg)
    shipped = yaml.safe_load(next(f for f in files if f.path.endswith("_executor.yaml")).data)
    assert shipped["env_vars"] == {"HF_TOKEN": "<redacted>", "WANDB_API_KEY": "<redacted>"}
    assert shipped["namespace"] == "team-a" and shipped["packager"]["mode"] == "auto"


def test_redaction_reaches_nested_env_vars():
    text = yaml.safe_dump(
        {
            "env_vars": {"A": CANARY},
            "children": [{"env_vars": {"B": CANARY}}, {"env_vars": [f"C={CANARY}"]}],
        }
    )
    out = redact_executor_yaml(text)
    assert CANARY not in out
    assert yaml.safe_load(out)["children"][0] == {"env_vars": {"B": "<redacted>"}}


def test_redaction_skips_the_yaml_round_trip_only_when_every_env_vars_is_empty():
    empty = "_target_: x.Executor\nenv_vars: {}\nsecret_env_vars: {}\npackager:\n  env_vars: {}\n"
    assert redact_executor_yaml(empty) is empty
    # One empty and one not (flow or block style): the full round trip redacts.
    for mixed in (
        empty + f"launcher:\n  env_vars: {{A: {CANARY}}}\n",
        empty + f'launcher:\n  "env_vars": {{A: {CANARY}}}\n',
        empty + f"launcher:\n  env_vars:\n    A: {CANARY}\n",
    ):
        out = redact_executor_yaml(mixed)
        assert CANARY not in out and yaml.safe_load(out)["launcher"]["env_vars"] == {"A": "<redacted>"}


def test_unparsable_executor_yaml_is_not_shipped(job_dir: Path, repo: Path, caplog: pytest.LogCaptureFixture):
    (job_dir / "configs" / "task-0_executor.yaml").write_text(f"env_vars: {{HF_TOKEN: {CANARY}\n  : [")
    with caplog.at_level(logging.WARNING, logger="nemo_kubeflow.config.packager"):
        files = collect(ConfigMapPackager(), job_dir, repo)
    assert "task-0/configs/task-0_executor.yaml" not in files
    assert "task-0_executor.yaml" in caplog.text and "redacted" in caplog.text
    assert not any(CANARY.encode() in f.data for f in files.values())


# --- the packager as a NeMo-Run config ----------------------------------------------------------


def test_packager_round_trips_through_fiddle_and_serializers():
    packager = ConfigMapPackager(
        include_pattern=["src/**/*.py", "configs"],
        relative_path=["", "conf"],
        use_git=True,
        exclude=[".git", "*.ckpt"],
        mode="sharded",
        max_shards=4,
        max_file_bytes=None,
    )
    assert fdl.build(packager.to_config()) == packager
    serializer = ZlibJSONSerializer()
    assert fdl.build(serializer.deserialize(serializer.serialize(packager.to_config()))) == packager
    assert "ConfigMapPackager" in YamlSerializer().serialize(packager.to_config())
    assert fdl.build(ConfigMapPackager().to_config()) == ConfigMapPackager()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "tarball"}, "mode must be one of"),
        ({"max_shards": 0}, "max_shards"),
        ({"max_file_bytes": 0}, "max_file_bytes"),
        ({"include_pattern": ["a", "b"], "relative_path": ["x"]}, "one entry per include_pattern"),
    ],
)
def test_packager_validates_fields(kwargs: dict, message: str):
    with pytest.raises(ConfigError, match=message):
        ConfigMapPackager(**kwargs)


def test_package_is_not_a_tarball_packager(tmp_path: Path):
    with pytest.raises(NotImplementedError, match="ConfigMaps"):
        ConfigMapPackager().package(tmp_path, str(tmp_path), "task")
