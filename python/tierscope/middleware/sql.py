"""What the request manager needs to know about SQL text (pure functions, no parser).

`classify` says whether a statement may run on one replica (a read) or must run on all of them
(a write); `rewrite_macros` replaces the time macros by one literal, so every replica stores the
same value (C-JDBC's macro handling). Both look only at words outside string literals, quoted
identifiers and comments.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import NamedTuple

READ, WRITE = "read", "write"
COPY = "copy"  # not supported by the middleware

#: first words of statements that only read (everything else is broadcast)
READ_STARTS = frozenset(("SELECT", "SHOW", "VALUES", "TABLE"))
#: words that make a SELECT a write: row locks, SELECT INTO, sequence and lock functions
LOCKING = ("FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE", "FOR KEY SHARE", "LOCK IN SHARE MODE")
WRITE_FUNCTIONS = frozenset(
    (
        "NEXTVAL",
        "SETVAL",
        "PG_ADVISORY_LOCK",
        "PG_ADVISORY_XACT_LOCK",
        "LO_CREATE",
        "LO_UNLINK",
        "PG_TERMINATE_BACKEND",
        "PG_CANCEL_BACKEND",
        "GET_LOCK",  # MySQL's named locks
        "RELEASE_LOCK",
        "RELEASE_ALL_LOCKS",
    )
)
DATA_CHANGING = frozenset(("INSERT", "UPDATE", "DELETE", "MERGE", "TRUNCATE", "CREATE", "DROP", "ALTER"))


class Token(NamedTuple):
    kind: str  # "word", "punct", "param", "string", "number"
    text: str
    start: int
    end: int


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?")
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


def tokens(sql: str) -> Iterator[Token]:
    """Words, punctuation, numbers and literals of `sql`; comments and whitespace skipped."""
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c.isspace():
            i += 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif sql.startswith("/*", i):  # nested comments, as PostgreSQL allows
            depth, j = 1, i + 2
            while j < n and depth:
                if sql.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif sql.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            i = j
        elif c == "'" or (c in "eEbBxXnN" and sql.startswith("'", i + 1)):
            j = i + 1 if c == "'" else i + 2
            backslash = c in "eE"
            while j < n:
                if backslash and sql[j] == "\\":
                    j += 2
                    continue
                if sql[j] == "'":
                    if sql.startswith("''", j):
                        j += 2
                        continue
                    break
                j += 1
            yield Token("string", sql[i : j + 1], i, min(j + 1, n))
            i = j + 1
        elif c == '"':
            j = sql.find('"', i + 1)
            while j >= 0 and sql.startswith('""', j):
                j = sql.find('"', j + 2)
            j = n - 1 if j < 0 else j
            yield Token("word", sql[i : j + 1], i, j + 1)  # a quoted identifier never matches a keyword
            i = j + 1
        elif c == "$":
            m = _DOLLAR_TAG.match(sql, i)
            if m:
                end = sql.find(m.group(0), m.end())
                end = n if end < 0 else end + len(m.group(0))
                yield Token("string", sql[i:end], i, end)
                i = end
            else:
                m = re.compile(r"\$[0-9]+").match(sql, i)
                j = m.end() if m else i + 1
                yield Token("param", sql[i:j], i, j)
                i = j
        elif c.isalpha() or c == "_":
            m = _WORD.match(sql, i)
            assert m is not None  # c starts a word
            yield Token("word", m.group(0).upper(), i, m.end())
            i = m.end()
        elif c.isdigit():
            m = _NUMBER.match(sql, i)
            assert m is not None  # c starts a number
            yield Token("number", m.group(0), i, m.end())
            i = m.end()
        else:
            yield Token("punct", c, i, i + 1)
            i += 1


def statements(sql: str) -> list[list[Token]]:
    """The tokens of each `;`-separated statement (empty statements dropped)."""
    out: list[list[Token]] = [[]]
    for t in tokens(sql):
        if t.kind == "punct" and t.text == ";":
            out.append([])
        else:
            out[-1].append(t)
    return [s for s in out if s]


def classify_statement(toks: list[Token]) -> str:
    words = [t.text for t in toks if t.kind == "word"]
    first = next((t.text for t in toks if not (t.kind == "punct" and t.text == "(")), "")
    if first == "WITH":  # a read unless one of its parts changes data
        return WRITE if any(w in DATA_CHANGING for w in words) or _locks(words) or _calls_writer(toks) else READ
    if first not in READ_STARTS:
        return WRITE
    if first == "SELECT" and ("INTO" in words and _select_into(toks)):
        return WRITE
    if _locks(words) or _calls_writer(toks):
        return WRITE
    return READ


def _locks(words: list[str]) -> bool:
    text = " ".join(words)
    return any(phrase in text for phrase in LOCKING)


def _calls_writer(toks: list[Token]) -> bool:
    return any(
        t.kind == "word" and t.text in WRITE_FUNCTIONS and i + 1 < len(toks) and toks[i + 1].text == "("
        for i, t in enumerate(toks)
    )


def _select_into(toks: list[Token]) -> bool:
    """SELECT ... INTO table (creates a table), not INSERT INTO (handled as a write anyway)."""
    depth = 0
    for t in toks:
        if t.text == "(":
            depth += 1
        elif t.text == ")":
            depth -= 1
        elif depth == 0 and t.kind == "word" and t.text == "INTO":
            return True
    return False


def classify(sql: str) -> str:
    """READ when every statement in `sql` only reads (SELECT without row locks, SHOW, VALUES,
    TABLE, WITH without data-changing parts), else WRITE. Empty text (only comments) is a read."""
    return WRITE if any(classify_statement(s) == WRITE for s in statements(sql)) else READ


def strip_trailing_comment(sql: str) -> str:
    """`sql` without a trailing /* ... */ comment (the sqlcommenter request id differs per request,
    the statement does not), for caching what is known about a statement."""
    t = sql.rstrip()
    if t.endswith("*/"):
        start = t.rfind("/*")
        if start > 0 and "*/" not in t[start:-2]:
            return t[:start]
    return sql


_LITERAL = re.compile(r"'(?:[^']|'')*'|(?<![A-Za-z0-9_$])[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")
_SPACE = re.compile(r"\s+")


def label(sql: str) -> str:
    """The statement's label for service-time statistics: the text without a trailing comment,
    string and number literals replaced by `?` and whitespace collapsed, so `... WHERE id = 7` and
    `... WHERE id = 8` (simple protocol) share one label, as do `$1` forms (extended protocol)."""
    return _SPACE.sub(" ", _LITERAL.sub("?", strip_trailing_comment(sql))).strip()


def first_word(sql: str) -> str:
    for t in tokens(sql):
        return t.text if t.kind == "word" else ""
    return ""


# --- macros --------------------------------------------------------------------------------------

#: macros rewritten to a literal: name -> (needs "()" after it, SQL type of the literal)
MACROS = {
    "NOW": (True, "timestamptz"),
    "CURRENT_TIMESTAMP": (False, "timestamptz"),
    "LOCALTIMESTAMP": (False, "timestamp"),
    "CURRENT_DATE": (False, "date"),
    "TRANSACTION_TIMESTAMP": (True, "timestamptz"),
    "STATEMENT_TIMESTAMP": (True, "timestamptz"),
}


#: statements whose macros are rewritten: not DDL (a column DEFAULT now() must stay a function)
REWRITE_IN = frozenset(("INSERT", "UPDATE", "DELETE", "MERGE", "WITH", "SELECT", "VALUES"))


def macro_literal(kind: str, at: datetime, precision: str | None = None) -> str:
    at = at.astimezone(UTC)
    if kind == "date":
        return f"'{at.date().isoformat()}'::date"
    if kind == "timestamp":
        typ = "timestamp" + (f"({precision})" if precision else "")
        return f"'{at.replace(tzinfo=None).isoformat(sep=' ')}'::{typ}"
    typ = "timestamptz" + (f"({precision})" if precision else "")
    return f"'{at.isoformat(sep=' ')}'::{typ}"


def rewrite_macros(sql: str, at: datetime) -> tuple[str, int]:
    """`sql` with NOW(), CURRENT_TIMESTAMP[(p)], LOCALTIMESTAMP[(p)], CURRENT_DATE,
    TRANSACTION_TIMESTAMP() and STATEMENT_TIMESTAMP() replaced by literals of the instant `at`
    (timestamps at UTC, so the value does not depend on a session's TimeZone) in INSERT, UPDATE,
    DELETE, MERGE, WITH, SELECT and VALUES statements (not in DDL: a column DEFAULT now() stays);
    returns the new text and the number of replacements. Literals, quoted identifiers and comments
    are untouched."""
    toks = list(tokens(sql))
    edits: list[tuple[int, int, str]] = []
    i, first = 0, None
    while i < len(toks):
        t = toks[i]
        prev = toks[i - 1] if i else None
        if t.kind == "punct" and t.text == ";":
            first, i = None, i + 1
            continue
        if first is None and not (t.kind == "punct" and t.text == "("):
            first = t.text
        spec = MACROS.get(t.text) if t.kind == "word" else None
        if (
            spec is None or first not in REWRITE_IN or (prev is not None and prev.text == ".")
        ):  # a column like t.now is no macro
            i += 1
            continue
        call, typ = spec
        nxt = toks[i + 1 : i + 4]
        if call:
            if len(nxt) >= 2 and nxt[0].text == "(" and nxt[1].text == ")":
                edits.append((t.start, nxt[1].end, macro_literal(typ, at)))
                i += 3
                continue
            i += 1
            continue
        if len(nxt) >= 3 and nxt[0].text == "(" and nxt[1].kind == "number" and nxt[2].text == ")" and typ != "date":
            edits.append((t.start, nxt[2].end, macro_literal(typ, at, nxt[1].text)))
            i += 4
            continue
        edits.append((t.start, t.end, macro_literal(typ, at)))
        i += 1
    for start, end, text in reversed(edits):
        sql = sql[:start] + text + sql[end:]
    return sql, len(edits)


def has_macros(sql: str) -> bool:
    return rewrite_macros(sql, datetime.now(UTC))[1] > 0
