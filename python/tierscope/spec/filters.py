"""Sweep filters: a tiny safe expression language over a point's resolved keys."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from .paths import get_path

# --- sweep filters: a tiny safe expression language --------------------------------------------

_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Name, ast.Load,
    ast.Attribute, ast.Constant, ast.List, ast.Tuple, ast.BinOp, ast.Add, ast.Sub, ast.Mult,
    ast.Div, ast.Mod,
)  # fmt: skip


_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip


def compile_filter(expr: str) -> ast.Expression:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not a valid expression: {expr!r} ({err.msg})") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ValueError(
                f"{expr!r}: {type(node).__name__} is not allowed (use comparisons, and/or/not, "
                "in, arithmetic, names such as users or workload.users)"
            )
    return tree


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def eval_filter(tree: ast.AST, names: dict[str, Any], raw: dict[str, Any], expr: str) -> Any:
    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Name, ast.Attribute)):
            key = _dotted(node)
            if key in names:
                return names[key]
            try:
                return get_path(raw, key or "")
            except KeyError:
                raise ValueError(
                    f"{expr!r}: unknown name {key!r} (use a spec key such as workload.users, or "
                    f"one of: {', '.join(sorted(names))})"
                ) from None
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BoolOp):
            vals = [ev(v) for v in node.values]
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return (not v) if isinstance(node.op, ast.Not) else -v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops: dict[type[ast.operator], Callable[[], Any]] = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.Div: lambda: a / b, ast.Mod: lambda: a % b}  # fmt: skip
            return ops[type(node.op)]()
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = ev(comp)
                ok = _COMPARE[type(op)](left, right)
                if not ok:
                    return False
                left = right
            return True
        raise ValueError(f"{expr!r}: {type(node).__name__} is not allowed")

    return ev(tree)
