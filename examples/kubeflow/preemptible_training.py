"""A training loop that survives preemption: it checkpoints on SIGTERM and resumes from the checkpoint.

When Kueue preempts a job (or a node is drained), the TrainJob is suspended and its pods deleted:
each process gets SIGTERM, then SIGKILL after the pods' grace period
(``KubeflowExecutor(termination_grace_period_seconds=...)``). This loop finishes the step it is in,
writes a checkpoint to a PersistentVolumeClaim and exits; when the job is admitted again it starts
from that checkpoint, so no step is done twice. It also checkpoints every ``checkpoint_every`` steps,
for the faults that give no warning (docs/resilience.md).

    # On a local cluster (`python -m nemo_kubeflow_local serve`, then export
    # NEMO_KUBEFLOW_LOCAL_KUBECONFIG=<the kubeconfig path it printed>):
    # (the local cluster's pods share this machine's files, so a local directory stands in for a PVC)
    python examples/kubeflow/preemptible_training.py run.executor=kubeflow_local \
        checkpoint_dir=/tmp/preemptible-checkpoints steps=200 --yes
    # then, from another shell, preempt and re-admit it as Kueue would:
    #   kubectl patch trainjob <name> --type merge -p '{"spec":{"suspend":true}}'   (then false)

On a real cluster, mount a claim (``pvcs=[PVCMount(claim_name=..., mount_path="/checkpoints",
create=True, size="10Gi")]``), pass ``checkpoint_dir=/checkpoints`` and give the pods time to write
the checkpoint (``termination_grace_period_seconds``).

The model is CPU-sized (fit y = 3x + 1); with several ranks the gradients are all-reduced (gloo),
and so is the stop request, so that every rank stops after the same step.
"""

import json
import os
import signal
from pathlib import Path

import nemo_run as run


@run.cli.entrypoint(namespace="kubeflow")
def train(steps: int = 200, step_seconds: float = 0.1, checkpoint_every: int = 50, checkpoint_dir: str = "") -> None:
    """Train for ``steps`` steps in all, across preemptions; ``checkpoint_dir`` defaults to $CHECKPOINT_DIR."""
    import time

    import torch
    import torch.distributed as dist

    directory = Path(checkpoint_dir or os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    directory.mkdir(parents=True, exist_ok=True)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

    stop = {"requested": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))

    w = torch.zeros(2)
    start = 0
    checkpoint = directory / "checkpoint.pt"
    if checkpoint.exists():
        state = torch.load(checkpoint)
        w, start = state["w"], state["step"]
        print(f"rank {rank}: resumed from step {start}", flush=True)

    def save(step: int, why: str) -> None:
        if rank == 0:  # written to a temporary file and renamed: a kill mid-write keeps the old one
            torch.save({"w": w, "step": step}, directory / "checkpoint.tmp")
            os.replace(directory / "checkpoint.tmp", checkpoint)
            with open(directory / "events.jsonl", "a") as log:
                log.write(json.dumps({"checkpoint": step, "why": why}) + "\n")

    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 64)[rank::world]
    y = 3 * x + 1
    step = start
    while step < steps:
        w.requires_grad_(True)
        loss = ((w[0] * x + w[1] - y) ** 2).mean()
        (grad,) = torch.autograd.grad(loss, w)
        flag = torch.tensor([float(stop["requested"])])
        if distributed:
            dist.all_reduce(grad)
            dist.all_reduce(flag)  # every rank stops after the same step
            grad /= world
        with torch.no_grad():
            w = w - 0.1 * grad
        step += 1
        if rank == 0:
            with open(directory / "events.jsonl", "a") as log:
                log.write(json.dumps({"step": step}) + "\n")
        if flag.item() > 0:
            save(step, "SIGTERM")
            print(f"rank {rank}: stopped at step {step}, checkpoint written", flush=True)
            return
        if step % checkpoint_every == 0:
            save(step, "periodic")
        time.sleep(step_seconds)
    save(step, "done")
    print(f"rank {rank}/{world}: finished {steps} steps, w={w[0].item():.3f} b={w[1].item():.3f}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    import nemo_kubeflow.config.factories  # noqa: F401  (registers the kubeflow_* executor factories)

    run.cli.main(train)
