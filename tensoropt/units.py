"""Byte and time quantities: parse "40GB" / "80 GiB", format for humans.

Decimal and binary prefixes are kept apart on purpose:
``KB, MB, GB, TB, PB`` are powers of 1000 (GB = 10**9 bytes), while
``KiB, MiB, GiB, TiB, PiB`` are powers of 1024 (GiB = 2**30 bytes).
Unit letters are matched case-insensitively and the trailing ``b`` always
means *bytes* (bit units are not accepted).
"""

from __future__ import annotations

import math
import re

__all__ = ["parse_bytes", "format_bytes", "format_time", "BYTE_UNITS"]

_DECIMAL_STEP = 1000
_BINARY_STEP = 1024
_PREFIXES = ("k", "m", "g", "t", "p")

#: unit suffix (lower case) -> bytes
BYTE_UNITS: dict[str, int] = {"b": 1, "": 1}
for _i, _p in enumerate(_PREFIXES, start=1):
    BYTE_UNITS[f"{_p}b"] = _DECIMAL_STEP**_i
    BYTE_UNITS[f"{_p}ib"] = _BINARY_STEP**_i

_ACCEPTED = ("a positive number of bytes, or a string such as '512MB', '40GB', "
             "'40 GiB', '1.5TB' (KB/MB/GB/TB/PB = powers of 1000, "
             "KiB/MiB/GiB/TiB/PiB = powers of 1024)")
_PATTERN = re.compile(r"^\s*((?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)

_BYTES_PER_GIB = 2**30
_MS_PER_S = 1000.0


def parse_bytes(x: int | float | str) -> int:
    """Return ``x`` as a positive whole number of bytes (see module docstring for units)."""
    if isinstance(x, bool):
        raise ValueError(f"cannot parse {x!r} as a byte count; expected {_ACCEPTED}")
    if isinstance(x, (int, float)):
        value = float(x)
    elif isinstance(x, str):
        match = _PATTERN.match(x)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in BYTE_UNITS:
            raise ValueError(f"cannot parse {x!r} as a byte count; expected {_ACCEPTED}")
        value = float(match.group(1)) * BYTE_UNITS[unit]
    else:
        raise ValueError(f"cannot parse {x!r} (type {type(x).__name__}) as a byte count; "
                         f"expected {_ACCEPTED}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"byte count must be positive and finite, got {x!r}; expected {_ACCEPTED}")
    n = round(value)
    if n <= 0:
        raise ValueError(f"byte count {x!r} rounds to {n} bytes; expected {_ACCEPTED}")
    return n


def format_bytes(n: int | float) -> str:
    """Bytes as GiB with two decimals, e.g. ``'74.51 GiB'``; below 0.1 GiB as MiB
    (``'3.25 MiB'``), where two decimals of a GiB would read as nothing."""
    if abs(n) < 0.1 * _BYTES_PER_GIB:
        return f"{n / 2**20:.2f} MiB"
    return f"{n / _BYTES_PER_GIB:.2f} GiB"


def format_time(s: float) -> str:
    """Seconds as ``'12.34 ms'`` below one second, else ``'1.23 s'``."""
    if abs(s) < 1.0:
        return f"{s * _MS_PER_S:.2f} ms"
    return f"{s:.2f} s"
