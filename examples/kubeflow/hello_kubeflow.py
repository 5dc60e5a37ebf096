"""Hello, Kubeflow: a 2-node x 2-process torchrun all-reduce, run through NeMo-Run.

    python examples/kubeflow/hello_kubeflow.py             # on the local cluster, no Kubernetes needed
    python examples/kubeflow/hello_kubeflow.py --cluster   # on the cluster of your current kubeconfig

Each of the 4 ranks contributes rank+1 to an all-reduce (gloo backend, CPU), so every
rank must print "all_reduce sum = 10". The script checks that it did and exits 1
otherwise.

On the local cluster (``nemo_kubeflow_local``), the TrainJob is submitted exactly as
to a real cluster, over HTTP, and its pods run as local processes with real torchrun.
"""

from __future__ import annotations

import argparse
import os
import sys

import nemo_run as run

from nemo_kubeflow import KubeflowExecutor

NODES, PROCS = 2, 2
EXPECTED = sum(range(1, NODES * PROCS + 1))


def allreduce() -> None:
    """Runs in every training process (defined here, NeMo-Run ships this file to the pods)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    print(
        f"rank {rank}/{world} on node {os.environ.get('PET_NODE_RANK')}: all_reduce sum = {int(value.item())}",
        flush=True,
    )
    dist.destroy_process_group()


def run_experiment(executor: KubeflowExecutor) -> int:
    with run.Experiment("hello-kubeflow", executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(allreduce), name="allreduce", tail_logs=True)
        exp.run(sequential=True)
    # NeMo-Run waits for the job when the `with` block exits.
    job = exp.jobs[0]
    state = exp.status(return_dict=True)[job.id]["status"]
    handle = job.handle
    lines = collected_lines(handle)
    sums = [line for line in lines if "all_reduce sum =" in line]
    print(f"\nTrainJob finished: {state}. {len(sums)} ranks reported:")
    for line in sums:
        print("  " + line)
    ok = (
        str(state).endswith("SUCCEEDED")
        and len(sums) == NODES * PROCS
        and all(line.endswith(f"sum = {EXPECTED}") for line in sums)
    )
    print("OK: every rank saw the same sum" if ok else f"FAILED: expected {NODES * PROCS} ranks with sum {EXPECTED}")
    return 0 if ok else 1


def collected_lines(handle: str) -> list[str]:
    """The job's log lines, read back from the cluster (every node)."""
    from torchx.specs import parse_app_handle

    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    _, _, app_id = parse_app_handle(handle)
    scheduler = create_scheduler("hello")
    lines: list[str] = []
    for node in range(NODES):
        lines += [line.rstrip("\n") for line in scheduler.log_iter(app_id, "allreduce", node)]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="submit to the cluster of the current kubeconfig instead of the local cluster",
    )
    parser.add_argument(
        "--image",
        default="nvcr.io/nvidia/nemo:25.02",
        help="training image (needs torch and nemo_run); ignored by the local cluster",
    )
    parser.add_argument("--namespace", default="default")
    args = parser.parse_args()

    executor = KubeflowExecutor(
        container_image=args.image,
        nodes=NODES,
        nprocs_per_node=PROCS,
        launcher="torchrun",
        namespace=args.namespace,
        cpu_request="1",
        shm_size="1Gi",
    )
    if args.cluster:
        return run_experiment(executor)

    from nemo_kubeflow_local import LocalCluster

    with LocalCluster() as cluster:
        print(f"Local cluster at {cluster.url} (kubeconfig {cluster.kubeconfig_path})")
        executor.kubeconfig = str(cluster.kubeconfig_path)
        return run_experiment(executor)


if __name__ == "__main__":
    sys.exit(main())
