"""Kubernetes resource quantities ("500m", "64Gi", "1e3"), parsed to exact numbers."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation, Overflow
from typing import Optional, Union

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def parse_quantity(text: Union[str, int, float, None]) -> Optional[Decimal]:
    """The value of a quantity (a string, or a bare number as YAML gives it), or ``None``
    if it is empty or the API server would reject it."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return Decimal(str(text))
    match = _QUANTITY.match(str(text).strip()) if text is not None else None
    if not match:
        return None
    try:
        return Decimal(match.group(1)) * _multiplier(match.group(2) or "")
    except (InvalidOperation, Overflow, KeyError):  # an exponent past Decimal's range: Go's parser refuses it too
        return None


def _multiplier(suffix: str) -> Decimal:
    """What a quantity's ``suffix`` multiplies its number by: a decimal exponent (``e3``; ``E`` alone is exa)
    or a unit (``Ki``, ``m``...)."""
    if suffix[:1] in ("e", "E") and suffix not in _SUFFIX:
        return Decimal(10) ** int(suffix[1:])
    return _SUFFIX[suffix]


_BINARY = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))


def format_quantity(value: Decimal) -> str:
    """A quantity as Kubernetes writes one: a whole number in the largest binary unit that divides it exactly
    (``64Gi``), else plain (``2``); a fraction in thousandths (``500m``), rounded up as the API server does."""
    if value == value.to_integral_value():
        whole = int(value)
        for suffix, power in _BINARY:
            if whole and whole % (1 << power) == 0:
                return f"{whole >> power}{suffix}"
        return str(whole)
    millis = (value * 1000).to_integral_value(rounding="ROUND_CEILING")
    return f"{millis}m"
