"""The scalar values of a spec: durations ("50ms", "2m"), sizes ("512MiB"), workload levels and
data-set scales, each parsed with an error that says what was expected."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
)

#: named data sets per benchmark (tierscope.apps.rubbos.datagen.PRESETS, apps.bookstore.datagen.SCALES)
SCALE_PRESETS = {"rubbos": ("tiny", "small", "paper"), "tpcw": ("tiny", "small", "large", "paper")}


# --- scalar parsers: durations and sizes -------------------------------------------------------

_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|ms|s|min|m|h)?\s*$")


def parse_duration(value: Any) -> float:
    """Seconds from a number (seconds) or a string with a unit: "50ms", "1.5s", "2m", "1h", "100us"."""
    if isinstance(value, bool):
        raise ValueError('expected a duration such as 30, "50ms" or "2m", got a boolean')
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION_RE.match(value)
        if not m:
            raise ValueError(f'expected a duration such as 30, "50ms", "1.5s" or "2m", got {value!r}')
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]
    else:
        raise ValueError(f'expected a duration such as 30, "50ms" or "2m", got {value!r}')
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"expected a non-negative duration, got {value!r}")
    return seconds


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "tib": 1024**4, "tb": 1000**4,
}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any) -> int:
    """Bytes from an integer or a string: "512MiB" (= "512M", binary), "100MB" (decimal), "2G"."""
    if isinstance(value, bool):
        raise ValueError('expected a size such as "512MiB" or 1048576, got a boolean')
    if isinstance(value, (int, float)):
        size = float(value)
    elif isinstance(value, str):
        m = _SIZE_RE.match(value)
        unit = m.group(2).lower() if m else None
        if not m or unit not in _SIZE_UNITS:
            raise ValueError(f'expected a size such as "512MiB", "2G", "100MB" or a byte count, got {value!r}')
        size = float(m.group(1)) * _SIZE_UNITS[unit]
    else:
        raise ValueError(f'expected a size such as "512MiB" or a byte count, got {value!r}')
    if size < 0:
        raise ValueError(f"expected a non-negative size, got {value!r}")
    return int(size)


def parse_users(value: Any) -> list[int]:
    """Users as an int, a list of ints, {from, to, step} or the string "1000..13000 step 1000"."""
    if isinstance(value, bool):
        raise ValueError("expected users as a number, a list or a range, got a boolean")
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        if not value:
            raise ValueError("expected at least one workload level, got an empty list")
        return value
    if isinstance(value, str):
        m = re.match(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*(?:step\s*(\d+))?\s*$", value)
        if not m:
            raise ValueError(f'expected a range such as "1000..13000 step 1000", got {value!r}')
        value = {"from": int(m.group(1)), "to": int(m.group(2)), "step": int(m.group(3) or 1)}
    if isinstance(value, dict):
        unknown = set(value) - {"from", "to", "step"}
        if unknown or "from" not in value or "to" not in value:
            raise ValueError(f"expected a range table {{ from = 1000, to = 13000, step = 1000 }}, got {value!r}")
        start, stop, step = value["from"], value["to"], value.get("step", 1)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, stop, step)):
            raise ValueError(f"expected integers in the users range, got {value!r}")
        if step <= 0 or stop < start:
            raise ValueError(f"expected from <= to and step > 0 in the users range, got {value!r}")
        return list(range(start, stop + 1, step))
    raise ValueError(f"expected users as a number, a list or a range, got {value!r}")


def parse_scale(value: Any) -> float | str:
    """A data scale: a fraction of the paper's data set (0 < scale <= 100) or a preset name."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 100:
        return float(value)
    names = "; ".join(f"{bench}: {', '.join(p)}" for bench, p in SCALE_PRESETS.items())
    raise ValueError(
        f"expected a fraction of the paper's data set (0 < scale <= 100) or a preset name ({names}), got {value!r}"
    )


Duration = Annotated[float, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]
