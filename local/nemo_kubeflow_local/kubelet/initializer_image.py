"""A stand-in for Trainer's dataset and model initializer images on the local cluster.

The local cluster runs the host's programs, not images, so Trainer's initializers (which download
from Hugging Face or S3) cannot run there. This one reads what Trainer gives an initializer
container (``STORAGE_URI``, ``IGNORE_PATTERNS``) and copies a ``file://`` source, a file or a
directory of the machine running the cluster, into the step's output path::

    InitializerSettings(claim_name="init", create_claim=True, claim_size="1Gi",
                        dataset_command=initializer.command("dataset"),
                        model_command=initializer.command("model"))

A missing source, or another scheme, fails the step with a one-line message (also the container's
termination message), as a failed download would.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

from nemo_kubeflow_local.constants import DATASET_PATH, MODEL_PATH

_OUTPUT = {"dataset": DATASET_PATH, "model": MODEL_PATH}


def command(step: str) -> list[str]:
    """The container command that runs this module as the ``dataset`` or ``model`` initializer.

    The output path is an argument (not computed inside) because the local kubelet maps container
    paths to local directories only in a container's command, args and env.
    """
    return ["python", "-m", "nemo_kubeflow_local.kubelet.initializer_image", step, _OUTPUT[step]]


def initialize(step: str, uri: str, output: Path, ignore: list[str]) -> int:
    """Copy the ``file://`` source ``uri`` into ``output``; the number of files copied."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise ValueError(f"STORAGE_URI {uri!r}: the local initializer reads file:// URIs only")
    source = Path(unquote(parsed.netloc + parsed.path))
    if not source.exists():
        raise FileNotFoundError(f"STORAGE_URI {uri!r}: {source} does not exist")
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    copied = 0
    for path in files:
        relative = path.name if source.is_file() else path.relative_to(source).as_posix()
        if any(fnmatch.fnmatch(path.name, pattern) for pattern in ignore):
            continue
        target = output / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        copied += 1
    return copied


def main(argv: list[str]) -> int:
    step, output = argv
    uri = os.environ.get("STORAGE_URI", "")
    ignore = [p.strip() for p in os.environ.get("IGNORE_PATTERNS", "").split(",") if p.strip()]
    try:
        copied = initialize(step, uri, Path(output), ignore)
    except (OSError, ValueError) as error:
        print(f"{step}-initializer failed: {error}", file=sys.stderr, flush=True)
        return 1
    print(f"{step}-initializer: copied {copied} file(s) from {uri} to {output}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
