"""A training loop that reports its progress (nemo_kubeflow.progress), run inside the pods by test_progress.py.

Shipped with nemo_kubeflow/__init__.py and nemo_kubeflow/progress.py of this checkout (test_progress.py's
packager): the pods' Python then imports this checkout's progress module, as an image with nemo-kubeflow
installed would."""

import os
import time


def train(steps: int, seconds_per_step: float, interval: float, hang_at: int = 0, release_file: str = "") -> None:
    """``steps`` steps of ``seconds_per_step``, reported with a loss; from step ``hang_at`` on, no new step
    (it keeps printing, so the log is never silent), until killed. With ``release_file``, the steps take no
    time once that file exists (the test says when the job may end; the pods share the test's host)."""
    from nemo_kubeflow import progress

    with progress.reporting(steps, interval=interval) as reporter:
        print(f"progress from {progress.__file__} via {reporter.transport}", flush=True)
        for step in range(1, steps + 1):
            if not (release_file and os.path.exists(release_file)):
                time.sleep(seconds_per_step)
            reporter.report(step, loss=round(10.0 / step, 4))
            while step == hang_at:
                print(f"waiting at step {step}", flush=True)
                time.sleep(0.5)
    sent = reporter.server.sent if reporter.server is not None else 0
    print(f"progress done: {reporter.writes} writes, {sent} to the status server", flush=True)


def chatty_train(
    steps: int, seconds_per_step: float, interval: float, lines_per_step: int, line_bytes: int, flood_from: int = 0
) -> None:
    """``train`` that prints ``lines_per_step`` lines of ``line_bytes`` after each step's report; from step
    ``flood_from`` on, no new step, and a flood of such lines (50 every 0.2 s) until killed."""
    from nemo_kubeflow import progress

    chatter = "x" * max(0, line_bytes - 1)
    with progress.reporting(steps, interval=interval) as reporter:
        for step in range(1, steps + 1):
            time.sleep(seconds_per_step)
            reporter.report(step, loss=round(10.0 / step, 4))
            if lines_per_step:
                print("\n".join([chatter] * lines_per_step), flush=True)
            while step == flood_from:
                print("\n".join([chatter] * 50), flush=True)
                time.sleep(0.2)
