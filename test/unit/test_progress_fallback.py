"""The log-line fallback's rules (nemo_kubeflow/observe/progress_view.py, nemo_kubeflow/progress.py): a step not
known to be current is said to be so, and which transport a reporter picks. Pure; the bounded reads over HTTP
are in test/test_progress_log_bound.py."""

from datetime import datetime, timedelta, timezone

from nemo_kubeflow import progress
from nemo_kubeflow.observe import progress_view
from nemo_kubeflow.observe.progress_view import LogLook, ProgressSeen

NOW = datetime(2026, 11, 27, 9, 0, 0, tzinfo=timezone.utc)


def line_at(step, seconds_ago):
    return progress_view.from_log_lines([progress.Report(step, 100, {}, NOW.timestamp() - seconds_ago, 1.0).as_line()])


def test_a_step_not_found_again_is_shown_as_not_current():
    seen = ProgressSeen()
    assert seen.note(LogLook(line_at(20, 30))).text() == "step 20 of 100 (20%), 1 steps/s, ETA 1m 20s (at 08:59:30 UTC)"
    shown = seen.note(LogLook(why="no progress line in node 0's last 40 lines"))
    assert shown.stale and shown.step == 20
    assert shown.text() == (
        "progress unknown (no progress line in node 0's last 40 lines); rank 0 last reported "
        "step 20 of 100 (20%), 1 steps/s, ETA 1m 20s (at 08:59:30 UTC)"
    )
    # Shown until the next read, and a current line again makes it current.
    assert seen.shown is shown
    assert not seen.note(LogLook(line_at(25, 5))).stale


def test_an_older_line_of_a_cut_read_is_not_current_and_the_newest_step_seen_wins():
    seen = ProgressSeen()
    why = "node 0's newest lines are more than the 16 KiB a log read takes"
    assert (
        seen.note(LogLook(older=line_at(5, 100), why=why))
        .text()
        .startswith(f"progress unknown ({why}); rank 0 last reported step 5 of")
    )
    seen.note(LogLook(line_at(30, 10)))
    assert seen.note(LogLook(older=line_at(12, 60), why=why)).step == 30  # the newer one, seen before
    assert ProgressSeen().note(LogLook(why="node 0 has no pod")) is None  # nothing seen: nothing to show


def test_the_stall_rule_reads_the_age_of_the_step():
    found = line_at(7, 120)
    assert progress_view.stall_message(found, 60, NOW).startswith("warning: no new step for 2m 0s")
    assert progress_view.stall_message(found, 300, NOW + timedelta(seconds=1)) == ""


def test_percent_done_is_shared_by_the_reporter_and_the_reader():
    assert [progress.percent_done(s, t) for s, t in ((1, 3), (5, 0), (None, 10), (12, 10), (-1, 10))] == [
        33,
        None,
        None,
        100,
        0,
    ]


def test_the_log_line_can_be_forced_where_the_status_server_is_offered():
    """``NEMO_KUBEFLOW_PROGRESS=log``: the escape hatch for a status server the pod cannot reach."""
    offered = {
        "PET_NNODES": "2",
        "RANK": "0",
        progress.SERVER_URL_ENV: "https://127.0.0.1:1/x",
        progress.SERVER_TOKEN_ENV: "/nonexistent",
    }
    assert progress.Reporter(env=offered).transport == "status-server"
    forced = progress.Reporter(env={**offered, progress.MODE_ENV: "log"})
    assert forced.transport == "log" and forced.server is None
    assert progress.Reporter(env={k: v for k, v in offered.items() if k != progress.SERVER_URL_ENV}).transport == "log"
