"""Text put into a container's command, args and env values, escaped from Kubernetes' expansion."""

from __future__ import annotations

import re


def kube_escape(text: str) -> str:
    """Protect text from Kubernetes' expansion in a container's command, args and env values, where
    ``$(VAR)`` is replaced and ``$$`` becomes ``$``: a ``$`` before ``(`` or ``$`` is doubled, so the
    process gets the text as written. Every piece of text we put into a container goes through this."""
    return re.sub(r"\$(?=[$(])", "$$", text)


def literal_env(name: str, value: object) -> dict[str, str]:
    """An env entry whose value reaches the process as written (no ``$(VAR)`` reference)."""
    return {"name": name, "value": kube_escape(str(value))}
