"""Fuzzed executor fields (hypothesis, fixed seed, bounded): each configuration is refused with an error that
names the field, or accepted, and then the task's arguments and env values arrive as given (after Kubernetes'
`$(VAR)` expansion, as the kubelet does it). Pure: no cluster."""

import dataclasses
import shlex

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from torchx.specs import AppDef, Role

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.plan import build_for_app
from nemo_kubeflow.errors import NemoKubeflowError
from nemo_kubeflow_local.kubelet.environment import expand

FIELDS = sorted(f.name for f in dataclasses.fields(KubeflowExecutor) if f.init and f.name != "container_image")
#: Text with what Kubernetes, bash, YAML and NeMo-Run's macros treat specially.
TRICKY = st.text(alphabet=st.sampled_from(list("aZ09 $()${}`'\"\\;|&-_./:=#\n")), max_size=16)
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    TRICKY,
    st.lists(TRICKY, max_size=3),
    st.dictionaries(TRICKY, TRICKY, max_size=3),
)
ARGS = ["$(A)", "a$$b", "$$(A)", "'$(touch pwned)'", "end$"]
ENV = {"A": "'$(touch pwned)'", "B": "x$$y", "C": "$(A)"}


def submission(executor: KubeflowExecutor):
    role = Role(name="fuzz", image="", entrypoint="python", args=["-c", "import sys", *ARGS], env=dict(ENV))
    return build_for_app(AppDef(name="fuzz", roles=[role]), executor)


@seed(20261127)
@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(field=st.sampled_from(FIELDS), value=VALUES)
def test_a_fuzzed_field_is_refused_by_name_or_arrives_as_given(field, value):
    try:
        executor = KubeflowExecutor(container_image="python:3.11", **{field: value})
        sub = submission(executor)
    except NemoKubeflowError as e:
        assert field in str(e), (field, value, str(e))
        return
    trainer = sub.trainjob["spec"]["trainer"]
    env = {}
    for entry in trainer.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = expand(entry["value"], env)
    given_env = {**(executor.env_vars if isinstance(executor.env_vars, dict) else {}), **ENV}
    for name, text in given_env.items():
        if name in env:
            assert env[name] == str(text), (field, value, name)
    script = [expand(a, env) for a in trainer["command"] + trainer["args"]][-1]
    assert " ".join(shlex.quote(a) for a in ARGS) in script, (field, value, script)


@pytest.mark.parametrize("value", [{"X1": "$(B)"}, {"X2": "$$"}, {"X3": "'$(id)'", "X4": "$(X3)"}])
def test_env_vars_arrive_as_given(value):
    sub = submission(KubeflowExecutor(container_image="python:3.11", env_vars=value))
    env = {e["name"]: expand(e["value"], {}) for e in sub.trainjob["spec"]["trainer"]["env"] if "value" in e}
    for name, text in value.items():
        assert env[name] == text
