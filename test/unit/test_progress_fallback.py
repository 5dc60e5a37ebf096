"""The log-line fallback's rules (nemo_kubeflow/observe/progress_view.py, nemo_kubeflow/progress.py): a step not
known to be current is said to be so, and which transport a reporter picks. Pure; the bounded reads over HTTP
are in test/test_progress_log_bound.py."""

from datetime import datetime, timedelta, timezone
from pathlib import Path

from nemo_kubeflow import progress
from nemo_kubeflow.observe import progress_view
from nemo_kubeflow.observe.job_view import JobView
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


# --- rank 0 in any node's pod (ft_launcher ranks its agents by host name, then pid) --------------------------

#: ft_launcher's own log (test/data/torch-output/README.md): its agent's line as it joins the rendezvous.
FT_LOG = Path(__file__).resolve().parents[1] / "data" / "torch-output" / "2.13" / "ft_launcher-raise-after-init.log"


def view_with_lines(nodes, node_lines):
    trainjob = {"metadata": {"name": "j", "namespace": "n"}, "spec": {"trainer": {"numNodes": nodes}}, "status": {}}
    return JobView(cluster=None, trainjob=trainjob, pods=[], node_lines=node_lines)  # no read: every line at hand


def test_rank_zeros_line_is_found_in_any_nodes_lines_at_hand_and_its_node_remembered():
    seen = ProgressSeen()
    lines = {0: ["node 0 trains"], 1: ["[default0]:" + line_of(12, 30)], 2: []}
    assert progress_view.read(None, view_with_lines(3, lines), seen).step == 12 and seen.node == 1
    # After an in-job restart rank 0 runs elsewhere: the newest line (rank 0's clock) wins, wherever it is.
    lines = {0: [line_of(40, 2)], 1: [line_of(12, 30)]}
    assert progress_view.read(None, view_with_lines(2, lines), seen).step == 40 and seen.node == 0


def test_other_nodes_are_read_only_where_node_0s_agent_is_not_rank_0():
    real = [line for line in FT_LOG.read_text().splitlines() if "has joined round" in line]
    assert real and " as rank 0 in a world of size 1." in real[0]
    # Node 0's agent is rank 0 (or nothing says): its lines at hand are the only place to look.
    assert progress_view._to_read({0: real}, ProgressSeen(), nodes=4) == []
    assert progress_view._to_read({0: ["no rendezvous line"]}, ProgressSeen(), nodes=4) == []
    # Its newest round ranked it 1: the others, the node where the line was seen last first, bounded.
    ranked_second = real + [real[0].replace("round 0", "round 1").replace("as rank 0", "as rank 1")]
    assert progress_view._to_read({0: ranked_second}, ProgressSeen(node=2), nodes=4) == [2, 1, 3]
    assert len(progress_view._to_read({0: ranked_second}, ProgressSeen(), nodes=100)) == progress_view.SEARCH_NODES
    # Node 0 not at hand: node 0 is read first, as before; ranked first again, rank 0 is back in node 0.
    assert progress_view._to_read({}, ProgressSeen(), nodes=4) == [0]
    assert progress_view._to_read({0: ranked_second + real}, ProgressSeen(), nodes=4) == []


def line_of(step, seconds_ago):
    return progress.Report(step, 100, {}, NOW.timestamp() - seconds_ago, 1.0).as_line()
