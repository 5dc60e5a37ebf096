"""YAML output that people read: multi-line strings (launch scripts) as literal blocks."""

from __future__ import annotations

from typing import Any, Iterable

import yaml


class _Dumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def dump_all(objs: Iterable[Any]) -> str:
    return yaml.dump_all(list(objs), Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
