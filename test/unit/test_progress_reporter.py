"""The training-process side of progress (nemo_kubeflow/progress.py): when it reports, what it writes, and
that nothing it meets can stop training. The status-server transport against a server is in
test/test_progress.py (the local cluster's emulation of Trainer's, and the real one)."""

import io
import json
import logging
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from nemo_kubeflow import progress

IN_JOB = {"PET_NNODES": "2", "PET_NODE_RANK": "0"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reporter(env=None, interval=30.0, total=None):
    out, clock = io.StringIO(), Clock()
    rep = progress.Reporter(
        total,
        interval=interval,
        env=IN_JOB if env is None else env,
        stream=out,
        clock=clock,
        wall_clock=lambda: 1_700_000_000.0 + clock.now,
    )
    return rep, out, clock


def lines(out: io.StringIO) -> list[dict]:
    return [
        json.loads(line[len(progress.LINE_MARKER) :])
        for line in out.getvalue().splitlines()
        if line.startswith(progress.LINE_MARKER)
    ]


def test_outside_a_trainjob_and_on_other_ranks_nothing_is_written():
    for env in (
        {},
        {**IN_JOB, "RANK": "3"},
        {**IN_JOB, "PET_NODE_RANK": "1"},
        {**IN_JOB, "LOCAL_RANK": "1"},
        {**IN_JOB, progress.MODE_ENV: "off"},
    ):
        rep, out, _ = reporter(env)
        assert rep.transport == "off" and rep.report(1, 10, loss=1.0) is False
        rep.flush()
        assert out.getvalue() == ""
    rep, out, _ = reporter({**IN_JOB, "PET_NODE_RANK": "1", "RANK": "0"})  # torchrun's global rank decides
    assert rep.report(1, 10)


def test_one_write_per_interval_then_the_last_step_and_what_the_interval_held_back():
    rep, out, clock = reporter(total=100)
    assert rep.report(0, loss=3.0)  # the first call writes
    for step in range(1, 10):
        clock.now += 1
        assert not rep.report(step, loss=3.0 - step / 10)
    clock.now += 30
    assert rep.report(10, loss=2.0)
    clock.now += 1
    rep.report(11, loss=1.9)
    clock.now += 1
    assert rep.report(100, loss=1.0)  # the last step is always written
    clock.now += 1
    rep.report(100, loss=1.0)  # the same step again: nothing new
    written = lines(out)
    assert [w["step"] for w in written] == [0, 10, 100]
    assert written[1]["steps_per_second"] == pytest.approx(10 / 39)
    assert written[1]["eta_seconds"] == round(90 / (10 / 39))
    assert written[1]["metrics"] == {"loss": "2"} and written[1]["total_steps"] == 100
    rep2, out2, clock2 = reporter()
    rep2.report(5)
    clock2.now += 2
    rep2.report(6, loss=0.5)
    rep2.flush()  # the end of training writes what was held back
    assert [w["step"] for w in lines(out2)] == [5, 6]


def test_trainer_status_is_the_sdk_body_with_step_total_and_rate_as_metrics():
    report = progress.Report(250, 1000, {"loss": 1.23456789, "lr": 3e-4, "tag": "x" * 100}, 1_700_000_000.0, 2.5)
    status = report.trainer_status()
    assert status["progressPercentage"] == 25 and status["estimatedRemainingSeconds"] == 300
    assert status["lastUpdatedTime"] == "2023-11-14T22:13:20+00:00"
    assert status["metrics"][:3] == [
        {"name": "step", "value": "250"},
        {"name": "total_steps", "value": "1000"},
        {"name": "steps_per_second", "value": "2.5"},
    ]
    values = {m["name"]: m["value"] for m in status["metrics"]}
    assert values["loss"] == "1.23457" and values["lr"] == "0.0003" and len(values["tag"]) == 64
    assert "progressPercentage" not in progress.Report(3, None, {}, 0.0, None).trainer_status()


def test_a_bad_metric_or_step_never_reaches_training(caplog):
    class Broken:
        def __str__(self):
            raise RuntimeError("no text")

    rep, out, clock = reporter()
    with caplog.at_level(logging.WARNING, logger="nemo_kubeflow.progress"):
        assert rep.report(1, loss=Broken()) is False
        assert rep.report("not a step") is False
    assert len(caplog.records) == 1 and "training goes on" in caplog.records[0].getMessage()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_status_server_that_cannot_be_reached_is_said_once_and_the_log_line_carries_the_report(tmp_path, caplog):
    token = tmp_path / "token"
    token.write_text("secret-token-value")
    env = {
        **IN_JOB,
        progress.SERVER_URL_ENV: f"https://127.0.0.1:{closed_port()}/apis/x/status",
        progress.SERVER_TOKEN_ENV: str(token),
        progress.SERVER_CA_CERT_ENV: str(tmp_path / "missing-ca.crt"),
    }
    rep, out, clock = reporter(env, interval=0.1)
    assert rep.transport == "status-server"
    with caplog.at_level(logging.WARNING, logger="nemo_kubeflow.progress"):
        started = time.monotonic()
        rep.report(1, 10)
        assert time.monotonic() - started < progress.REQUEST_TIMEOUT_S  # the call hands over, never sends
        rep.flush()
        clock.now += 0.5  # still backing off: the next write goes to the log directly
        rep.report(2, 10)
        clock.now += 5
        rep.report(3, 10)
        rep.flush()
    assert [w["step"] for w in lines(out)] == [1, 2, 3]
    assert len(caplog.records) == 1 and "status server" in caplog.records[0].getMessage()
    assert "secret-token-value" not in caplog.text
    assert rep.server is not None and rep.server.sent == 0


def test_it_imports_with_the_standard_library_alone():
    """The pod's Python may have nothing else: load the file in an isolated interpreter without site packages."""
    code = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('p', sys.argv[1]); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "r = m.Reporter(4, env={'PET_NNODES': '1'}, interval=0); r.report(4, loss=0.5)"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(Path(progress.__file__))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(progress.LINE_MARKER + '{"step":4,"total_steps":4')


class FakeLightningCallback:
    """Stands in for lightning.pytorch.Callback (the unit tier runs no framework): the real Lightning runs the
    callback in test/test_frameworks.py's framework tier."""

    def __init__(self) -> None:
        pass


@pytest.fixture()
def fake_lightning(monkeypatch):
    """The fake in place of ``lightning.pytorch``, whether Lightning is installed or not."""
    pkg = types.ModuleType("lightning")
    sub = types.ModuleType("lightning.pytorch")
    sub.Callback = FakeLightningCallback
    pkg.pytorch = sub
    monkeypatch.setitem(sys.modules, "lightning", pkg)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", sub)


class FakeTensor:
    def __init__(self, value):
        self.value = value

    def item(self):
        return self.value


def test_lightning_callback_against_a_fake_lightning(fake_lightning, monkeypatch, capsys):
    """A fake: the callback's hooks as Lightning calls them (the real Lightning: test/test_frameworks.py)."""
    for k, v in IN_JOB.items():
        monkeypatch.setenv(k, v)
    callback = progress.lightning_callback(interval=0)
    assert isinstance(callback, FakeLightningCallback)
    trainer = types.SimpleNamespace(
        global_rank=0,
        global_step=7,
        max_steps=-1,
        estimated_stepping_batches=70,
        callback_metrics={"train_loss": FakeTensor(0.25), "name": "text"},
    )
    callback.on_train_batch_end(trainer, None, None, None, 6)
    callback.on_train_batch_end(types.SimpleNamespace(global_rank=1, global_step=8), None, None, None, 7)
    callback.on_train_end(trainer, None)
    written = [json.loads(line[len(progress.LINE_MARKER) :]) for line in capsys.readouterr().out.splitlines()]
    assert written == [
        {
            "step": 7,
            "total_steps": 70,
            "steps_per_second": None,
            "eta_seconds": None,
            "metrics": {"train_loss": "0.25"},
            "time": written[0]["time"],
        }
    ]


class FakeTrainerCallback:
    """Stands in for transformers.TrainerCallback (the unit tier runs no framework): the real Trainer runs the
    callback in test/test_frameworks.py's framework tier."""


def test_hf_callback_against_a_fake_transformers(monkeypatch, capsys):
    """The callback's events as transformers' Trainer calls them: ``on_log`` after ``on_step_end`` of the same step
    (so a step carries the scalars logged before it), ``is_world_process_zero`` on rank 0 only."""
    for k, v in IN_JOB.items():
        monkeypatch.setenv(k, v)
    fake = types.ModuleType("transformers")
    fake.TrainerCallback = FakeTrainerCallback
    monkeypatch.setitem(sys.modules, "transformers", fake)
    callback = progress.hf_callback(interval=0)
    assert isinstance(callback, FakeTrainerCallback)
    state = types.SimpleNamespace(is_world_process_zero=True, global_step=1, max_steps=30)
    callback.on_step_end(None, state, None)
    callback.on_log(None, state, None, logs={"loss": 2.5, "learning_rate": FakeTensor(0.001), "note": "text"})
    state.global_step = 2
    callback.on_step_end(None, state, None)
    other = types.SimpleNamespace(is_world_process_zero=False, global_step=3, max_steps=30)
    callback.on_log(None, other, None, logs={"loss": 9.0})
    callback.on_step_end(None, other, None)
    callback.on_train_end(None, state, None)
    written = [json.loads(line[len(progress.LINE_MARKER) :]) for line in capsys.readouterr().out.splitlines()]
    assert [(w["step"], w["total_steps"], w["metrics"]) for w in written] == [
        (1, 30, {}),
        (2, 30, {"loss": "2.5", "learning_rate": "0.001"}),
    ]


def test_megatron_bridge_style_step_hook_against_a_fake_context(monkeypatch, capsys):
    """A fake of Megatron-Bridge's CallbackContext (without Megatron-Bridge installed; a loop of its shape runs in
    test/test_frameworks.py): its ``state.train_state.step``, ``state.cfg.train.train_iters`` and ``loss_dict``."""
    for k, v in IN_JOB.items():
        monkeypatch.setenv(k, v)
    hook = progress.step_hook(interval=0)
    state = types.SimpleNamespace(
        train_state=types.SimpleNamespace(step=40),
        cfg=types.SimpleNamespace(train=types.SimpleNamespace(train_iters=400)),
    )
    assert hook(types.SimpleNamespace(state=state, loss_dict={"lm loss": FakeTensor(2.5)}))
    assert hook(41, grad_norm=1.5)  # a NeMo-style loop calls it with the step
    assert hook(object()) is False  # not a context it knows: nothing, and no error
    written = [json.loads(line[len(progress.LINE_MARKER) :]) for line in capsys.readouterr().out.splitlines()]
    assert [(w["step"], w["total_steps"], w["metrics"]) for w in written] == [
        (40, 400, {"lm loss": "2.5"}),
        (41, 400, {"grad_norm": "1.5"}),
    ]


def test_a_step_hook_takes_total_steps_given_as_a_keyword_as_the_total(monkeypatch, capsys, caplog):
    """``hook(step, total_steps=M, loss=...)`` (docs/progress.md): the total, not a metric, and no error; status
    shows "of M" and the ETA from the line it writes."""
    from nemo_kubeflow.observe import progress_view

    for k, v in IN_JOB.items():
        monkeypatch.setenv(k, v)
    hook = progress.step_hook(interval=0)
    with caplog.at_level(logging.WARNING, logger="nemo_kubeflow.progress"):
        assert hook(10, total_steps=100, loss=2.5)
        time.sleep(0.05)
        assert hook(20, total_steps=100, loss=2.25)
        assert hook(30, loss=2.0)  # the total given once holds
    assert not caplog.records
    out = capsys.readouterr().out.splitlines()
    written = [json.loads(line[len(progress.LINE_MARKER) :]) for line in out]
    assert [(w["step"], w["total_steps"], w["metrics"]) for w in written] == [
        (10, 100, {"loss": "2.5"}),
        (20, 100, {"loss": "2.25"}),
        (30, 100, {"loss": "2"}),
    ]
    shown = progress_view.from_log_lines(out[:2])
    assert shown is not None and shown.eta_seconds is not None
    assert shown.text().startswith("step 20 of 100 (20%), ") and ", ETA " in shown.text()
    # The context a Megatron-Bridge callback passes: a total given to the hook replaces train_iters.
    state = types.SimpleNamespace(
        train_state=types.SimpleNamespace(step=40),
        cfg=types.SimpleNamespace(train=types.SimpleNamespace(train_iters=400)),
    )
    assert hook(types.SimpleNamespace(state=state, loss_dict={}), total_steps=500)
    assert json.loads(capsys.readouterr().out[len(progress.LINE_MARKER) :])["total_steps"] == 500


def test_a_step_held_back_is_written_when_the_interval_ends_without_another_call():
    """A loop that reaches step 10 and hangs: the steps after the first write were held back by the interval;
    the timer writes the last one reached, so status and its stall warning name step 10, not step 1."""
    from datetime import datetime, timezone

    from nemo_kubeflow.observe import progress_view

    armed: list = []
    out, clock = io.StringIO(), Clock()
    rep = progress.Reporter(
        100,
        env=IN_JOB,
        stream=out,
        clock=clock,
        wall_clock=lambda: 1_700_000_000.0 + clock.now,
        timer=lambda delay, write: armed.append((clock.now + delay, write)),
    )
    assert rep.report(1, loss=3.0)
    for step in range(2, 11):
        clock.now += 1
        assert not rep.report(step, loss=3.0 - step / 10)
    assert [at for at, _ in armed] == [1030.0]  # armed once, for the end of the interval
    clock.now = 1030.0
    armed.pop()[1]()  # the timer fires: no call came since step 10
    written = lines(out)
    assert [w["step"] for w in written] == [1, 10]
    assert written[1]["metrics"] == {"loss": "2"} and written[1]["steps_per_second"] == pytest.approx(1.0)
    # Status's stall warning, 20 minutes later, names step 10 and its age.
    shown = progress_view.from_log_lines(out.getvalue().splitlines())
    assert shown is not None and shown.step == 10
    now = datetime.fromtimestamp(1_700_000_000.0 + 1009.0 + 1200, timezone.utc)
    assert "no new step for 20m 0s" in progress_view.stall_message(shown, 900, now)
    assert "reported step 10 last" in progress_view.stall_message(shown, 900, now)
    # A call that writes before the timer fires leaves it nothing to write.
    clock.now += 40
    assert not armed and rep.report(11) and not armed
    clock.now += 1
    rep.report(12)
    clock.now += 1
    rep.report(13)
    at, write = armed.pop()
    assert at == clock.now - 2 + 30
    clock.now += 40
    assert rep.report(14)
    write()
    assert [w["step"] for w in lines(out)] == [1, 10, 11, 14]


def test_the_default_timer_writes_a_held_back_step_on_its_own():
    out = io.StringIO()
    rep = progress.Reporter(100, interval=0.2, env=IN_JOB, stream=out)
    assert rep.report(1) and not rep.report(2)
    deadline = time.monotonic() + 10
    while len(lines(out)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [w["step"] for w in lines(out)] == [1, 2]
