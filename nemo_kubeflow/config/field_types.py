"""The types of a ``KubeflowExecutor``'s fields, checked: Python does not check dataclass annotations.

``type_problems(executor)`` says which fields hold a value of the wrong type, and gives the executor to run
the other checks on (config/checks.py); ``type_problem`` checks one value against an annotation (also
used for the settings objects and the task's values in build/plan.py).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import typing
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from nemo_kubeflow.config.landing import LANDINGS
from nemo_kubeflow.parts.fabrics import PROFILES

if TYPE_CHECKING:
    from nemo_kubeflow.config.executor import KubeflowExecutor


# --- types of the fields ------------------------------------------------------------------
# Python does not check dataclass annotations, and NeMo-Run builds executors from YAML and the
# command line too, so a wrong type would otherwise surface as an AttributeError deep in the
# build, or as a manifest the server refuses. bool is an int in Python, hence the explicit checks.

#: Fields that take a Kubernetes quantity: a number is as good as a string there.
_QUANTITY_FIELDS = frozenset(
    {
        *(f"KubeflowExecutor.{name}" for name, lands in LANDINGS.items() if lands.quantity),
        "PVCMount.size",
        "InitializerSettings.claim_size",
    }
)
#: Settings objects whose own checks say when they are of the wrong class (and only when they are used).
_SETTINGS_CHECKED_ELSEWHERE = frozenset({*(p.field for p in PROFILES.values()), "initializer_settings"})
_TYPE_NAMES = {
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    bool: ("True or False", "booleans"),
    str: ("a string", "strings"),
    dict: ("a dict", "dicts"),
    list: ("a list", "lists"),
}


def type_problems(executor: "KubeflowExecutor") -> tuple[list[str], "KubeflowExecutor", tuple[str, ...]]:
    """The fields whose values have the wrong type, the executor to run the other checks on, and the
    fields set back: ``executor`` itself, or a copy with those fields back at their defaults (so that every
    other problem is still listed, and no check trips over a value of the wrong type)."""
    problems, bad = [], []
    executor_class: type = type(executor)  # (a class is hashable, even when its instances are not)
    for f, annotation in _typed_fields(executor_class):
        if problem := _field_type_problem(executor, f, annotation):
            problems.append(problem)
            bad.append(f)
    return (problems, *_with_defaults(executor, bad))


def _with_defaults(
    executor: "KubeflowExecutor", fields: list[dataclasses.Field]
) -> tuple["KubeflowExecutor", tuple[str, ...]]:
    """``executor`` with ``fields`` set back to their defaults (a copy, when there are any), and the names of
    the fields set back."""
    checked = copy.copy(executor) if fields else executor
    reset = []
    for f in fields:
        default = _field_default(f)
        # A required field was given: a value of the wrong type stays.
        if default is not dataclasses.MISSING:
            object.__setattr__(checked, f.name, default)
            reset.append(f.name)
    return checked, tuple(reset)


def _field_type_problem(executor: "KubeflowExecutor", f: dataclasses.Field, annotation: object) -> Optional[str]:
    """Why field ``f`` of ``executor`` does not fit its ``annotation``, or None (also for a settings object
    whose own checks refuse its class)."""
    value = getattr(executor, f.name)
    if _checked_elsewhere(f.name, value, annotation):
        return None
    return type_problem(value, annotation, f.name, f"{type(executor).__name__}.{f.name}" in _QUANTITY_FIELDS)


def _checked_elsewhere(name: str, value: object, annotation: object) -> bool:
    """Whether field ``name`` holds a settings object of another class than its ``annotation``'s, which the
    settings' own checks refuse (``_SETTINGS_CHECKED_ELSEWHERE``)."""
    if name not in _SETTINGS_CHECKED_ELSEWHERE or value is None:
        return False
    return not isinstance(value, tuple(a for a in typing.get_args(annotation) if isinstance(a, type)))


def _field_default(f: dataclasses.Field) -> Any:
    """The default value of field ``f`` (a fresh one from its factory), or ``dataclasses.MISSING``."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def names_first(problem: str, fields: tuple[str, ...]) -> bool:
    """Whether ``problem`` starts with the name of one of ``fields`` (is about it)."""
    if not fields:
        return False
    return re.match(rf"({'|'.join(fields)})\b", problem) is not None


@functools.lru_cache(maxsize=None)
def _typed_fields(cls: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    """``(field, its resolved annotation)`` of each field of dataclass ``cls`` that its constructor takes (see
    ``_field_types`` for the fields left out)."""
    hints = _field_types(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls) if f.init and f.name in hints)


@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> dict:
    """The resolved annotation of each field of dataclass ``cls``; forward references that do not
    resolve (``"Initializer"``, imported only for type checkers) are left out."""
    hints = {}
    for f in dataclasses.fields(cls):
        tp = f.type
        if isinstance(tp, str):
            try:
                tp = typing.get_type_hints(cls, include_extras=False).get(f.name, tp)
            except (NameError, TypeError):
                continue
        if not isinstance(tp, str):
            hints[f.name] = tp
    return hints


@functools.lru_cache(maxsize=None)
def _annotation_parts(tp) -> tuple:
    """``(typing.get_origin(tp), typing.get_args(tp))``, once per annotation: validate() asks for
    them for every field of every task's executor."""
    return typing.get_origin(tp), typing.get_args(tp)


