"""Reading progress back (nemo_kubeflow/observe/progress_view.py): from ``status.trainerStatus`` and from the
marked log line, as status shows it, and the stall rule it allows. Pure; the reads over HTTP are in
test/test_progress.py."""

import json
from datetime import datetime, timedelta, timezone

import locations

from nemo_kubeflow import progress
from nemo_kubeflow.observe import progress_view

NOW = datetime(2026, 11, 27, 9, 0, 0, tzinfo=timezone.utc)


def test_trainer_status_written_as_the_reporter_writes_it_reads_back():
    report = progress.Report(250, 1000, {"loss": 1.5}, (NOW - timedelta(seconds=12)).timestamp(), 2.5)
    found = progress_view.from_trainjob({"status": {"trainerStatus": report.trainer_status()}})
    assert found is not None and found.source == "trainerStatus"
    assert (found.step, found.total_steps, found.percent, found.eta_seconds) == (250, 1000, 25, 300)
    assert found.text() == "step 250 of 1000 (25%), 2.5 steps/s, ETA 5m 0s; loss=1.5 (at 08:59:48 UTC)"
    assert progress_view.from_trainjob({"status": {}}) is None


def test_a_trainer_status_from_another_reporter_shows_its_percentage_and_metrics():
    """transformers' callback or the SDK: no step metrics, a percentage and an ETA."""
    found = progress_view.from_trainjob(
        {
            "status": {
                "trainerStatus": {
                    "progressPercentage": 40,
                    "estimatedRemainingSeconds": 7300,
                    "lastUpdatedTime": "2026-11-27T08:59:00Z",
                    "metrics": [{"name": "train_loss", "value": "0.9"}],
                }
            }
        }
    )
    assert found.text() == "40% done, ETA 2h 1m; train_loss=0.9 (at 08:59:00 UTC)"


#: What transformers' own KubeflowCallback sent from a real Trainer run (test/data/transformers-status/capture.py).
TRANSFORMERS = json.loads((locations.DATA / "transformers-status" / "trainer-status.json").read_text())["bodies"]


def test_transformers_own_callback_reads_as_step_n_of_m_with_the_rate_its_eta_implies():
    """Its ``current_step`` and ``total_steps`` are the step and the total (not metrics), its ETA gives the rate;
    its first report (a total, no step) is its percentage, as is its last (100%, without the step)."""
    seen = [progress_view.from_trainjob({"status": body}) for body in TRANSFORMERS]
    assert all(found is not None and found.source == "trainerStatus" for found in seen)
    running = [found for found in seen if found.step is not None]
    assert len(running) >= 2, TRANSFORMERS
    for found, body in zip(running, [b for b in TRANSFORMERS if "current_step" in json.dumps(b)]):
        sent = {m["name"]: m["value"] for m in body["trainerStatus"]["metrics"]}
        status = body["trainerStatus"]
        step, total, eta = int(sent["current_step"]), int(sent["total_steps"]), status["estimatedRemainingSeconds"]
        assert (found.step, found.total_steps, found.percent) == (step, total, status["progressPercentage"])
        assert found.steps_per_second == (total - step) / eta and found.eta_seconds == eta
        assert "current_step" not in found.metrics and "total_steps" not in found.metrics
        assert found.metrics["loss"] == sent["loss"]
        assert found.text().startswith(f"step {step} of {total} ({status['progressPercentage']}%), ")
        assert f" steps/s, ETA {eta} s; loss=" in found.text() and "% done" not in found.text()
    assert seen[0].text().startswith("0% done")
    assert seen[-1].text().startswith("100% done, ETA 0 s; loss=")


def test_the_last_marked_line_wins_and_a_prefix_before_the_marker_is_allowed():
    first = progress.Report(10, 100, {}, NOW.timestamp() - 30, None).as_line()
    last = progress.Report(20, 100, {"loss": 2}, NOW.timestamp() - 5, 0.5).as_line()
    found = progress_view.from_log_lines(["hello", first, "[default0]:" + last, progress.LINE_MARKER + "{broken"])
    assert (
        found.source == "log"
        and found.text() == "step 20 of 100 (20%), 0.5 steps/s, ETA 2m 40s; loss=2 (at 08:59:55 UTC)"
    )
    assert progress_view.from_log_lines(["nothing here"]) is None


def test_stall_is_no_new_step_for_the_threshold():
    found = progress_view.from_log_lines([progress.Report(7, 70, {}, NOW.timestamp() - 120, 1.0).as_line()])
    assert progress_view.stall_message(found, 300, NOW) == ""
    assert progress_view.stall_message(found, 60, NOW) == (
        "warning: no new step for 2m 0s (stall_warning_seconds=60): rank 0 reported step 7 last (a hung collective? "
        "a stuck data loader?); see the node logs"
    )


def test_durations():
    assert [progress_view.format_duration(s) for s in (0, 59, 61, 3600, 3 * 86400 + 7200)] == [
        "0 s",
        "59 s",
        "1m 1s",
        "1h 0m",
        "3d 2h",
    ]


def test_metric_names_and_values_print_on_one_line_without_terminal_escapes():
    """A value holding a newline, a carriage return or an ANSI escape, from the log line or from trainerStatus,
    is shown escaped; a long one is cut (status and watch print this text on a terminal)."""
    metrics = {"loss": "1.5\nERROR: fake line", "note": "\x1b[31mred\x1b[0m\r", "bad\tname": "2"}
    line = progress.Report(250, 1000, metrics, NOW.timestamp(), None).as_line()
    status = {"trainerStatus": {"metrics": [{"name": k, "value": v} for k, v in metrics.items()]}}
    for found in (progress_view.from_log_lines([line]), progress_view.from_trainjob({"status": status})):
        assert found is not None
        text = found.text()
        assert text.isprintable(), text  # no newline, CR, tab or escape character left
        assert "; loss=1.5\\nERROR: fake line, note=\\x1b[31mred\\x1b[0m\\r, bad\\tname=2" in text
    # Our reporter cuts a value to 64 characters (Trainer's limit); another reporter's may be longer.
    long = {"trainerStatus": {"metrics": [{"name": "text", "value": "x" * 200 + "\n"}]}}
    found = progress_view.from_trainjob({"status": long})
    assert found is not None
    cut = "x" * (progress_view.MAX_SHOWN_CHARS - 3) + "..."
    assert found.text() == f"progress reported; text={cut}"
