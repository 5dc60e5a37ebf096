"""`python -m nemo_kubeflow_local serve [--workdir DIR]`: run a local cluster in the foreground.
`python -m nemo_kubeflow_local node-agent --kubeconfig K --node N ...`: serve Nodes of any API server."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Callable, Optional, Sequence, TypeVar

from nemo_kubeflow_local.apiserver import persistence
from nemo_kubeflow_local.local_cluster import LocalCluster

T = TypeVar("T")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nemo_kubeflow_local", description="A local Kubernetes API with Kubeflow Trainer v2.3."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run a local cluster until Ctrl-C or SIGTERM")
    serve.add_argument(
        "--workdir",
        type=Path,
        help="keep the kubeconfig, pods and logs here (default: a temporary directory, removed on exit)",
    )
    serve.add_argument(
        "--forget",
        action="store_true",
        help="with --workdir: start empty and keep no API object there (default: keep them in "
        "the workdir and restore them at the next start on it)",
    )
    serve.add_argument(
        "--no-kubelet", action="store_true", help="run no embedded node: pods wait for a node agent's Nodes"
    )
    agent = commands.add_parser(
        "node-agent", help="serve Nodes of any API server, their pods as local processes, until Ctrl-C or SIGTERM"
    )
    agent.add_argument("--kubeconfig", required=True, help="the API server to attach to")
    agent.add_argument("--context", help="the kubeconfig context (default: its current one)")
    agent.add_argument(
        "--node",
        action="append",
        required=True,
        metavar="NAME[:cpu=N,memory=Q,gpus=N,pods=N]",
        help="a Node to register; repeat for more",
    )
    agent.add_argument("--workdir", type=Path, required=True, help="pod directories, PVC directories and logs")
    agent.add_argument("--keep-nodes", action="store_true", help="leave the Node objects when stopping")
    agent.add_argument("--tls-cert", type=Path, help="the kubelet endpoint's certificate (default: a self-signed one)")
    agent.add_argument("--tls-key", type=Path, help="its key (with --tls-cert)")
    args = parser.parse_args(argv)

    if args.command == "serve":
        try:
            return _run_until_signalled(
                LocalCluster(
                    args.workdir, run_kubelet=not args.no_kubelet, persist=args.workdir is not None and not args.forget
                ),
                _serve_banner,
            )
        except persistence.StoreUnreadable as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    from nemo_kubeflow_local.kubelet.nodeagent import NodeAgent, NodeSpec

    try:
        nodes = [NodeSpec.parse(text) for text in args.node]
    except ValueError as error:
        parser.error(str(error))
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together: give both, or neither for a self-signed certificate")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return _run_until_signalled(
        NodeAgent(
            args.kubeconfig,
            nodes,
            args.workdir,
            context=args.context,
            unregister=not args.keep_nodes,
            serving_cert=(args.tls_cert, args.tls_key) if args.tls_cert else None,
        ),
        lambda agent: (
            f"Serving nodes {', '.join(n.name for n in nodes)}; kubelet endpoint https://127.0.0.1:{agent.port}"
        ),
    )


def _serve_banner(cluster: LocalCluster) -> str:
    kept = (
        f"API objects kept in {cluster.workdir / persistence.STORE_FILE} (restored at the next start on this workdir)"
        if cluster.persists
        else "API objects are not kept: a restart starts empty"
    )
    lines = [
        f"Local cluster serving at {cluster.url} (context {cluster.context}, namespace {cluster.namespace})",
        f"kubeconfig: {cluster.kubeconfig_path}",
        kept,
    ]
    if cluster.restored is not None:
        lines.append(cluster.restored.summary())
    lines.append(f"export KUBECONFIG={cluster.kubeconfig_path}")
    return "\n".join(lines)


def _run_until_signalled(service: AbstractContextManager[T], banner: Callable[[T], str]) -> int:
    """Start `service`, print its banner, and stop it on SIGINT or SIGTERM."""
    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: done.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with service as running:
            print(banner(running), flush=True)
            done.wait()
            print("Stopping: killing every pod process.", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
