"""`python -m nemo_kubeflow.local serve [--workdir DIR]`: run a local cluster in the foreground."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Optional, Sequence

from nemo_kubeflow.local.cluster import LocalCluster


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nemo_kubeflow.local",
                                     description="A local Kubernetes API with Kubeflow Trainer v2.3.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run a local cluster until Ctrl-C or SIGTERM")
    serve.add_argument("--workdir", type=Path, help="keep the kubeconfig, pods and logs here (default: a temporary "
                                                    "directory, removed on exit)")
    args = parser.parse_args(argv)

    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: done.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with LocalCluster(args.workdir) as cluster:
            print(f"Local cluster serving at {cluster.url} (context {cluster.context}, namespace "
                  f"{cluster.namespace})")
            print(f"kubeconfig: {cluster.kubeconfig_path}")
            print(f"export KUBECONFIG={cluster.kubeconfig_path}", flush=True)
            done.wait()
            print("Stopping: killing every pod process.", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
