"""An experiment of three tasks: a Script, a Partial that depends on it, and a Script on its own.

    # On a local cluster (`python -m nemo_kubeflow_local serve` in another shell, then
    # `export NEMO_KUBEFLOW_LOCAL_KUBECONFIG=<the kubeconfig path it printed>`):
    python examples/kubeflow/multi_task.py

    # Only the manifests of every task, for any factory:
    python examples/kubeflow/multi_task.py --factory kubeflow_cpu --dryrun

`prepare` and `check` start together; `train` waits for `prepare`. Each task is its own
TrainJob, with its own ConfigMap; tasks with identical settings share one runtime.
NeMo-Run runs the dependency order itself (only Slurm schedules dependencies), so keep
this process alive until the experiment ends.
"""

import argparse
import os
import sys

import nemo_run as run

PREPARE = """\
echo "prepare: writing shard list on node $PET_NODE_RANK"
for i in 0 1 2; do echo "shard-$i"; done
"""
CHECK = "python -c \"import platform; print('check: python', platform.python_version())\""


def train(shards: int, epochs: int = 2) -> None:
    """The Partial task: runs in the pod, built from the serialised config."""
    for epoch in range(epochs):
        print(f"train: epoch {epoch} over {shards} shards", flush=True)
    print("train: done", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--factory", default="kubeflow_local", help="executor factory (default kubeflow_local)")
    parser.add_argument("--dryrun", action="store_true", help="write every task's manifests, send nothing")
    args = parser.parse_args()

    import fiddle as fdl
    from torchx.specs import AppState

    executor = fdl.build(run.cli.resolve_factory(run.Executor, args.factory)())
    with run.Experiment("multi-task", executor=executor, log_level="WARN") as exp:
        prepare = exp.add(run.Script(inline=PREPARE), name="prepare")
        exp.add(run.Partial(train, shards=3), name="train", dependencies=[prepare])
        exp.add(run.Script(inline=CHECK), name="check")
        if args.dryrun:
            exp.dryrun(delete_exp_dir=False)
            for job in exp.jobs:
                print(f"{job.id}: manifests in {os.path.join(job.executor.job_dir, 'manifests')}")
            return 0
        exp.run()
    for job in exp.jobs:
        print(f"{job.id}: {job.state.name}")
    exp.logs("train", regex="train: ")
    return 0 if all(job.state == AppState.SUCCEEDED for job in exp.jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
