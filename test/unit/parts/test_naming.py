import pytest

from nemo_kubeflow import constants as C
from nemo_kubeflow.parts import naming
from nemo_kubeflow.parts.naming import ReplicatedJobShape as Job

#: The budget of a runtime with only the trainer's `node` job, on one node.
NODE_BUDGET = 48


@pytest.mark.parametrize(
    "exp, task",
    [
        ("llama3_8b_1700000000", "pretrain"),
        ("20240101-run", "Task.With.Dots"),
        ("x" * 200, "y" * 200),
        ("ÜBER_exp", "__"),
        ("", ""),
    ],
)
def test_trainjob_names_are_rfc1035_and_short(exp, task):
    name = naming.trainjob_name(exp, task, NODE_BUDGET)
    assert naming.is_rfc1035_label(name, NODE_BUDGET), name


def test_names_that_sanitise_alike_do_not_collide():
    names = {naming.trainjob_name(e, "t", NODE_BUDGET) for e in ("llama3_8b", "llama3-8b", "LLAMA3_8B", "llama3.8b")}
    assert len(names) == 4


def test_names_are_stable():
    assert naming.trainjob_name("exp_1", "task", 33) == naming.trainjob_name("exp_1", "task", 33)


def test_derived_names_stay_within_limit():
    base = naming.trainjob_name("e" * 80, "t" * 80, NODE_BUDGET)
    assert len(naming.derived_name(base, "code")) <= 63
    assert naming.derived_name("short", "code") == "short-code"
    long = naming.derived_name("a" * 70, "code")
    assert len(long) <= 63 and long.endswith("-code")


def test_label_values():
    assert naming.label_value("exp_1.2") == "exp_1.2"
    value = naming.label_value("x" * 100)
    assert naming.is_label_value(value) and len(value) <= 63


def test_trailing_newline_is_not_a_valid_name():
    assert not naming.is_rfc1123_label("job\n")
    assert not naming.is_rfc1035_label("job\n")
    assert not naming.is_rfc1123_subdomain("a.b\n")


# --- JobSet's pod-name rule ----------------------------------------------------------------


def test_longest_pod_names_match_what_the_real_jobset_refused():
    # Recorded against JobSet v0.12.0 (issue 12): a 50-character name gave 65-character `node` pods,
    # a 37-character one 67 for `dataset-initializer` and 65 for `model-initializer`.
    assert len(naming.longest_pod_name("a" * 50, Job("node", 1, 2))) == 65
    assert len(naming.longest_pod_name("a" * 37, Job("dataset-initializer"))) == 67
    assert len(naming.longest_pod_name("a" * 37, Job("model-initializer"))) == 65
    assert naming.longest_pod_name("x", Job("node", 2, 128)) == "x-node-1-127-abcde"


@pytest.mark.parametrize("nodes, budget", [(1, 48), (9, 48), (10, 48), (11, 47), (100, 47), (101, 46), (128, 46)])
def test_budget_follows_the_digits_of_the_largest_pod_index(nodes, budget):
    jobs = [Job("node", completions=nodes)]
    assert naming.jobset_name_budget(jobs) == budget
    assert len(naming.longest_pod_name("a" * budget, jobs[0])) == 63
    assert naming.longest_pod_names("a" * budget, jobs) == []
    [(job, pod)] = naming.longest_pod_names("a" * (budget + 1), jobs)
    assert job == jobs[0] and len(pod) == 64


@pytest.mark.parametrize("nodes", [1, 9, 10, 128])
def test_the_longest_replicated_job_sets_the_budget(nodes):
    jobs = [Job("dataset-initializer"), Job("model-initializer"), Job("node", completions=nodes)]
    assert naming.jobset_name_budget(jobs) == 33
    assert naming.jobset_name_budget(jobs[1:]) == 35
    assert naming.jobset_name_budget(jobs[2:]) == 49 - len(str(nodes - 1))
    # The job index counts too: eleven replicas of the Job give index 10, one more digit.
    assert naming.jobset_name_budget([Job("node", replicas=11, completions=nodes)]) == 48 - len(str(nodes - 1))


def runtime(*rjobs, ml_nodes=None):
    spec = {"template": {"spec": {"replicatedJobs": list(rjobs)}}}
    if ml_nodes is not None:
        spec["mlPolicy"] = {"numNodes": ml_nodes, "torch": {}}
    return {"kind": "ClusterTrainingRuntime", "metadata": {"name": "rt"}, "spec": spec}


TRAINER_JOB = {
    "name": "trainer-nodes",
    "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}}, "spec": {}},
}


def test_shapes_are_read_from_the_runtime_as_trainer_counts_pods():
    rt = runtime({"name": "warmup", "replicas": 2, "template": {"spec": {"parallelism": 12}}}, TRAINER_JOB, ml_nodes=4)
    # The trainer job is found by its ancestor label, not by name; numNodes of the TrainJob wins.
    assert naming.runtime_job_shapes(rt, 16) == [Job("warmup", 2, 12), Job("trainer-nodes", 1, 16)]
    assert naming.runtime_job_shapes(rt) == [Job("warmup", 2, 12), Job("trainer-nodes", 1, 4)]
    assert naming.runtime_job_shapes(runtime(TRAINER_JOB)) == [Job("trainer-nodes", 1, 1)]
    assert naming.runtime_job_shapes({"kind": "ClusterTrainingRuntime", "spec": None}) == []


@pytest.mark.parametrize("budget", [8, 33, 46, 48, 63])
def test_trainjob_names_fit_the_budget_and_stay_unique(budget):
    experiment = "llama3-8b-pretrain-h100_1732406400123456789"  # a NeMo-Run id: title + time_ns()
    names = {naming.trainjob_name(experiment, task, budget) for task in ("pretrain", "pretrain-2", "Pretrain")}
    assert len(names) == 3
    for name in names:
        assert len(name) <= budget and naming.is_rfc1035_label(name), name
    if budget >= 33:
        assert next(iter(names)).startswith("llama3-8b-pretrain-h100")  # readable


def test_a_budget_too_small_for_any_name_is_refused():
    with pytest.raises(ValueError, match="at least 8"):
        naming.trainjob_name("exp", "task", 7)


def test_name_helpers_match_whole_strings():
    assert naming.is_qualified_name("example.com/team") and not naming.is_qualified_name("example.com/team\n")
    assert not naming.is_qualified_name("Example.com/team")
    assert naming.is_env_var_name("NCCL_DEBUG") and not naming.is_env_var_name("NCCL_DEBUG\n")
    assert naming.is_config_key("a.py") and not naming.is_config_key("a.py\n")
    assert not naming.is_config_key("..a") and not naming.is_config_key(".")
    assert not naming.is_label_value("v1\n") and not naming.is_qualified_name_part("x\n")


def test_trainer_env_problem_names_each_pet_variable_and_what_trainer_sets_it_to():
    assert naming.trainer_env_problem("NCCL_DEBUG") is None
    for name in C.PET_ENV_NAMES:
        problem = naming.trainer_env_problem(name)
        assert problem.startswith(f"{name} is set by Kubeflow Trainer's torch plugin, to {C.PET_ENV_VALUES[name]},")
    assert "to 29500" in naming.trainer_env_problem("PET_MASTER_PORT")


def test_relaxed_env_var_names_are_printable_ascii_without_equals():
    assert naming.is_relaxed_env_var_name("1 x.y") and not naming.is_env_var_name("1 x.y")
    assert not any(map(naming.is_relaxed_env_var_name, ("", "A=B", "A\n", "\u00e9")))
