"""No secret value in a traceback: a failed submission rendered as rich renders it with frame locals (the
`nemo` CLI's `-v --rich-exceptions`), every log level, and the errors of a secret source that is not text."""

import base64
import io
import logging

import nemo_run as run
import pytest
from rich.console import Console
from rich.traceback import Traceback

from nemo_kubeflow import ConfigError, KubeflowExecutor, SubmissionError

CANARY = "canary-trace-3f9a61d2"


def forms(value: str) -> list[str]:
    """The canary as it could leak: raw, and base64 (as a Secret's data holds it)."""
    return [value, base64.b64encode(value.encode()).decode()]


def rendered_with_locals(exc: BaseException) -> str:
    """The exception as rich prints it with frame locals, nothing truncated."""
    out = io.StringIO()
    trace = Traceback.from_exception(
        type(exc), exc, exc.__traceback__, show_locals=True, locals_max_string=None, locals_max_length=None
    )
    Console(file=out, width=250, color_system=None).print(trace)
    return out.getvalue()


@pytest.mark.parametrize("level", ["DEBUG", "INFO", "WARN"])
def test_a_failed_submission_shows_no_secret_at_any_verbosity(local, monkeypatch, capsys, caplog, level):
    caplog.set_level(getattr(logging, level if level != "WARN" else "WARNING"))
    monkeypatch.setenv("TRACE_TOK_SRC", CANARY)
    local.inject_fault(verb="create", resource="secrets", status=422, message="rejected secret")
    executor = KubeflowExecutor(
        container_image="python:3.11",
        kubeconfig=str(local.kubeconfig_path),
        secret_env_vars={"TOK": "env:TRACE_TOK_SRC"},
        env_vars={"PLAIN": "visible"},
    )
    with pytest.raises(SubmissionError) as err:
        run.run(
            run.Script(inline="true"), executor=executor, name=f"trace-{level.lower()}", detach=True, log_level=level
        )
    trace = rendered_with_locals(err.value)
    # The traceback does reach the frames that held the values (else this test would prove nothing).
    assert "rejected secret" in trace and "secret_values" in trace and "<masked>" in trace, trace[-3000:]
    out = capsys.readouterr()
    for text in (trace, out.out, out.err, caplog.text, str(err.value), repr(err.value)):
        for leak in forms(CANARY):
            assert leak not in text


def test_a_secret_file_that_is_not_text_is_refused_naming_the_source(local, tmp_path):
    token = tmp_path / "token.bin"
    token.write_bytes(CANARY.encode() + b"\xff\xfe")
    local.clear_requests()
    executor = KubeflowExecutor(
        container_image="python:3.11", kubeconfig=str(local.kubeconfig_path), secret_env_vars={"TOK": f"file:{token}"}
    )
    with pytest.raises(ConfigError) as err:
        run.run(run.Script(inline="true"), executor=executor, name="binary-secret", detach=True)
    assert f"secret_env_vars['TOK']: '{token}' is not UTF-8 text" in str(err.value)
    trace = rendered_with_locals(err.value)
    for leak in forms(CANARY) + [repr(CANARY.encode())[2:-1]]:
        assert leak not in trace
    assert not isinstance(err.value.__context__, UnicodeDecodeError) or err.value.__suppress_context__
    assert not [r for r in local.requests if r.verb in ("create", "patch", "update", "delete")]
