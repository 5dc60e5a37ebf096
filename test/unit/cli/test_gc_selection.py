"""`nemo-kubeflow gc`'s pure parts: durations, ages, which experiments and finished jobs it selects
(test/test_finished_jobs.py runs gc on the local cluster)."""

import argparse
from datetime import datetime, timezone

import pytest

from nemo_kubeflow.cli import gc
from nemo_kubeflow.cli import main as console
from nemo_kubeflow.constants import EXPERIMENT_LABEL, MANAGED_BY_LABEL
from nemo_kubeflow.parts.naming import label_value


@pytest.mark.parametrize(
    "text, seconds",
    [("30s", 30), ("45m", 2700), ("12h", 43200), ("7d", 604800), ("2w", 1209600), ("1d12h", 129600), ("0s", 0)],
)
def test_older_than_reads_durations(text, seconds):
    assert gc.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7", "7x", "d", "-1d", "1.5h", ""])
def test_older_than_refuses_what_is_not_a_duration(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a duration such as 30m, 12h, 7d or 1d12h"):
        gc.parse_duration(text)


def test_older_than_error_on_the_command_line_names_the_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        console.main(["gc", "--older-than", "7days"])
    assert exit_.value.code == 2
    assert "argument --older-than: '7days': expected a duration" in capsys.readouterr().err


@pytest.mark.parametrize(
    "seconds, text",
    [(5, "5s"), (59, "59s"), (61, "1m1s"), (3 * 3600 + 125, "3h2m"), (8 * 86400 + 30, "8d"), (86400 + 3600, "1d1h")],
)
def test_ages_print_like_kubectl(seconds, text):
    assert gc.format_age(seconds) == text


def test_experiment_selection_by_id_or_title():
    by_title = gc.experiment_labels("llama3 8b")
    assert by_title(label_value("llama3 8b_1795319744650370646"))
    assert not by_title(label_value("llama3 8b-sft_1795319744650370646"))
    assert not by_title(label_value("llama3_1795319744650370646"))
    by_id = gc.experiment_labels("llama3 8b_1795319744650370646")
    assert by_id(label_value("llama3 8b_1795319744650370646")) and not by_id("llama3-8b_1")


def test_experiment_selection_by_a_long_title_uses_this_machines_experiments(nemorun_home):
    title = "a-very-long-experiment-title-for-pretraining-llama3-70b"
    exp_id = f"{title}_1795319744650370646"
    (nemorun_home / "experiments" / title / exp_id).mkdir(parents=True)
    label = label_value(exp_id)
    assert len(label) <= 63 and "1795319744650370646" not in label  # shortened with a hash
    assert gc.experiment_labels(title)(label)
    assert not gc.experiment_labels("another-title")(label)


def test_select_finished_jobs_never_selects_objects_without_our_label():
    now = datetime.now(timezone.utc)
    done = {"type": "Complete", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"}
    ours = {
        "metadata": {"name": "ours", "labels": {MANAGED_BY_LABEL: "nemo-kubeflow", EXPERIMENT_LABEL: "x_1"}},
        "status": {"conditions": [done]},
    }
    theirs = {"metadata": {"name": "theirs", "labels": {EXPERIMENT_LABEL: "x_1"}}, "status": {"conditions": [done]}}
    running = {
        "metadata": {"name": "running", "labels": ours["metadata"]["labels"]},
        "status": {"jobsStatus": [{"name": "node", "ready": 1}]},
    }
    result = gc.select_finished_jobs([("ns", ours), ("ns", theirs), ("ns", running)], now, experiments=["x"])
    assert [job["metadata"]["name"] for _, job, _, _ in result.selected] == ["ours"]
    assert result.unfinished == 1
