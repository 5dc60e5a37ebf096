"""GKE A3 Mega with GPUDirect-TCPXO: what a 2-node x 8-GPU job sends, without sending it.

    python examples/kubeflow/tcpxo_dryrun.py               # prints where the manifests are
    python examples/kubeflow/tcpxo_dryrun.py --nodes 4
    kubectl apply --dry-run=server -f <the printed directory>   # if you have an A3 Mega cluster

The task is an NCCL all-reduce bandwidth check, the usual first job on new TCPXO nodes.
The `kubeflow_tcpxo` factory adds the tcpxo-daemon sidecar, the multi-NIC annotations,
the NCCL FasTrak settings, and A3 Mega's node selector and GPU toleration. The namespace
must allow privileged pods (the sidecar needs NET_ADMIN and host paths).
"""

import argparse
import os
import sys

import nemo_run as run


def allreduce_bandwidth(size_mb: int = 1024, iters: int = 20) -> None:
    """Bus bandwidth of an NCCL all-reduce over every GPU of the job (nccl-tests' formula)."""
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    data = torch.ones(size_mb * 2**20 // 4, device="cuda")
    dist.all_reduce(data)  # warm-up: connects every peer
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(data)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / iters
    busbw = data.numel() * 4 * 2 * (world - 1) / world / seconds / 1e9
    if rank == 0:
        print(f"all_reduce {size_mb} MiB over {world} GPUs: {seconds * 1e3:.1f} ms, bus bandwidth {busbw:.1f} GB/s")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--namespace", default="default")
    args = parser.parse_args()

    import fiddle as fdl

    from nemo_kubeflow.config.factories import kubeflow_tcpxo

    executor = fdl.build(kubeflow_tcpxo(nodes=args.nodes, namespace=args.namespace))
    with run.Experiment("tcpxo-allreduce", executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(allreduce_bandwidth, size_mb=1024), name="allreduce")
        exp.dryrun(delete_exp_dir=False)
        manifests = os.path.join(exp.jobs[0].executor.job_dir, "manifests")
    print(f"\nmanifests written to {manifests}:")
    for name in sorted(os.listdir(manifests)):
        print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
