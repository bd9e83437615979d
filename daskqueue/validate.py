"""Validation of configuration values: one way to check, one error that names the value.

Every check raises :class:`ConfigurationError` (a ``ValueError``) whose message names the
argument and the bad value: ``"lease_timeout_s must be a number > 0, got -1"``. Each returns the
value it checked, so a constructor can check and assign in one line.
"""

from __future__ import annotations

from typing import Any, Collection

from daskqueue.errors import ConfigurationError, FieldTooLongError

__all__ = ["check_number", "check_choice", "check_optional_str", "check_label", "MAX_LABEL_BYTES"]

#: The longest message ``type`` or ``key``, in UTF-8 bytes: a durable queue stores each
#: length in 16 bits (``segment/FORMAT.md``, chunk header). Every queue keeps the same limit,
#: so a pool may change durability without its callers' labels becoming invalid.
MAX_LABEL_BYTES: int = 2**16 - 1


def check_number(
    name: str,
    value: Any,
    *,
    integer: bool = False,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
    none_ok: bool = False,
) -> Any:
    """Check that ``value`` is a number (an ``int`` if ``integer``; never a ``bool``) within the
    given bounds (``above`` is exclusive, ``at_least`` and ``at_most`` inclusive); ``None``
    passes if ``none_ok``."""
    if value is None and none_ok:
        return value
    kind_ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if (
        isinstance(value, bool)
        or not kind_ok
        or value != value  # NaN
        or (above is not None and not value > above)
        or (at_least is not None and not value >= at_least)
        or (at_most is not None and not value <= at_most)
    ):
        raise ConfigurationError(f"{name} must be {_describe(integer, above, at_least, at_most, none_ok)}, "
                                 f"got {value!r}")
    return value


def _describe(integer: bool, above: float | None, at_least: float | None, at_most: float | None,
              none_ok: bool) -> str:
    bounds = [f"> {above}"] if above is not None else []
    bounds += [f">= {at_least}"] if at_least is not None else []
    bounds += [f"<= {at_most}"] if at_most is not None else []
    what = " ".join(["an integer" if integer else "a number", " and ".join(bounds)]).strip()
    return f"None or {what}" if none_ok else what


def check_choice(name: str, value: Any, choices: Collection[Any]) -> Any:
    """Check that ``value`` is one of ``choices``."""
    if isinstance(value, bool) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ConfigurationError(f"{name} must be one of {listed}, got {value!r}")
    return value


def check_optional_str(name: str, value: Any) -> str | None:
    """Check that ``value`` is a ``str`` or ``None``."""
    if value is not None and not isinstance(value, str):
        raise ConfigurationError(f"{name} must be a str or None, got {value!r}")
    return value


def check_label(name: str, value: Any) -> str | None:
    """Check that ``value`` (a message's ``type`` or ``key``) is ``None`` or a ``str`` whose
    UTF-8 encoding fits :data:`MAX_LABEL_BYTES`; :class:`FieldTooLongError` names the length."""
    check_optional_str(name, value)
    if value is None:
        return value
    try:
        length = len(value.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise ConfigurationError(f"{name} must be encodable as UTF-8, got {value!r:.80}: {e}") from e
    if length > MAX_LABEL_BYTES:
        raise FieldTooLongError(name, length, MAX_LABEL_BYTES)
    return value