def _origin_and_args(tp) -> tuple:
    """``(typing.get_origin(tp), typing.get_args(tp))``, cached unless ``tp`` is unhashable."""
    try:
        return _annotation_parts(tp)
    except TypeError:  # an unhashable annotation
        return typing.get_origin(tp), typing.get_args(tp)


def type_problem(value, tp, where: str, numbers_ok: bool = False) -> Optional[str]:
    """Why ``value`` does not fit annotation ``tp`` (naming ``where`` and the type expected), or None."""
    if tp is typing.Any or isinstance(tp, (str, typing.ForwardRef)):
        return None
    origin, args = _origin_and_args(tp)
    if tp in _PLAIN_TYPES and type(value) is tp:
        return None  # the common case, a value of exactly the annotated class
    if origin in _GENERIC_CHECKS:
        return _GENERIC_CHECKS[origin](value, tp, args, where, numbers_ok)
    if tp in _SCALAR_CHECKS:
        return None if _SCALAR_CHECKS[tp](value, numbers_ok) else _mismatch(where, value, tp, numbers_ok)
    return _class_problem(value, tp, where)


def _class_problem(value, tp, where: str) -> Optional[str]:
    """Why ``value`` is no instance of class ``tp`` (or of a dataclass, has fields of the wrong type), or None;
    an annotation that is no class is not checked."""
    if not isinstance(tp, type):
        return None
    if dataclasses.is_dataclass(tp):
        return _dataclass_problem(value, tp, where)
    return None if isinstance(value, tp) else _mismatch(where, value, tp)


def _union_problem(value, tp, args: tuple, where: str, numbers_ok: bool) -> Optional[str]:
    if any(isinstance(a, typing.ForwardRef) or type_problem(value, a, where, numbers_ok) is None for a in args):
        return None
    # The one alternative the value was meant for: say what is wrong inside it.
    alternative = _meant_alternative(value, args)
    if alternative is None:
        return _mismatch(where, value, tp, numbers_ok)
    return type_problem(value, alternative, where, numbers_ok)


def _meant_alternative(value, args: tuple) -> Any:
    """The alternative of a Union (of ``args``) that ``value`` was meant for: the one of its own kind (X of
    Optional[X], list[str] of Union[str, list[str]]), else (a value given) the one other than None; ``None``
    when that is not one alternative."""
    kinds = [a for a in args if _of_kind(value, a)]
    if len(kinds) == 1:
        return kinds[0]
    others = [a for a in args if a is not type(None)]
    if value is not None and len(others) == 1:
        return others[0]
    return None


def _of_kind(value, alternative) -> bool:
    """Whether ``value`` is of the class of a Union's ``alternative`` (of ``list`` for ``list[str]``)."""
    kind = typing.get_origin(alternative) or alternative
    return isinstance(kind, type) and isinstance(value, kind) and alternative is not type(None)


def _list_problem(value, tp, args: tuple, where: str, numbers_ok: bool) -> Optional[str]:
    if not isinstance(value, (list, tuple)):
        return _mismatch(where, value, tp, numbers_ok)
    item_type = args[0] if args else typing.Any
    return next(
        (p for i, item in enumerate(value) if (p := type_problem(item, item_type, f"{where}[{i}]", numbers_ok))), None
    )


def _dict_problem(value, tp, args: tuple, where: str, numbers_ok: bool) -> Optional[str]:
    if not isinstance(value, dict):
        return _mismatch(where, value, tp, numbers_ok)
    key_type, value_type = args if args else (typing.Any, typing.Any)
    return next(
        (
            p
            for key, item in value.items()
            if (
                p := type_problem(key, key_type, f"{where} key")
                or type_problem(item, value_type, f"{where}[{key!r}]", numbers_ok)
            )
        ),
        None,
    )


#: The check of each generic annotation's origin: ``(value, tp, args, where, numbers_ok) -> problem``.
_GENERIC_CHECKS: dict[object, Callable[..., Optional[str]]] = {
    Union: _union_problem,
    list: _list_problem,
    dict: _dict_problem,
}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: Whether a value fits each scalar annotation: ``(value, numbers_ok) -> bool``. A number is no bool
#: (True and False are integers to Python, not to Kubernetes); a quantity field takes numbers as strings.
_SCALAR_CHECKS: dict[type, Callable[[object, bool], bool]] = {
    bool: lambda value, numbers_ok: isinstance(value, bool),
    int: lambda value, numbers_ok: isinstance(value, int) and not isinstance(value, bool),
    float: lambda value, numbers_ok: _is_number(value),
    str: lambda value, numbers_ok: isinstance(value, str) or (numbers_ok and _is_number(value)),
}


