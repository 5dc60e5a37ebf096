"""The documentation site: it builds without a warning, every page is in the nav, and the pages
stay in step with the README and the code they describe."""

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
CONFIG = REPO / "mkdocs.yml"


def fenced(text: str, lang: str) -> list[str]:
    """The bodies of the top-level fenced code blocks of ``lang``, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        values = item.values() if isinstance(item, dict) else [item]
        for value in values:
            pages += [value] if isinstance(value, str) else nav_pages(value)
    return pages


def test_site_builds_without_warnings(tmp_path):
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        pytest.fail("mkdocs is not installed: install the test extra (pip install -e '.[test]')")
    site = tmp_path / "site"
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(CONFIG), "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARNING" not in out.stderr, out.stderr
    built = {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.rglob("*.md")}
    for page in built:
        html = site / ("index.html" if page == "index" else f"{page}/index.html")
        assert html.is_file(), f"{page}.md was not built"


def test_every_page_is_in_the_nav():
    pages = nav_pages(yaml.safe_load(CONFIG.read_text())["nav"])
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert [p for p in on_disk if p not in pages] == [], "add these pages to the nav of mkdocs.yml"
    assert [p for p in pages if p not in on_disk] == [], "the nav of mkdocs.yml names missing pages"
    assert len(pages) == len(set(pages)), "a page appears twice in the nav"


def _modules(root: Path) -> set[str]:
    """The modules under `root` relative to it; an empty __init__.py (a subpackage's) is no module to describe."""
    return {
        p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.name != "__init__.py" or p.read_text().strip()
    }


def test_architecture_names_every_package_and_each_module_says_what_it_is():
    """docs/architecture.md's package table names every package of the product (and the tools), its diagram
    names no module that is gone, and each module says what it is in its docstring (the page points there)."""
    text = (DOCS / "architecture.md").read_text()
    package = REPO / "nemo_kubeflow"
    packages = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    table = text.split("\n## Packages\n", 1)[1].split("\n\n**", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)/`", table, re.M))
    assert sorted(packages - listed) == [], "add a row for these packages to docs/architecture.md's package table"
    assert sorted(listed - packages - {"tools"}) == [], (
        "docs/architecture.md's package table names packages that do not exist"
    )
    for tool in _modules(REPO / "tools"):
        assert f"`{tool}`" in table, f"docs/architecture.md's package table should name tools/{tool}"
    undocumented = sorted(m for m in _modules(package) if not ast.get_docstring(ast.parse((package / m).read_text())))
    assert undocumented == [], "give these modules a docstring saying what they are"
    diagram = "\n".join(fenced(text, ""))
    named = set(re.findall(r"(?<![\w/.])([a-z_/]+\.py)\b", diagram))
    modules = _modules(package) | {f"tools/{tool}" for tool in _modules(REPO / "tools")}
    assert named and sorted(named - modules) == [], "the diagram of docs/architecture.md names missing modules"


def test_the_local_cluster_page_names_every_module_of_the_local_cluster_and_no_other():
    text = (DOCS / "local-cluster.md").read_text()
    section = text.split("\n## How it is built\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = set(re.findall(r"`([\w/]+\.py)`", "\n".join(row.split(" | ", 1)[0] for row in rows)))
    modules = _modules(REPO / "local" / "nemo_kubeflow_local")
    assert sorted(modules - named) == [], "add these modules to docs/local-cluster.md's module table"
    assert sorted(named - modules) == [], "docs/local-cluster.md's module table names modules that do not exist"


def test_getting_started_runs_the_readme_commands():
    readme = (REPO / "README.md").read_text()
    try_it = readme.split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    commands = fenced(try_it, "bash")
    assert len(commands) == 2, "README's 'Try it' should hold the main job and the test command"
    page = fenced((DOCS / "getting-started.md").read_text(), "bash")
    assert page[:2] == commands, "copy README's two commands, verbatim, to the top of docs/getting-started.md"


def test_every_template_variable_is_documented():
    from nemo_kubeflow import KubeflowExecutor
    from nemo_kubeflow.build.plan import resolve
    from nemo_kubeflow.build.render import runtime_context

    variables = runtime_context(resolve(KubeflowExecutor(container_image="python:3.11")))
    text = (DOCS / "templates.md").read_text()
    missing = [name for name in variables if f"`{name}`" not in text]
    assert missing == [], f"document these template variables in docs/templates.md: {missing}"


def test_code_samples_use_real_field_names():
    """Every keyword given to one of our dataclasses in a docs Python sample is a field of it."""
    import nemo_kubeflow

    classes = {
        name: getattr(nemo_kubeflow, name)
        for name in nemo_kubeflow.__all__
        if dataclasses.is_dataclass(getattr(nemo_kubeflow, name, None))
    }
    problems = []
    for page in sorted(DOCS.rglob("*.md")):
        for block in fenced(page.read_text(), "python"):
            if "nemo_kubeflow" not in block:
                continue  # e.g. NeMo-Run's own KubeflowExecutor in the comparison
            try:
                tree = ast.parse(block)
            except SyntaxError as e:
                problems.append(f"{page.name}: a Python sample does not parse: {e}")
                continue
            for node in ast.walk(tree):
                name = getattr(node.func, "id", None) if isinstance(node, ast.Call) else None
                if name in classes:
                    fields = {f.name for f in dataclasses.fields(classes[name])}
                    problems += [
                        f"{page.name}: {name}({kw.arg}=...) is not a field"
                        for kw in node.keywords
                        if kw.arg and kw.arg not in fields
                    ]
    assert problems == []
