"""A NeMo-style recipe: a `run.Partial` whose arguments are `run.Config` objects, run with torchrun.

    # On a local cluster (`python -m nemo_kubeflow_local serve` in another shell, then
    # `export NEMO_KUBEFLOW_LOCAL_KUBECONFIG=<the kubeconfig path it printed>`):
    python examples/kubeflow/recipe.py

    # The same recipe on a GPU cluster of your kubeconfig, or only its manifests:
    python examples/kubeflow/recipe.py --factory kubeflow_gpu --nodes 2 --nprocs 8
    python examples/kubeflow/recipe.py --factory kubeflow_gpu --dryrun

A recipe is configuration, not code: `pretrain_recipe()` returns a fiddle graph that
NeMo-Run serialises, ships to the pods and builds there. Changing a hyperparameter is
changing the graph (`recipe.optim.lr = 0.01`), which is what NeMo 2.0's recipes do.
"""

import argparse
import os
import sys
from dataclasses import dataclass

import nemo_run as run


@dataclass
class ModelConfig:
    hidden: int = 16


@dataclass
class OptimizerConfig:
    lr: float = 0.05
    steps: int = 100


@dataclass
class DataConfig:
    samples: int = 256
    seed: int = 0


def pretrain(model: ModelConfig, optim: OptimizerConfig, data: DataConfig) -> None:
    """Fit sin(x) with a small MLP under DistributedDataParallel (gloo, CPU)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(data.seed)  # same initial weights on every rank
    net = torch.nn.Sequential(torch.nn.Linear(1, model.hidden), torch.nn.Tanh(), torch.nn.Linear(model.hidden, 1))
    ddp = DistributedDataParallel(net)
    opt = torch.optim.Adam(ddp.parameters(), lr=optim.lr)
    x = torch.linspace(-3, 3, data.samples).unsqueeze(1)[rank::world]
    y = torch.sin(x)
    for _ in range(optim.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
    checksum = sum(p.sum().item() for p in net.parameters())
    print(f"rank {rank}/{world}: loss={loss.item():.4f} weights checksum={checksum:.6f}", flush=True)
    dist.destroy_process_group()


def pretrain_recipe(hidden: int = 32, steps: int = 100, lr: float = 0.05) -> run.Partial:
    return run.Partial(
        pretrain,
        model=run.Config(ModelConfig, hidden=hidden),
        optim=run.Config(OptimizerConfig, lr=lr, steps=steps),
        data=run.Config(DataConfig),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--factory", default="kubeflow_local", help="executor factory (default kubeflow_local)")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--nprocs", type=int, default=2, help="processes per node")
    parser.add_argument("--dryrun", action="store_true", help="write the manifests, send nothing")
    args = parser.parse_args()

    import fiddle as fdl
    from torchx.specs import AppState

    # resolve_factory loads nemo_run.cli entry points, so nemo_kubeflow's factories are found.
    config = run.cli.resolve_factory(run.Executor, args.factory)()
    config.nodes, config.nprocs_per_node = args.nodes, args.nprocs
    config.launcher = "torchrun"
    executor = fdl.build(config)

    recipe = pretrain_recipe()
    recipe.optim.lr = 0.02  # a recipe is tuned by editing its graph, before it runs
    with run.Experiment("recipe", executor=executor, log_level="WARN") as exp:
        exp.add(recipe, name="pretrain")
        if args.dryrun:
            exp.dryrun(delete_exp_dir=False)
            print(f"manifests: {os.path.join(exp.jobs[0].executor.job_dir, 'manifests')}")
            return 0
        exp.run(sequential=True)
    # Leaving the `with` block waited for the job.
    state = exp.jobs[0].state
    exp.logs("pretrain", regex=r"rank \d+/\d+:")
    print(f"pretrain finished: {state.name}")
    return 0 if state == AppState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
