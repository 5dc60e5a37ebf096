import pytest

from nemo_kubeflow import naming


@pytest.mark.parametrize("exp, task", [
    ("llama3_8b_1700000000", "pretrain"),
    ("20240101-run", "Task.With.Dots"),
    ("x" * 200, "y" * 200),
    ("ÜBER_exp", "__"),
    ("", ""),
])
def test_trainjob_names_are_rfc1035_and_short(exp, task):
    name = naming.trainjob_name(exp, task)
    assert naming.is_rfc1035_label(name, 50), name


def test_names_that_sanitise_alike_do_not_collide():
    names = {naming.trainjob_name(e, "t") for e in ("llama3_8b", "llama3-8b", "LLAMA3_8B", "llama3.8b")}
    assert len(names) == 4


def test_names_are_stable():
    assert naming.trainjob_name("exp_1", "task") == naming.trainjob_name("exp_1", "task")


def test_derived_names_stay_within_limit():
    base = naming.trainjob_name("e" * 80, "t" * 80)
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


def test_name_helpers_match_whole_strings():
    assert naming.is_qualified_name("example.com/team") and not naming.is_qualified_name("example.com/team\n")
    assert not naming.is_qualified_name("Example.com/team")
    assert naming.is_env_var_name("NCCL_DEBUG") and not naming.is_env_var_name("NCCL_DEBUG\n")
    assert naming.is_config_key("a.py") and not naming.is_config_key("a.py\n")
    assert not naming.is_config_key("..a") and not naming.is_config_key(".")
    assert not naming.is_label_value("v1\n") and not naming.is_qualified_name_part("x\n")
