"""Shipping code in ConfigMaps: collection and packing speed, compression, the largest tree that
fits, and unpacking in the pod.

The source tree is synthetic but realistic Python (modules, classes, functions, docstrings,
comments), generated deterministically: file ``i`` depends only on ``i``, so any prefix of the
sequence is a reproducible tree. Its gzip ratio is reported next to CPython's standard library
for calibration. Baseline: GNU ``tar -czf`` of the same tree (the same gzip level, 6), and
``tar -xzf`` of the same archive for unpacking.
"""

from __future__ import annotations

import base64
import random
import shutil
import subprocess
import sysconfig
import tempfile
import zlib
from pathlib import Path

from harness import Metric, interleaved, median, stopwatch

NAME = "packaging"
MiB = 1024 * 1024

# --------------------------------------------------------------------------------------------
# A deterministic synthetic Python tree
# --------------------------------------------------------------------------------------------

_WORDS = (
    "batch",
    "size",
    "config",
    "model",
    "data",
    "step",
    "path",
    "file",
    "name",
    "index",
    "value",
    "state",
    "layer",
    "hidden",
    "output",
    "input",
    "mask",
    "weight",
    "bias",
    "grad",
    "loss",
    "optimizer",
    "scheduler",
    "rank",
    "world",
    "device",
    "dtype",
    "shape",
    "token",
    "vocab",
    "seq",
    "len",
    "num",
    "max",
    "min",
    "dim",
    "head",
    "attention",
    "cache",
    "key",
    "query",
    "checkpoint",
    "save",
    "load",
    "init",
    "build",
    "get",
    "set",
    "update",
    "apply",
    "forward",
    "backward",
    "reset",
    "train",
    "eval",
    "log",
    "metric",
    "result",
    "args",
    "kwargs",
    "params",
    "options",
    "handler",
    "callback",
    "buffer",
    "stream",
    "queue",
    "worker",
    "task",
    "job",
    "node",
    "group",
    "local",
    "global",
    "prefix",
    "suffix",
    "count",
    "total",
    "offset",
    "start",
    "end",
)
_ENGLISH = (
    "the",
    "a",
    "of",
    "to",
    "and",
    "is",
    "in",
    "for",
    "this",
    "that",
    "with",
    "returns",
    "if",
    "given",
    "when",
    "list",
    "each",
    "from",
    "not",
    "be",
    "are",
    "or",
    "by",
    "on",
    "as",
    "used",
    "otherwise",
    "raises",
    "error",
    "new",
    "first",
    "last",
    "all",
    "only",
    "must",
    "should",
    "default",
) + _WORDS
_vocabulary_rng = random.Random(20250101)
VOCABULARY = sorted(
    {"_".join(_vocabulary_rng.choice(_WORDS) for _ in range(_vocabulary_rng.randint(1, 3))) for _ in range(3000)}
)


