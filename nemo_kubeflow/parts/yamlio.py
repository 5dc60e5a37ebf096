"""YAML output that people read: multi-line strings (launch scripts) as literal blocks."""

from __future__ import annotations

from typing import Any, Iterable

import yaml

# libyaml's emitter when PyYAML was built with it: several times faster than pure Python,
# and the dry run writes every manifest on every run.
_BaseDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
#: The fastest safe loader available (libyaml's when present).
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Dumper(_BaseDumper):  # type: ignore[misc, valid-type]
    pass


#: A plain fast safe dumper (no block-style strings), for files people don't read.
FastSafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load(text: str):
    return yaml.load(text, Loader=SafeLoader)


def _str_representer(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def dump_all(objs: Iterable[Any]) -> str:
    return yaml.dump_all(list(objs), Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