def _dataclass_problem(value, tp: type, where: str) -> Optional[str]:
    if not isinstance(value, tp):
        return _mismatch(where, value, tp)
    cls: typing.Any = type(value)  # a dataclass, by the check above
    if not cls.__module__.startswith("nemo_kubeflow."):
        return None  # NeMo-Run's own settings (Packager, launchers) are not annotated strictly enough
    return next(
        (
            p
            for f, annotation in _typed_fields(cls)
            if (
                p := type_problem(
                    getattr(value, f.name),
                    annotation,
                    f"{where}.{f.name}",
                    f"{cls.__name__}.{f.name}" in _QUANTITY_FIELDS,
                )
            )
        ),
        None,
    )


#: Annotations a value of exactly that class always fits (bool is no int here: ``type(True) is bool``).
_PLAIN_TYPES = frozenset({str, int, float, bool})


def _describe(tp, numbers_ok: bool = False, plural: bool = False) -> str:
    """Annotation ``tp`` in words (``plural``: of several values), as a message says what a value must be."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        return _describe_union(args, numbers_ok, plural)
    if origin is list:
        return _describe_container(origin, args[:1], numbers_ok, plural)
    if origin is dict:
        return _describe_container(origin, args, numbers_ok, plural)
    if tp is str and numbers_ok:
        return _describe_quantity(plural)
    if tp in _TYPE_NAMES:
        return _TYPE_NAMES[tp][plural]
    return _describe_class(tp, plural)


def _describe_quantity(plural: bool) -> str:
    """A Kubernetes quantity in words: a string field that takes numbers too."""
    return "quantities (strings or numbers)" if plural else "a quantity (a string such as '8Gi', or a number)"


def _describe_union(args: tuple, numbers_ok: bool, plural: bool) -> str:
    """A Union of ``args`` in words: its alternatives (a bool as its two values), None last."""
    words = ["True, False" if a is bool else _describe(a, numbers_ok, plural) for a in args if a is not type(None)]
    words += ["None"] if type(None) in args else []
    return ", ".join(words[:-1]) + " or " + words[-1]


def _describe_container(origin: type, args: tuple, numbers_ok: bool, plural: bool) -> str:
    """A list (``args``: its item type) or a dict (``args``: its key and value types) in words."""
    word = _TYPE_NAMES[origin][plural]
    if not args:
        return word
    items = " to ".join([_describe(a, plural=True) for a in args[:-1]] + [_describe(args[-1], numbers_ok, True)])
    return f"{word} of {items}"


def _describe_class(tp, plural: bool) -> str:
    """Any other class in words, by its name (with its article)."""
    name = getattr(tp, "__name__", str(tp))
    return f"{name} objects" if plural else f"{'an' if name[:1] in 'AEIOU' else 'a'} {name}"


def _mismatch(where: str, value, tp, numbers_ok: bool = False) -> str:
    got = "None" if value is None else type(value).__name__
    fix = next((f" ({fix(value, tp)})" for applies, fix in _FIXES if applies(value, tp, numbers_ok)), "")
    return f"{where}={value!r}: must be {_describe(tp, numbers_ok)}, not {got}{fix}"


#: How to fix a value of the wrong type, the first that applies: ``(applies(value, tp, numbers_ok), fix(value, tp))``.
_FIXES: tuple[tuple[Callable[[Any, Any, bool], bool], Callable[[Any, Any], str]], ...] = (
    (
        lambda value, tp, _: tp is int and isinstance(value, bool),
        lambda value, tp: "True and False are integers to Python, not to Kubernetes: give a number",
    ),
    (
        lambda value, tp, _: tp is int and isinstance(value, str) and value.strip().isdigit(),
        lambda value, tp: f"write {int(value)}, without quotes",
    ),
    (
        lambda value, tp, _: tp is int and isinstance(value, float) and value.is_integer(),
        lambda value, tp: f"write {int(value)}",
    ),
    (
        lambda value, tp, numbers_ok: (
            tp is str and isinstance(value, (int, float, bool)) and not (numbers_ok and isinstance(value, bool))
        ),
        lambda value, tp: f"quote it: {str(value)!r}",
    ),
    (lambda value, tp, _: tp is str and value is None, lambda value, tp: "remove the entry, or give ''"),
    (
        lambda value, tp, _: isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, dict),
        lambda value, tp: f"write {tp.__name__}(**...) around it",
    ),
)


def has_default_value(obj, f: dataclasses.Field) -> bool:
    default = _field_default(f)
    if default is dataclasses.MISSING:
        return False
    value = getattr(obj, f.name)
    try:
        return value is default or (type(value) is type(default) and bool(value == default))
    except Exception:  # an odd value whose == fails: keep it
        return False
