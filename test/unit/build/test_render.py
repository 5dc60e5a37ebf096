"""Runtime templates: the packaged one, and user templates that are broken in each way."""

import pytest

from nemo_kubeflow import KubeflowExecutor, TemplateError
from nemo_kubeflow.build.plan import resolve
from nemo_kubeflow.build.render import render_runtime, runtime_context
from nemo_kubeflow.parts.templates import templates_dir


def ctx(**kw):
    return runtime_context(resolve(KubeflowExecutor(container_image="img", **kw)))


def test_packaged_template_is_found():
    assert (templates_dir() / "training_runtime.yaml.j2").is_file()


def test_values_are_quoted_safely():
    rt = render_runtime(
        ctx(
            pod_labels={"team": "a: b"},
            node_selector={"k": "yes"},
            pod_annotations={"note": "line1\nline2 # not a comment"},
        )
    )
    meta = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]
    assert meta["labels"] == {"team": "a: b"}
    assert meta["annotations"]["note"] == "line1\nline2 # not a comment"
    spec = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"k": "yes"}  # a string, not YAML's boolean


def test_characters_yaml_reads_otherwise_reach_the_pod_as_written():
    """NEL, LS and PS are line breaks to YAML (folded into a space inside quotes), C1 controls and DEL are
    refused by its reader: each value is sent as it was given."""
    written = "a\x85b\u2028c\u2029d\x9fe\x7ff\ufeffg \u00e9\u4e2d"
    rt = render_runtime(ctx(pod_annotations={"note": written}))
    meta = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]
    assert meta["annotations"] == {"note": written}


def test_a_repeated_render_is_the_callers_own_and_follows_every_setting():
    # Runtimes from the packaged template are kept by their context: a second task of the same
    # settings must get an equal runtime that it may change, and any other setting a different one.
    first = render_runtime(ctx(nodes=2))
    first["spec"]["template"]["spec"]["replicatedJobs"].clear()
    second = render_runtime(ctx(nodes=2))
    assert second["spec"]["template"]["spec"]["replicatedJobs"]
    assert second == render_runtime(ctx(nodes=2)) and second["metadata"]["name"] == first["metadata"]["name"]
    assert render_runtime(ctx(nodes=3))["metadata"]["name"] != second["metadata"]["name"]
    assert render_runtime(ctx(nodes=2, fail_fast_exit_codes=[1, 2]))["metadata"]["name"] != second["metadata"]["name"]


@pytest.mark.parametrize(
    "body, message",
    [
        ("kind: {{ kind }\n", "template syntax error"),
        ("kind: {{ no_such_variable }}\n", "'no_such_variable' is undefined"),
        ("kind: {{ no_such_variable | tojson }}\n", "'no_such_variable' is undefined"),
        ("kind: [unclosed\n", "rendered invalid YAML"),
        ("kind: Deployment\n", "must render one ClusterTrainingRuntime or TrainingRuntime"),
    ],
)
def test_broken_user_templates(tmp_path, body, message):
    path = tmp_path / "mine.yaml.j2"
    path.write_text(body)
    with pytest.raises(TemplateError, match=None) as err:
        render_runtime(ctx(), str(path))
    assert message in str(err.value)


def test_missing_user_template():
    with pytest.raises(TemplateError, match="does not exist"):
        render_runtime(ctx(), "/nope/runtime.yaml.j2")


def test_user_template_can_reuse_the_variables(tmp_path):
    src = (
        (templates_dir() / "training_runtime.yaml.j2")
        .read_text()
        .replace("backoffLimit: 0", "backoffLimit: 0\n              completionMode: Indexed")
    )
    path = tmp_path / "custom.yaml.j2"
    path.write_text(src)
    rt = render_runtime(ctx(), str(path))
    assert rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["completionMode"] == "Indexed"
    assert rt["metadata"]["name"] != render_runtime(ctx())["metadata"]["name"]


@pytest.fixture
def template_cache(tmp_path, monkeypatch):
    from nemo_kubeflow.build import render

    monkeypatch.setenv(render.CACHE_DIR_ENV, str(tmp_path / "cache"))
    render._environment.cache_clear()  # a new Environment picks up the cache folder
    yield tmp_path / "cache" / "templates"
    render._environment.cache_clear()


def test_compiled_templates_are_kept_on_disk_and_follow_edits(tmp_path, template_cache, monkeypatch):
    from nemo_kubeflow.build import render

    path = tmp_path / "custom.yaml.j2"
    path.write_text((templates_dir() / "training_runtime.yaml.j2").read_text())
    first = render_runtime(ctx(), str(path))
    assert len(list(template_cache.glob("*.cache"))) == 1
    # A later process (a new Environment) with an edited template: Jinja checks the source's checksum.
    path.write_text(
        path.read_text().replace("backoffLimit: 0", "backoffLimit: 0\n              completionMode: Indexed")
    )
    render._environment.cache_clear()
    edited = render_runtime(ctx(), str(path))
    assert edited["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["completionMode"] == "Indexed"
    assert "completionMode" not in first["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    # A cache that cannot be written (a file where its folder goes) costs only the compile.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(render.CACHE_DIR_ENV, str(blocker))
    render._environment.cache_clear()
    assert render_runtime(ctx(), str(path)) == edited
