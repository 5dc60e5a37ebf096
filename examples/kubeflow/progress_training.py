"""A training loop that reports its progress, and what status says while it runs (docs/progress.md).

    python examples/kubeflow/progress_training.py                    # local cluster, progress on rank 0's log
    python examples/kubeflow/progress_training.py --trainjob-status  # local cluster with Trainer's TrainJobStatus
    python examples/kubeflow/progress_training.py --cluster          # the cluster of your current kubeconfig

The loop calls ``progress.report(step, loss=...)`` every step; rank 0 writes at most one report per
``--interval`` seconds. The script submits it detached, then looks at it as ``nemo-kubeflow status`` does
(a describe) until it ends, printing each new status line:

    RUNNING: step 120 of 300 (40%), 9.8 steps/s, ETA 18 s; loss=0.0833 (at 09:00:12 UTC)

The image needs nemo-kubeflow (``pip install --no-deps nemo-kubeflow``: the progress module needs nothing
else); on the local cluster the pods run this Python, which has it.
"""

from __future__ import annotations

import argparse
import sys
import time

import nemo_run as run

from nemo_kubeflow import KubeflowExecutor


def train(steps: int = 300, seconds_per_step: float = 0.1, interval: float = 2.0) -> None:
    """Runs in the pods (NeMo-Run ships this file): a stand-in for a training loop, reporting each step."""
    from nemo_kubeflow import progress

    with progress.reporting(total_steps=steps, interval=interval):
        for step in range(1, steps + 1):
            time.sleep(seconds_per_step)  # the training step
            progress.report(step, loss=round(10.0 / step, 4))


def run_experiment(executor: KubeflowExecutor, steps: int, interval: float) -> int:
    from torchx.specs import AppState, is_terminal, parse_app_handle

    from nemo_kubeflow.nemo_run.scheduler import create_scheduler

    with run.Experiment("progress-training", executor=executor, log_level="WARN") as exp:
        exp.add(run.Partial(train, steps=steps, interval=interval), name="train")
        exp.run(detach=True)
    app_id = parse_app_handle(exp.jobs[0].handle)[2]
    shown, saw_progress = "", False
    while True:
        desc = create_scheduler("progress-example").describe(app_id)  # a new look each time, as a new process
        line = desc.state.name + (f": {desc.msg}" if desc.msg else "")
        if line != shown:
            print(line, flush=True)
            shown = line
        saw_progress = saw_progress or " of " in desc.msg and "ETA " in desc.msg
        if is_terminal(desc.state):
            break
        time.sleep(2)
    ok = desc.state == AppState.SUCCEEDED and saw_progress
    print("OK: status showed the progress" if ok else "FAILED: no progress with an ETA was shown")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", action="store_true", help="the cluster of the current kubeconfig")
    parser.add_argument(
        "--trainjob-status",
        action="store_true",
        help="local cluster with Trainer's TrainJobStatus gate: progress goes to status.trainerStatus",
    )
    parser.add_argument("--image", default="nvcr.io/nvidia/nemo:25.02", help="training image (with nemo-kubeflow)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between progress writes")
    args = parser.parse_args()
    executor = KubeflowExecutor(container_image=args.image, nodes=2, nprocs_per_node=1, shm_size=None)
    if args.cluster:
        return run_experiment(executor, args.steps, args.interval)
    from nemo_kubeflow_local import LocalCluster

    gates = ("TrainJobStatus",) if args.trainjob_status else ()
    with LocalCluster(feature_gates=gates) as cluster:
        executor.kubeconfig = str(cluster.kubeconfig_path)
        return run_experiment(executor, args.steps, args.interval)


if __name__ == "__main__":
    sys.exit(main())
