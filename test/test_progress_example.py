"""examples/kubeflow/progress_training.py, run as a user runs it (its own local cluster, with and without
Trainer's TrainJobStatus gate). Its pods import nemo_kubeflow from the environment's install, as an image with
nemo-kubeflow would (the local cluster's pods run this environment's Python without its PYTHONPATH)."""

import pytest
from test_examples import run_example


@pytest.mark.parametrize("gate", [[], ["--trainjob-status"]], ids=["log-line", "trainjob-status"])
def test_progress_example_shows_step_rate_and_eta_while_it_runs(nemorun_home, gate):
    out = run_example("progress_training.py", *gate, "--steps", "120", nemorun_home=nemorun_home)
    assert "OK: status showed the progress" in out, out[-3000:]
    running = [line for line in out.splitlines() if line.startswith("RUNNING: step ")]
    assert running and " of 120 (" in running[-1] and "steps/s" in running[-1], out[-3000:]
    assert any(line.startswith("SUCCEEDED: ") for line in out.splitlines()), out[-3000:]