def _sentence(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(_ENGLISH) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + "."


def _expression(rng: random.Random, names: list[str]) -> str:
    a, b = rng.choice(names), rng.choice(names)
    return rng.choice(
        (
            f"{a} + {b}",
            f"self.{a}({b})",
            f"{a}[{rng.randint(0, 9)}]",
            f"len({a}) * {rng.randint(1, 64)}",
            f"{a}.{b}({rng.choice(names)}, {b}=True)",
            f'"{rng.choice(VOCABULARY)}"',
            f"{a} if {b} else None",
            f"[x for x in {b}]",
            f"{{'{a}': {b}}}",
            str(rng.choice((0, 1, 2, 8, 64))),
        )
    )


def _function(rng: random.Random, names: list[str], indent: str, method: bool) -> list[str]:
    args = rng.sample(names, rng.randint(0, 4))
    signature = ", ".join(
        (["self"] if method else []) + [f"{a}={rng.randint(0, 9)}" if rng.random() < 0.3 else a for a in args]
    )
    lines = [
        f"{indent}def {rng.choice(names)}_{rng.choice(VOCABULARY)}({signature}):",
        f'{indent}    """{_sentence(rng, 4, 14)}"""',
    ]
    for _ in range(rng.randint(2, 14)):
        kind = rng.random()
        target = rng.choice(names)
        if kind < 0.15:
            lines.append(f"{indent}    # {_sentence(rng, 3, 12)}")
        elif kind < 0.3:
            lines += [
                f"{indent}    if {target} > {rng.randint(0, 100)}:",
                f"{indent}        {target} = {_expression(rng, names)}",
            ]
        elif kind < 0.4:
            lines += [
                f"{indent}    for {target} in range({rng.randint(1, 32)}):",
                f"{indent}        {rng.choice(names)}.append({_expression(rng, names)})",
            ]
        else:
            lines.append(f"{indent}    {target} = {_expression(rng, names)}")
    lines.append(f"{indent}    return {rng.choice(names)}")
    return lines


def synthetic_file(i: int) -> tuple[str, bytes]:
    """(relative path, content) of file ``i`` of the synthetic tree (about 4 KiB on average)."""
    rng = random.Random(i * 7919 + 17)
    size = min(60_000, max(300, int(rng.lognormvariate(7.72, 0.9))))
    names = rng.sample(VOCABULARY, 24)
    lines = [
        f'"""{_sentence(rng, 6, 20)}',
        "",
        _sentence(rng, 10, 30),
        '"""',
        "",
        "import os",
        f"from .{rng.choice(names)} import {rng.choice(names).capitalize()}, {rng.choice(names)}",
        "",
        f"{rng.choice(names).upper()} = {rng.randint(0, 10_000)}",
        "",
    ]
    text_len = sum(len(x) + 1 for x in lines)
    while text_len < size:
        if rng.random() < 0.4:
            block = [
                f"class {rng.choice(names).capitalize()}{rng.choice(names).capitalize()}(object):",
                f'    """{_sentence(rng, 5, 18)}"""',
                "",
            ]
            for _ in range(rng.randint(1, 4)):
                block += _function(rng, names, "    ", method=True) + [""]
        else:
            block = _function(rng, names, "", method=False) + ["", ""]
        lines += block
        text_len += sum(len(x) + 1 for x in block)
    path = f"pkg_{i // 100:03d}/mod_{i % 100:02d}_{names[0]}.py"
    return path, "\n".join(lines).encode()


class SyntheticTree:
    """Files 0..n-1 of the synthetic sequence, generated once and kept."""

    def __init__(self) -> None:
        self.files: list[tuple[str, bytes]] = []

    def first(self, n: int) -> list[tuple[str, bytes]]:
        while len(self.files) < n:
            self.files.append(synthetic_file(len(self.files)))
        return self.files[:n]

    def write(self, root: Path, n: int) -> int:
        total = 0
        for rel, data in self.first(n):
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            total += len(data)
        return total


def _gzip_ratio(blobs: list[bytes]) -> float:
    raw = b"".join(blobs)
    return len(raw) / len(zlib.compress(raw, 6))


def _stdlib_sample(limit: int = 20 * MiB) -> list[bytes]:
    """CPython's standard library sources (no tests), up to ``limit`` bytes: real Python."""
    blobs, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts or total > limit:
            continue
        data = path.read_bytes()
        blobs.append(data)
        total += len(data)
    return blobs


# --------------------------------------------------------------------------------------------
# The measurements
# --------------------------------------------------------------------------------------------


def _bundle(pairs, prefix: str = "code/"):
    from nemo_kubeflow.config.packager import BundleFile

    return [BundleFile(path=prefix + rel, data=data) for rel, data in pairs]


def _build(files, mode: str = "auto", max_shards: int = 16, mount_path: str = "/nemo_run"):
    from nemo_kubeflow.build.packaging import build_code_package

    return build_code_package(
        files, name="bench-code", namespace="default", mode=mode, max_shards=max_shards, mount_path=mount_path
    )


def _compressed_bytes(package) -> int:
    from nemo_kubeflow.build.packaging import SHARD_KEY

    return sum(len(base64.b64decode(cm["binaryData"][SHARD_KEY])) for cm in package.configmaps)


def _largest_fitting(tree: SyntheticTree, estimate: int, tolerance: float) -> tuple[int, int, int]:
    """Binary search of the most files of the synthetic sequence that fit in the default
    max_shards; returns (files, their bytes, builds tried)."""
    from nemo_kubeflow.errors import PackageTooLargeError

    tries = 0

    def fits(n: int) -> bool:
        nonlocal tries
        tries += 1
        try:
            _build(_bundle(tree.first(n)), mode="sharded")
            return True
        except PackageTooLargeError:
            return False

    lo, hi = int(estimate * 0.97), int(estimate * 1.03)
    while not fits(lo):
        lo, hi = int(lo * 0.8), lo
    while fits(hi):
        lo, hi = hi, int(hi * 1.25)
    while hi - lo > max(1, int(lo * tolerance)):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, sum(len(d) for _, d in tree.first(lo)), tries


def _unpack_times(package, files, workdir: Path, repeat: int) -> dict[str, list[float]]:
    """Run the sharded prologue with bash against materialised shard files, as the pod does;
    baseline: ``tar -xzf`` of the same archive."""
    from nemo_kubeflow.build import packaging

    bundle_root = Path(packaging.BUNDLE_MOUNT_ROOT)
    parts = []
    for i, cm in enumerate(package.configmaps):
        part = bundle_root / str(i) / packaging.SHARD_KEY
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(base64.b64decode(cm["binaryData"][packaging.SHARD_KEY]))
        parts.append(str(part))
    workspace = workdir / "workspace"

    def fresh() -> None:
        shutil.rmtree(workspace, ignore_errors=True)
        workspace.mkdir()

    def prologue() -> float:
        fresh()
        with stopwatch() as t:
            out = subprocess.run(["bash", "-c", package.prologue + "echo unpacked"], capture_output=True, text=True)
        if out.returncode != 0 or out.stdout.strip() != "unpacked":
            raise RuntimeError(f"the unpack prologue failed: {out.stderr[-1000:]}")
        return t[0]

    def plain_tar() -> float:
        fresh()
        with stopwatch() as t:
            subprocess.run(f"cat {' '.join(parts)} | tar -xzf - -C {workspace}", shell=True, check=True)
        return t[0]

    samples = interleaved(repeat, prologue=prologue, tar=plain_tar)
    unpacked = sum(1 for p in workspace.rglob("*") if p.is_file())
    if unpacked != len(files):
        raise RuntimeError(f"unpacked {unpacked} files, expected {len(files)}")
    return samples


def run(ctx):
    from nemo_kubeflow import ConfigMapPackager
    from nemo_kubeflow.build import packaging

    count, target_bytes = (1000, 4 * MiB) if ctx.quick else (5000, 20 * MiB)
    tree = SyntheticTree()
    with tempfile.TemporaryDirectory(prefix="nk-bench-pkg-") as tmp:
        tmp = Path(tmp)
        src, job_dir = tmp / "src", tmp / "exp" / "task"
        job_dir.mkdir(parents=True)
        total = tree.write(src, count)
        packager = ConfigMapPackager(relative_path=str(src), include_pattern="**/*.py")

        # --- collect + build, vs tar -czf -----------------------------------------------------
        built = {}

        def ours() -> float:
            with stopwatch() as t_collect:
                files = packager.collect(job_dir=str(job_dir))
            with stopwatch() as t_build:
                built["package"] = _build(files)
            built.setdefault("collect", []).append(t_collect[0])
            built.setdefault("build", []).append(t_build[0])
            built["files"] = files
            return t_collect[0] + t_build[0]

        def tar() -> float:
            with stopwatch() as t:
                subprocess.run(["tar", "-czf", str(tmp / "baseline.tar.gz"), "-C", str(src), "."], check=True)
            return t[0]

        samples = interleaved(ctx.repeat, ours=ours, tar=tar)
        package, files = built["package"], built["files"]
        what = f"{len(files):,} files, {total / MiB:.1f} MiB"
        seconds = median(samples["ours"])
        yield Metric(
            f"package a tree ({what}): collect + build_code_package",
            seconds * 1000,
            median(samples["tar"]) * 1000,
            "ms",
            note=f"collect {median(built['collect']) * 1000:.0f} ms + build {median(built['build']) * 1000:.0f} "
            f"ms; baseline tar -czf; {package.mode}, {len(package.configmaps)} ConfigMaps",
        )
        yield Metric(
            "packaging throughput (collect + build)",
            total / MiB / seconds,
            None,
            "MiB/s",
            note=f"{len(files) / seconds:,.0f} files/s",
        )

        compressed = _compressed_bytes(package)
        tar_ratio = total / (tmp / "baseline.tar.gz").stat().st_size
        stdlib_ratio = _gzip_ratio(_stdlib_sample(4 * MiB if ctx.quick else 20 * MiB))
        yield Metric(
            "compression ratio, sharded mode (source / compressed)",
            total / compressed,
            tar_ratio,
            "x",
            note=f"calibration: CPython stdlib gzips {stdlib_ratio:.2f}x, this tree {_gzip_ratio([d for _, d in tree.first(count)]):.2f}x",
        )

        # --- the largest tree that fits --------------------------------------------------------
        capacity = 16 * (packaging.CONFIGMAP_MAX_BYTES - packaging.CONFIGMAP_MARGIN_BYTES)
        estimate = int(capacity * (total / compressed) / (total / count))
        with stopwatch() as t_search:
            n, size, tries = _largest_fitting(tree, estimate, 0.1 if ctx.quick else 0.01)
        yield Metric(
            "largest Python tree that fits in default max_shards (16)",
            size / MiB,
            None,
            "MiB",
            at_least=8,
            note=f"{n:,} files; binary search, {tries} builds in {t_search[0]:.0f} s",
        )

        # --- unpacking in the pod ------------------------------------------------------------------
        packaging.BUNDLE_MOUNT_ROOT, saved = str(tmp / "bundle"), packaging.BUNDLE_MOUNT_ROOT
        try:
            workdir = tmp / "pod"
            workdir.mkdir()
            sharded = _build(files, mode="sharded", mount_path=str(workdir / "workspace"))
            unpack = _unpack_times(sharded, files, workdir, ctx.repeat)
        finally:
            packaging.BUNDLE_MOUNT_ROOT = saved
        yield Metric(
            f"unpack in the pod ({len(sharded.configmaps)} shards): sharded prologue",
            median(unpack["prologue"]) * 1000,
            median(unpack["tar"]) * 1000,
            "ms",
            note="baseline: cat shards | tar -xzf (no checksum, no checks)",
        )
