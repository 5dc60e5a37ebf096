"""Where the runtime templates lie: inside the wheel, or the repository's ``templates/``."""

from __future__ import annotations

import functools
from pathlib import Path

from nemo_kubeflow.errors import TemplateError

DEFAULT_TEMPLATE = "training_runtime.yaml.j2"


@functools.lru_cache(maxsize=None)
def templates_dir() -> Path:
    """The packaged templates (inside the wheel), or the repository's ``templates/``."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "templates", package.parent / "templates"):
        if (candidate / DEFAULT_TEMPLATE).is_file():
            return candidate
    raise TemplateError(
        f"the runtime templates are missing (looked in {package / 'templates'} and "
        f"{package.parent / 'templates'}); reinstall nemo-kubeflow"
    )
