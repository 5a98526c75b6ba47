"""A SQL statement's fingerprint, the label of a database request: what the statement was, with
what varies per request taken out, so that calls of one statement group together.

The rules are those of the tracer's labels (``engine/src/trace/label.rs``), so a statement seen on
the wire and in a span gets one label: comments dropped; string and number literals, ``$n``
placeholders and dollar-quoted strings become ``?``; ``IN (?, ?, ?)`` becomes ``IN (?+)``;
whitespace is collapsed; a trailing ``;`` is dropped. Drivers' own placeholders, which the wire
never shows because the driver fills them in (``%s``, ``%(name)s`` of Python's DB-API, ``:name``),
become ``?`` too. The label is at most MAX_LABEL characters; a longer statement is cut and marked.
"""

from __future__ import annotations

import functools
import re

MAX_LABEL = 512
TRUNCATED_MARK = " [truncated]"

_TOKEN = r"""
      (?P<space>\s+)
    | (?P<comment>/\*.*?(?:\*/|\Z)|--[^\n]*{hash})
    | (?P<string>{strings})
    | (?P<quoted>{quoted})
    | (?P<dollar>\$\$.*?(?:\$\$|\Z)|\$(?P<tag>[A-Za-z_][A-Za-z0-9_]*)\$.*?(?:\$(?P=tag)\$|\Z))
    | (?P<param>\$\d+|%\([A-Za-z_][A-Za-z0-9_]*\)s|%s|(?<![:\w]):[A-Za-z_][A-Za-z0-9_]*|\?)
    | (?P<number>(?<![\w$])(?:0[xX][0-9A-Fa-f]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?))
    | (?P<word>[A-Za-z0-9_$\x80-\U0010ffff]+)
    | (?P<other>.)
"""
_DIALECTS = {
    # PostgreSQL: '' doubles a quote; "..." is an identifier; E'..', N'..', B'..', X'..' are strings
    False: re.compile(
        _TOKEN.format(hash="", strings=r"[EeNnBbXx]?'(?:[^']|'')*(?:'|\Z)", quoted=r'"(?:[^"]|"")*(?:"|\Z)'),
        re.VERBOSE | re.DOTALL,
    ),
    # MySQL: backslash escapes; "..." is a string too; `...` is an identifier; # starts a comment
    True: re.compile(
        _TOKEN.format(
            hash=r"|\#[^\n]*",
            strings=r"[EeNnBbXx]?'(?:[^'\\]|\\.|'')*(?:'|\Z)|\"(?:[^\"\\]|\\.|\"\")*(?:\"|\Z)",
            quoted=r"`(?:[^`]|``)*(?:`|\Z)",
        ),
        re.VERBOSE | re.DOTALL,
    ),
}
_LIST = re.compile(r"\(\?(?:, ?\?)+\)")


@functools.lru_cache(maxsize=4096)
def sql_fingerprint(sql: str, mysql: bool = False) -> str:
    """The fingerprint of `sql` (see the module docstring), with MySQL's quoting rules when `mysql`
    (backslash escapes, double-quoted strings, ``#`` comments); statements repeat verbatim
    (placeholders), so recent ones are remembered."""
    out: list[str] = []
    size = 0
    space = False
    cut = False
    for m in _DIALECTS[mysql].finditer(sql):
        kind = m.lastgroup
        if kind in ("space", "comment"):
            space = True
            continue
        literal = kind in ("string", "dollar", "param", "number")
        text = "?" if literal else m.group()
        # as the tracer: a space before a literal, none before , ) ; nor after ( otherwise
        if space and out and (literal or (text not in ",);" and out[-1] != "(")):
            out.append(" ")
            size += 1
        space = False
        if size + len(text) > MAX_LABEL:
            out.append(text[: MAX_LABEL - size])
            cut = True
            break
        out.append(text)
        size += len(text)
    label = "".join(out).rstrip("; ")
    if "?," in label or "?, " in label:
        label = _LIST.sub("(?+)", label)
    return label + TRUNCATED_MARK if cut else label
