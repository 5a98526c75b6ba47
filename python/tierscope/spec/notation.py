"""The papers' topology notation `#W/#A/#C/#D` (with node-type and DBMS letters) as an explicit
topology table."""

from __future__ import annotations

import re
from typing import Any

from tierscope.contracts.dbms import TABLE as DBMS_TABLE
from tierscope.tiers import TIERS

#: notation letter -> the spec's DBMS name (tierscope.contracts.dbms's one table)
DBMS = {d.letter: d.spec for d in DBMS_TABLE}
DBMS_LETTER = {v: k for k, v in DBMS.items()}
#: node-type letters must not collide with DBMS letters in the notation
RESERVED_LETTERS = set(DBMS)


# --- topology ----------------------------------------------------------------------------------

_FIELD_RE = re.compile(r"^(\d+)([A-Z]?)$")
_DB_FIELD_RE = re.compile(rf"^(\d+)(?:([{''.join(DBMS)}])([A-Z]?)|([A-Z]?)(?:-([A-Z]))?)$")


def parse_notation(text: str, default_dbms: str | None = None) -> dict[str, Any]:
    """The papers' `#W/#A/#C/#D` notation as an explicit topology table (node types None = default).

    Grammar (docs/spec.md): four fields separated by `/`; each is a count optionally followed by
    one node-type letter; the database field may also carry the DBMS letter, either right after
    the count (`1M`, `9ML`, as in the papers) or after a dash (`1S-P`).
    """
    if not isinstance(text, str):
        raise ValueError(f'expected a topology string such as "1/2/0/1L", got {text!r}')
    fields = [f.strip() for f in text.split("/")]
    if len(fields) != 4:
        raise ValueError(
            f'expected four fields #W/#A/#C/#D such as "1/2/0/1L" or "1L/2S/0/1S-P", got '
            f"{text!r} ({len(fields)} field{'s' if len(fields) != 1 else ''})"
        )
    out: dict[str, Any] = {}
    for tier, field in zip(TIERS, fields):
        if tier == "db":
            m = _DB_FIELD_RE.match(field)
            if not m:
                raise ValueError(
                    f"{text!r}: database field {field!r}: expected a count, an optional node-type "
                    'letter and an optional DBMS letter M, P or G, e.g. "1", "2L", "1M", "1S-P", "3G"'
                )
            count = int(m.group(1))
            letter = m.group(2) or m.group(5) or default_dbms
            node_type = m.group(3) or m.group(4) or None
            if letter is not None and letter not in DBMS:
                raise ValueError(
                    f"{text!r}: DBMS letter {letter!r}: expected M (MariaDB) or P (PostgreSQL) or G (Galera)"
                )
            if node_type in RESERVED_LETTERS:
                raise ValueError(
                    f"{text!r}: database field {field!r}: {node_type} after a dash is read as a "
                    'node type, but M, P and G are DBMS letters; write e.g. "1S-P" or "1P"'
                )
            out[tier] = {"count": count, "node_type": node_type, "dbms": DBMS.get(letter or "")}
        else:
            m = _FIELD_RE.match(field)
            if not m:
                raise ValueError(
                    f"{text!r}: {tier} field {field!r}: expected a count optionally followed by one "
                    'node-type letter, e.g. "1" or "2L"'
                )
            if m.group(2) in RESERVED_LETTERS:
                raise ValueError(
                    f"{text!r}: {tier} field {field!r}: {m.group(2)} is a DBMS letter, only allowed "
                    "in the database field"
                )
            out[tier] = {"count": int(m.group(1)), "node_type": m.group(2) or None}
    return out
