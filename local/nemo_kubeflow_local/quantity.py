"""Resource quantities as apimachinery parses them (``pkg/api/resource``, ``ParseQuantity``).

A quantity is a signed decimal number (``1``, ``1.5``, ``.5``, ``1.``), then one suffix: a binary SI
one (``Ki`` .. ``Ei``), a decimal SI one (``n``, ``u``, ``m``, none, ``k``, ``M``, ``G``, ``T``, ``P``,
``E``) or a decimal exponent (``e3``, ``E-2``). No spaces. JSON numbers decode as quantities too.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Optional, Union

_NUMBER = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?")
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)")


def parse_quantity(text: Union[str, int, float, None]) -> Optional[Decimal]:
    """The exact value of a quantity, or None for one the API server refuses (and for None)."""
    if isinstance(text, bool) or text is None:
        return None
    if isinstance(text, (int, float)):
        return Decimal(str(text))
    number = _NUMBER.match(text)
    if not text or number is None:
        return None
    # As in Go, the digits may all be missing ("+", ".", "Ki" read as 0): only the suffix can be wrong.
    sign, whole, fraction = number.group(1), number.group(2), number.group(3)
    suffix = text[number.end() :]
    try:
        value = Decimal(f"{sign}{whole or 0}.{fraction or 0}")
    except InvalidOperation:
        return None
    if suffix in _DECIMAL:
        return value.scaleb(_DECIMAL[suffix])
    if suffix in _BINARY:
        return value * (2 ** _BINARY[suffix])
    exponent = _EXPONENT.fullmatch(suffix)
    return value.scaleb(int(exponent.group(1))) if exponent else None


_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"), (0, ""), (-3, "m"), (-6, "u"))


def is_binary(text: Union[str, int, float, None]) -> bool:
    """Whether a quantity is written with a binary suffix (``Mi``): Go keeps that format through sums."""
    return isinstance(text, str) and text[-2:] in _BINARY


def format_quantity(value: Decimal, binary: bool = False) -> str:
    """A quantity's canonical text, as Go's ``Quantity.String()`` gives it: ``500m``, ``1``, ``1k``, ``100Mi``;
    a binary one that is not a whole number of at least 1024 is written as a decimal one."""
    if binary and value == value.to_integral_value() and abs(value) >= 1024:
        whole, power = int(value), 0
        while whole % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
            whole, power = whole // 1024, power + 1
        return f"{whole}{_BINARY_SUFFIXES[power]}"
    if value == 0:
        return "0"
    for exponent, suffix in _DECIMAL_SUFFIXES:
        scaled = value.scaleb(-exponent)
        if scaled == scaled.to_integral_value():
            return f"{int(scaled)}{suffix}"
    return f"{int(value.scaleb(9).to_integral_value(rounding='ROUND_CEILING'))}n"
