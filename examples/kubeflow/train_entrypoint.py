"""A NeMo-Run CLI entrypoint whose executor is chosen on the command line.

    # Dry run: prints the task and the executor the factory built; nothing is sent.
    python examples/kubeflow/train_entrypoint.py run.executor=kubeflow_gpu run.executor.nodes=2 --dryrun

    # On a local cluster (`python -m nemo_kubeflow_local serve` in another shell, then
    # `export NEMO_KUBEFLOW_LOCAL_KUBECONFIG=<the kubeconfig path it printed>`):
    python examples/kubeflow/train_entrypoint.py run.executor=kubeflow_local run.executor.nodes=2 steps=30 --yes

    # No executor: runs right here, in this process.
    python examples/kubeflow/train_entrypoint.py steps=30

The task fits y = 3x + 1 with plain data parallelism: every rank computes gradients on its
own slice of the data, and an all-reduce (gloo, CPU) averages them, so all ranks end with
the same weights.
"""

import os

import nemo_run as run


@run.cli.entrypoint(namespace="kubeflow")
def train(steps: int = 30, lr: float = 0.5, samples: int = 64) -> None:
    """Fit y = 3x + 1 by data-parallel gradient descent on every rank of the job."""
    import torch
    import torch.distributed as dist

    # torchrun sets WORLD_SIZE; a direct run in this process has no process group.
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

    torch.manual_seed(0)
    x = torch.linspace(-1, 1, samples)[rank::world]
    y = 3 * x + 1
    w = torch.zeros(2, requires_grad=True)
    for _ in range(steps):
        loss = ((w[0] * x + w[1] - y) ** 2).mean()
        (grad,) = torch.autograd.grad(loss, w)
        if distributed:
            dist.all_reduce(grad)
            grad /= world
        with torch.no_grad():
            w -= lr * grad
    print(f"rank {rank}/{world}: w={w[0].item():.3f} b={w[1].item():.3f} loss={loss.item():.4f}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    # run.cli.main does not load nemo_run.cli entry points, so register the kubeflow_*
    # factories here. Only here: NeMo-Run runs this file in the pods too, where
    # nemo_kubeflow need not be installed.
    import nemo_kubeflow.config.factories  # noqa: F401

    run.cli.main(train)
