"""Config values checked against a constructor's type annotations, so a mistyped value (``model.lr=abc``) is one
line naming the key instead of a ``TypeError`` deep inside a library."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import torch

from core.errors import ConfigError

PLAIN_TYPES = (int, float, bool, str, type(None))


def plain_types(hint: Any) -> set[type] | None:
    """The plain types a type hint accepts (``int | None`` -> {int, NoneType}); None if it accepts anything richer."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    out: set[type] = set()
    for arg in args:
        if typing.get_origin(arg) is typing.Literal:
            out |= {type(v) for v in typing.get_args(arg)}
        elif arg is torch.Tensor:  # optimiser hyper-parameters (`lr: float | Tensor`): a number from a config
            out.add(float)
        elif arg in PLAIN_TYPES:
            out.add(arg)
        else:
            return None
    return out


def type_hints(target: Callable[..., Any]) -> dict[str, Any]:
    """The annotations of ``target``'s constructor (a class) or signature (a function); {} when unresolvable."""
    try:
        return typing.get_type_hints(target.__init__ if isinstance(target, type) else target)
    except Exception:  # noqa: BLE001 - unresolvable annotations: leave the checking to the constructor
        return {}


def expected_type(value: Any, hint: Any) -> str | None:
    """What ``value`` should have been (``float``, ``int or null``), or None when ``hint`` accepts it."""
    allowed = plain_types(hint)
    if not allowed or isinstance(value, bool) or type(value) in allowed or value is None:
        return None
    if isinstance(value, int) and float in allowed:
        return None
    names = [t.__name__ for t in (int, float, bool, str) if t in allowed]
    if type(None) in allowed:
        names.append("null")
    return " or ".join(names)


def check_kwargs(target: Callable[..., Any], values: Mapping[str, Any], what: str) -> None:
    """Refuse a setting of ``values`` (keyword arguments a module passes on to ``target``: a solver's settings) whose
    type ``target``'s annotation excludes, naming it ``<what>.<key>``.

    Raises:
        ConfigError: ``<what>.<key>=<value> must be <type>``.
    """
    hints = type_hints(target)
    for key, value in values.items():
        expected = expected_type(value, hints[key]) if key in hints else None
        if expected:
            raise ConfigError(f"{what}.{key}={value!r} must be {expected}")
