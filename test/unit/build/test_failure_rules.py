"""Failure handling in the rendered runtime: the Job's podFailurePolicy and JobSet's failurePolicy that
fail_fast_exit_codes, restart_on_oom_kill and termination_grace_period_seconds render, what the Job API
or JobSet would refuse in them, and the settings refused (test/test_resilience.py runs each mechanism on
the local cluster; docs/resilience.md)."""

import re

import pytest

from nemo_kubeflow import KubeflowExecutor


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"fail_fast_exit_codes": [0]}, "fail_fast_exit_codes=[0]: must be a list of exit codes from 1 to 255"),
        (
            {"fail_fast_exit_codes": [1, 300]},
            "fail_fast_exit_codes=[1, 300]: must be a list of exit codes from 1 to 255",
        ),
        ({"fail_fast_exit_codes": [2, 2]}, "fail_fast_exit_codes=[2, 2]: lists an exit code twice"),
        ({"termination_grace_period_seconds": -1}, "termination_grace_period_seconds=-1: must be a whole number"),
        ({"restart_on_oom_kill": "yes"}, "restart_on_oom_kill='yes': must be True or False"),
        (
            {"restart_on_oom_kill": True, "fail_fast_exit_codes": [1, 137]},
            "restart_on_oom_kill=True restarts the gang on exit code 137 (OOMKilled), but fail_fast_exit_codes=[1, 137] "
            "fails the job at once on it",
        ),
        (
            {"fail_fast_exit_codes": [1, 3], "runtime_name": "mine"},
            "fail_fast_exit_codes goes into the rendered runtime",
        ),
    ],
)
def test_bad_failure_settings_are_refused_before_anything_is_sent(settings, expected):
    from nemo_kubeflow.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(expected)):
        KubeflowExecutor(container_image="img", **settings).validate()


def rendered_runtime(**settings) -> dict:
    from nemo_kubeflow.build.plan import resolve
    from nemo_kubeflow.build.render import render_runtime, runtime_context

    executor = KubeflowExecutor(container_image="img", **settings)
    executor.validate()
    return render_runtime(runtime_context(resolve(executor)), None)


def test_rendered_failure_rules_pass_validation_and_follow_the_settings():
    from nemo_kubeflow.schema.validation import validate_manifest

    runtime = rendered_runtime(fail_fast_exit_codes=[3, 1], termination_grace_period_seconds=300)
    assert validate_manifest(runtime) == []
    jobset = runtime["spec"]["template"]["spec"]
    node = jobset["replicatedJobs"][-1]["template"]["spec"]
    assert node["podFailurePolicy"]["rules"][1]["onExitCodes"]["values"] == [1, 3, 137]  # OOMKilled too
    assert node["template"]["spec"]["terminationGracePeriodSeconds"] == 300
    assert jobset["failurePolicy"]["rules"][0]["onJobFailureReasons"] == ["PodFailurePolicy"]
    oom_restarts = rendered_runtime(fail_fast_exit_codes=[3, 1], restart_on_oom_kill=True)
    assert validate_manifest(oom_restarts) == []
    assert oom_restarts["spec"]["template"]["spec"]["replicatedJobs"][-1]["template"]["spec"]["podFailurePolicy"][
        "rules"
    ][1]["onExitCodes"]["values"] == [1, 3]
    only_oom = rendered_runtime(fail_fast_exit_codes=[])
    assert only_oom["spec"]["template"]["spec"]["replicatedJobs"][-1]["template"]["spec"]["podFailurePolicy"]["rules"][
        1
    ]["onExitCodes"]["values"] == [137]
    # Every exit code ends the Job through a FailJob rule (its event keeps the code); only the fail-fast rule's
    # message fails the JobSet, any other restarts the gang (JobSet's default).
    assert node["podFailurePolicy"]["rules"][2] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "node", "operator": "NotIn", "values": [0]},
    }
    assert jobset["failurePolicy"]["rules"][0]["onJobFailureMessagePatterns"] == ["matching FailJob rule at index 1$"]
    plain = rendered_runtime(fail_fast_exit_codes=[], restart_on_oom_kill=True)
    assert validate_manifest(plain) == []
    assert "rules" not in plain["spec"]["template"]["spec"]["failurePolicy"]
    assert [
        r["action"]
        for r in plain["spec"]["template"]["spec"]["replicatedJobs"][-1]["template"]["spec"]["podFailurePolicy"][
            "rules"
        ]
    ] == ["Count", "FailJob"]


def test_failure_rules_the_job_api_or_jobset_would_refuse_are_refused_offline():
    from nemo_kubeflow.schema.validation import validate_manifest

    runtime = rendered_runtime()
    jobset = runtime["spec"]["template"]["spec"]
    node = jobset["replicatedJobs"][-1]["template"]["spec"]
    node["template"]["spec"]["restartPolicy"] = "OnFailure"
    codes = node["podFailurePolicy"]["rules"][1]["onExitCodes"]
    codes.update(values=[3, 0, 3], containerName="nod")
    node["podFailurePolicy"]["rules"][0]["onExitCodes"] = {"operator": "In", "values": [2]}
    jobset["failurePolicy"]["rules"].append({"name": "user-error", "action": "FailJobSet"})
    problems = "\n".join(validate_manifest(runtime))
    for expected in (
        'restartPolicy: is "OnFailure" (JobSet\'s default is OnFailure), but a Job with a podFailurePolicy needs Never',
        "onExitCodes.values: contains 0 with operator In",
        "onExitCodes.values: must be sorted without duplicates",
        'onExitCodes.containerName: no container named "nod" in the pod template; did you mean node?',
        "podFailurePolicy.rules[0]: must set exactly one of onExitCodes and onPodConditions",
        'failurePolicy.rules[1].name: "user-error" is not a valid rule name',
    ):
        assert expected in problems, problems


def test_runtimes_of_ones_own_with_an_out_of_range_ttl_or_a_rule_name_with_a_newline_are_refused():
    from nemo_kubeflow.schema.validation import validate_manifest

    runtime = rendered_runtime()
    jobset = runtime["spec"]["template"]["spec"]
    jobset["ttlSecondsAfterFinished"] = -1
    jobset["failurePolicy"]["rules"][0]["name"] = "userError\n"
    problems = "\n".join(validate_manifest(runtime))
    assert "ttlSecondsAfterFinished: -1 is out of range (JobSet: 0 to 2147483647 seconds)" in problems, problems
    assert 'failurePolicy.rules[0].name: "userError\\n" is not a valid rule name' in problems, problems
