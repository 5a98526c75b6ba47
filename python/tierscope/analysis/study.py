"""A study's finding across its configurations, in words, and whether the finding the study states
(its claim, in presets/studies.toml) holds (issue 22, item 2).

A study compares configurations: the points of one sweep that differ in something other than the
workload level. Two things here:

* **Labels by what differs** (`configuration_labels`): a configuration is named by the spec fields
  whose values differ between the study's configurations, in words ("db memory 150 MiB",
  "neighbour burstiness 400", "1W/2A/1C/2L, middleware policy aware"), not by its topology string
  with every swept value appended ("1W/1A/0/1D-P node_types.D.memory=150MiB", cut off in a table).
* **The finding** (`Finding`): one sentence computed from the per-configuration figures
  (`figures_of`, from an `Analysis`), and `holds` (True, False, or None with the reason when the
  figures cannot decide or the study states nothing to check). The claim's kinds:

  - ``bottleneck``: the primary bottleneck of each configuration (the resource most often above
    95 % at its maximum throughput, else at the first higher level with one); ``expect`` maps a
    swept value (or "*": every configuration) to "<tier>" or "<tier> <resource>" ("db disk") or
    "none";
  - ``ratio``: a response-time statistic of the last configuration over the first's, at the same
    mean CPU of ``host``: holds when the ratio reaches ``min_ratio`` and the host's mean CPU
    differs by at most ``same_cpu`` (relative);
  - ``compare``: ``field``'s value ``better`` against ``than`` on a response-time statistic, in
    every group of the other differing fields (``at``: only those groups' values are claimed);
  - ``busiest``: the busiest resource of each configuration (highest mean utilisation over its
    hosts at the level the bottleneck is looked for, saturated or not); ``expect`` as for
    ``bottleneck`` ("db disk"), for a resource that is busiest without being above 95 % for most
    of the time (seed 000 §4's disks);
  - ``verdict``: the fine-grained verdict's kind (and tiers) at the analysed point;
  - ``loss``: the log service's modes, the share of records each lost (``min_loss``/``max_loss``).

Everything but `figures_of` works on plain values, so the tests feed it synthetic figures.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tierscope.analysis.whitebox import hardware_first, resource_of
from tierscope.spec import parse_notation
from tierscope.tiers import TIERS, tier_of_host

CLAIM_KINDS = ("bottleneck", "busiest", "ratio", "compare", "verdict", "loss")

#: response-time statistics a claim may name (columns of the load curve)
STATISTICS = {"rt_mean": "mean response time", "rt_p50": "median response time", "rt_p90": "p90 response time"}


@dataclass(frozen=True)
class Finding:
    """What a study found across its configurations: `text` in words, `holds` (True/False, None
    when undecided or nothing is claimed), `why` (what decided it, or why it could not be decided),
    `figures` (one dict per configuration: the numbers the text rests on)."""

    text: str
    holds: bool | None
    why: str
    claim: str = ""
    figures: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        figures = [{k: v for k, v in f.items() if k != "parts"} for f in self.figures]
        return {"text": self.text, "holds": self.holds, "why": self.why, "claim": self.claim, "figures": figures}

    def line(self) -> str:
        """The one line the terminal prints after "Finding:"."""
        verdict = {True: "holds", False: "does not hold", None: "cannot be decided"}[self.holds]
        if not self.claim and self.holds is None:
            return f"{self.text} ({self.why})" if self.why else self.text
        return f"{self.text}. The study's finding {verdict}: {self.why}"


# --- labels ------------------------------------------------------------------------------------

_WORDS = {"cpu": "CPU", "iops": "IOPS", "mw": "middleware", "noisy_neighbour": "neighbour", "rt": "response time"}
_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|[kmgt]b?|ms|s|us|ns)$")


def _words(name: str) -> str:
    if name in _WORDS:
        return _WORDS[name]
    return " ".join(_WORDS.get(w, w) for w in name.split("_")).strip()


def _tiers_of_type(letter: str, topology: Any) -> list[str]:
    """The tiers whose servers are of node type `letter` in `topology` (notation string)."""

    if not isinstance(topology, str):
        return []
    try:
        parsed = parse_notation(topology)
    except ValueError:
        return []
    return [t for t in TIERS if parsed[t]["count"] and parsed[t]["node_type"] == letter]


def field_words(key: str, topology: Any = None) -> str:
    """A spec field in words: "node_types.D.memory" -> "db memory" (the tier whose servers are of
    type D in `topology`), "soft.middleware.policy" -> "middleware policy",
    "interference.noisy_neighbour.0.burstiness" -> "neighbour burstiness", "topology" -> ""."""
    parts = key.split(".")
    if key == "topology":
        return ""
    if parts[0] == "node_types" and len(parts) >= 3:
        tiers = _tiers_of_type(parts[1], topology)
        who = "/".join(tiers) if tiers else f"node type {parts[1]}"
        return f"{who} {_words('_'.join(parts[2:]))}"
    if parts[0] == "soft" and len(parts) >= 3:
        return f"{_words(parts[1])} {_words('_'.join(parts[2:]))}"
    if parts[0] == "interference" and len(parts) >= 2:
        rest = [p for p in parts[2:] if not p.isdigit()]
        return " ".join([_words(parts[1])] + [_words(p) for p in rest])
    if parts[0] == "workload" and len(parts) >= 2:
        return _words(parts[-1])
    return " ".join(_words(p) for p in parts[-2:] if not p.isdigit())


def value_words(value: Any) -> str:
    """A field's value in words: "150MiB" -> "150 MiB", True -> "on", 0.25 -> "0.25"."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        m = _SIZE.match(value.strip())
        return f"{m[1]} {m[2]}" if m else value
    if isinstance(value, list | tuple):
        return "/".join(value_words(v) for v in value)
    return str(value)


def differing_fields(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The fields whose values are not the same in every configuration (a field one lacks counts
    as differing), in the order of first appearance."""
    keys: list[str] = []
    for c in configs:
        keys += [k for k in c if k not in keys]
    missing = object()
    return [k for k in keys if len({repr(c.get(k, missing)) for c in configs}) > 1]


def label_parts(configs: Sequence[Mapping[str, Any]]) -> list[list[tuple[str, str]]]:
    """Per configuration, (field in words, value in words) of every field that differs."""
    fields = differing_fields(configs)
    return [[(field_words(k, c.get("topology")), value_words(c.get(k, "-"))) for k in fields] for c in configs]


def configuration_labels(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each configuration named by the spec fields that differ between `configs` (each a mapping
    of dotted spec field -> value, the topology under "topology"): "db memory 150 MiB",
    "1W/2A/1C/2L, middleware policy aware". With nothing differing: the topology (or "this
    system") for one configuration, "configuration N" for several alike."""
    parts = label_parts(configs)
    if not any(parts):
        if len(configs) == 1:
            topology = configs[0].get("topology")
            return [str(topology) if topology else "this system"]
        return [f"configuration {i + 1}" for i in range(len(configs))]
    return [", ".join(f"{name} {value}".strip() for name, value in p) for p in parts]


def label_of(data: Any, config: str) -> str:
    """A configuration's label in an `Analysis` (its `labels`), else the configuration itself."""
    return str((getattr(data, "labels", None) or {}).get(config, config))


def short_labels(labels: Sequence[str], parts: Sequence[Sequence[tuple[str, str]]]) -> list[str]:
    """For a sentence: the first label whole, the others without the field names when every
    configuration differs in the same one field ("db memory 150 MiB", "1 GiB")."""
    if len(parts) > 1 and all(len(p) == 1 for p in parts) and len({p[0][0] for p in parts}) == 1:
        return [labels[0]] + [p[0][1] for p in parts[1:]]
    return list(labels)


# --- claims ------------------------------------------------------------------------------------


def check_claim(claim: Mapping[str, Any], where: str) -> None:
    """ValueError naming `where` and the key when `claim` (a studies.toml [NAME.claim]) is wrong."""
    kind = claim.get("kind")
    if kind not in CLAIM_KINDS:
        raise ValueError(f"{where}: kind: expected one of {', '.join(CLAIM_KINDS)}, got {kind!r}")
    allowed = {
        "bottleneck": {"expect"},
        "busiest": {"expect"},
        "ratio": {"statistic", "min_ratio", "host", "same_cpu"},
        "compare": {"field", "better", "than", "statistic", "at"},
        "verdict": {"expect", "tiers"},
        "loss": {"min_loss", "max_loss"},
    }[kind] | {"kind"}
    extra = set(claim) - allowed
    if extra:
        raise ValueError(f"{where}: {sorted(extra)[0]}: unknown key for kind {kind} ({', '.join(sorted(allowed))})")
    if kind in ("bottleneck", "busiest") and not isinstance(claim.get("expect"), Mapping):
        raise ValueError(f"{where}: expect: a table of swept value -> bottleneck ('db disk', 'app', 'none')")
    if kind in ("ratio", "compare") and claim.get("statistic", "rt_mean") not in STATISTICS:
        raise ValueError(f"{where}: statistic: expected one of {', '.join(STATISTICS)}")
    if kind == "ratio" and not isinstance(claim.get("min_ratio"), int | float):
        raise ValueError(f"{where}: min_ratio: expected a number")
    if kind == "compare" and not all(isinstance(claim.get(k), str) for k in ("field", "better", "than")):
        raise ValueError(f"{where}: field, better, than: expected strings")
    if kind == "verdict" and not isinstance(claim.get("expect"), str):
        raise ValueError(f"{where}: expect: the verdict's kind (alternating, single, ...)")


def _matches(expected: str, bottleneck: Mapping[str, Any] | None) -> bool:
    """Does the bottleneck {"tier", "resource", ...} (None: no saturated resource) match "db",
    "db disk", "db CPU" (also the CPU quota) or "none"?"""
    words = expected.split(maxsplit=1)
    if not words or words[0] == "none":
        return bottleneck is None
    if bottleneck is None or bottleneck.get("tier") != words[0]:
        return False
    return len(words) == 1 or str(bottleneck.get("resource", "")).lower().startswith(words[1].lower())


def _values(fig: Mapping[str, Any]) -> list[str]:
    return [str(v) for v in (fig.get("params") or {}).values()]


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def bound_words(fig: Mapping[str, Any]) -> str:
    """In words: "disk-bound (db1 disk above 95 % in 71 % of the samples at 400 users)" or "no saturated resource
    (busiest: db1 CPU, mean 62 %)"."""
    b = fig.get("bottleneck")
    if b:
        resource = "CPU" if str(b["resource"]).startswith("CPU") else str(b["resource"])
        users = f" at {fig['users']:g} users" if fig.get("users") is not None else ""
        return f"{resource}-bound ({b['host']} {resource} above 95 % in {_pct(b['share'])} of the samples{users})"
    busiest = fig.get("busiest")
    if busiest:
        return f"no saturated resource (busiest: {busiest['host']} {busiest['resource']}, mean {busiest['mean']:.0f} %)"
    return "no resource measured"


def bottleneck_finding(figures: Sequence[Mapping[str, Any]], expect: Mapping[str, str] | None) -> Finding:
    """Each configuration's primary bottleneck, and whether it is the one `expect` names for it
    (swept value -> "db disk"/"app"/"none"; "*" for every configuration). `figures`: per
    configuration "label", "params", "bottleneck" ({"host", "tier", "resource", "share"} or None),
    "busiest", "users", "max_throughput"."""
    figs = [dict(f) for f in figures]
    if not figs:
        return Finding("no configuration has results", None, "nothing measured")
    labels = [str(f["label"]) for f in figs]
    names = short_labels(labels, [f.get("parts") or [] for f in figs])
    many = len(figs) > 1
    text = "; ".join(
        (f"{n}: " if many else "")
        + bound_words(f)
        + (f", max {f['max_throughput']:.0f} req/s" if f.get("max_throughput") is not None else "")
        for n, f in zip(names, figs)
    )
    if not expect:
        return Finding(text, None, "the study states no bottleneck to check", figures=figs)

    def found(expected: str, f: Mapping[str, Any]) -> bool | None:
        return _matches(expected, f.get("bottleneck")) if f.get("measured", True) else None

    return _expected_where_claimed(text, figs, labels, expect, found, bound_words)


def _expected_where_claimed(
    text: str,
    figs: list[dict[str, Any]],
    labels: list[str],
    expect: Mapping[str, str],
    found: Callable[[str, Mapping[str, Any]], bool | None],
    words: Callable[[Mapping[str, Any]], str],
    claim_prefix: str = "",
) -> Finding:
    """`expect` (swept value, or "*" for every configuration -> what is expected) checked against
    each configuration it names: `found` says whether its figures are the expected ones (None: not
    measured), `words` what they are instead."""
    many = len(figs) > 1
    checked, wrong, unmeasured = [], [], []
    for key, expected in expect.items():
        mine = [(lab, f) for lab, f in zip(labels, figs) if key == "*" or key in _values(f)]
        if not mine:
            unmeasured.append(key)
        for lab, f in mine:
            ok = found(expected, f)
            if ok is None:
                unmeasured.append(lab)
            elif ok:
                checked.append(f"{expected} at {lab}" if many else expected)
            else:
                wrong.append(f"{lab if many else 'the system'}: expected {expected}, found {words(f)}")
    claim = claim_prefix + "; ".join(f"{v} at {k}" if k != "*" else v for k, v in expect.items())
    if wrong:
        return Finding(text, False, "; ".join(wrong), claim, figs)
    if unmeasured:
        return Finding(text, None, f"no result for {', '.join(unmeasured)}", claim, figs)
    return Finding(text, True, ", ".join(checked), claim, figs)


def busiest_finding(figures: Sequence[Mapping[str, Any]], expect: Mapping[str, str]) -> Finding:
    """Each configuration's busiest resource ("busiest": {"host", "resource", "mean"}), and whether
    it is the one `expect` names for it (swept value -> "db disk"/"app CPU"; "*" for every
    configuration), saturated or not."""
    figs = [dict(f) for f in figures]
    if not figs:
        return Finding("no configuration has results", None, "nothing measured")
    labels = [str(f["label"]) for f in figs]
    names = short_labels(labels, [f.get("parts") or [] for f in figs])
    many = len(figs) > 1

    def words(f: Mapping[str, Any]) -> str:
        b = f.get("busiest")
        return f"busiest {b['host']} {b['resource']}, mean {b['mean']:.0f} %" if b else "no resource measured"

    text = "; ".join((f"{n}: " if many else "") + words(f) for n, f in zip(names, figs))

    def found(expected: str, f: Mapping[str, Any]) -> bool | None:
        b = f.get("busiest")
        if not f.get("measured", True) or not b:
            return None
        return expected.split()[0] != "none" and _matches(expected, {**b, "tier": tier_of_host(str(b["host"]))})

    return _expected_where_claimed(text, figs, labels, expect, found, words, "busiest: ")


def ratio_finding(
    figures: Sequence[Mapping[str, Any]],
    min_ratio: float,
    statistic: str = "rt_mean",
    host: str | None = None,
    same_cpu: float = 0.15,
) -> Finding:
    """The last configuration's `statistic` (seconds) over the first's; holds when it reaches
    `min_ratio` with `host`'s mean CPU (figures' "cpu": host -> mean % of its allowance) the same
    within `same_cpu` (relative)."""
    figs = [dict(f) for f in figures]
    what = STATISTICS.get(statistic, statistic)
    claim = f"{what} at least {min_ratio:g}x higher" + (f" at the same mean {host} CPU" if host else "")
    if len(figs) < 2:
        return Finding(f"{len(figs)} configuration(s) measured", None, "a ratio needs two", claim, figs)
    first, last = figs[0], figs[-1]
    a, b = first.get(statistic), last.get(statistic)
    if not a or b is None:
        return Finding(f"no {what} measured", None, f"{what} missing", claim, figs)
    ratio = b / a
    # "with neighbour burstiness 400 than with 1" when the two differ in one field
    than = short_labels([str(last["label"]), str(first["label"])], [last.get("parts") or [], first.get("parts") or []])
    text = (
        f"{what} {ratio:.1f}x {'higher' if ratio >= 1 else 'as high'} with {than[0]} than with "
        f"{than[1]} ({1e3 * b:.0f} ms against {1e3 * a:.0f} ms)"
    )
    cpu_a = (first.get("cpu") or {}).get(host) if host else None
    cpu_b = (last.get("cpu") or {}).get(host) if host else None
    if host and cpu_a is not None and cpu_b is not None:
        text += f" at {host} CPU {cpu_b:.0f} % against {cpu_a:.0f} % of its allowance"
    if host and (cpu_a is None or cpu_b is None):
        return Finding(text, None, f"{host}'s CPU not measured: the same mean cannot be checked", claim, figs)
    if host and cpu_a and abs(cpu_b / cpu_a - 1) > same_cpu:
        why = f"{host}'s mean CPU differs by {_pct(abs(cpu_b / cpu_a - 1))} (more than {_pct(same_cpu)})"
        return Finding(text, False, why, claim, figs)
    if ratio >= min_ratio:
        return Finding(text, True, f"{ratio:.1f}x >= {min_ratio:g}x", claim, figs)
    return Finding(text, False, f"{ratio:.1f}x < {min_ratio:g}x", claim, figs)


def compare_finding(
    figures: Sequence[Mapping[str, Any]],
    field_key: str,
    better: str,
    than: str,
    statistic: str = "rt_p90",
    at: Sequence[str] | None = None,
) -> Finding:
    """`field_key`'s value `better` against `than` on `statistic` (lower is better), in each group
    of configurations alike in every other field; holds when `better` is lower in every group
    (or in the groups one of whose values is in `at`)."""
    figs = [dict(f) for f in figures]
    what = STATISTICS.get(statistic, statistic)
    groups: dict[str, dict[str, Mapping[str, Any]]] = {}
    for f in figs:
        params = dict(f.get("params") or {})
        value = str(params.pop(field_key, ""))
        rest = ", ".join(value_words(v) for v in params.values()) or "all"
        groups.setdefault(rest, {})[value] = f
    claim = f"{better} has a lower {what} than {than}" + (f" at {', '.join(at)}" if at else "")
    parts: list[str] = []
    wrong: list[str] = []
    right: list[str] = []
    missing: list[str] = []
    for rest, by_value in groups.items():
        fb, ft = by_value.get(better), by_value.get(than)
        b = fb.get(statistic) if fb else None
        t = ft.get(statistic) if ft else None
        claimed = not at or any(value_words(a) in rest.split(", ") for a in at)
        if b is None or t is None or not t:
            parts.append(f"{rest}: not measured")
            if claimed:
                missing.append(rest)
            continue
        parts.append(f"{rest}: {better} {1e3 * b:.0f} ms, {than} {1e3 * t:.0f} ms ({b / t:.2f}x)")
        if claimed:
            (right if b < t else wrong).append(f"{rest} ({b / t:.2f}x)")
    text = f"{what}: " + "; ".join(parts)
    if wrong:
        return Finding(text, False, f"{better} not lower at {', '.join(wrong)}", claim, figs)
    if missing or not right:
        return Finding(text, None, f"not measured at {', '.join(missing) or 'any claimed configuration'}", claim, figs)
    return Finding(text, True, f"{better} lower at {', '.join(right)}", claim, figs)


def verdict_finding(verdict: Any, expect: str, tiers: Sequence[str] | None = None, where: str = "") -> Finding:
    """The fine-grained verdict (kind, tiers, text) against the kind (and tiers) claimed."""
    claim = expect + (f" between {' and '.join(tiers)}" if tiers else "")
    if verdict is None or getattr(verdict, "kind", None) in (None, "insufficient"):
        return Finding("no fine-grained verdict", None, "no traced point to analyse (capture off?)", claim)
    text = str(verdict.text) + (f" ({where})" if where else "")
    found_tiers = sorted(verdict.tiers)
    fig = [{"kind": verdict.kind, "tiers": found_tiers, "confidence": round(float(verdict.confidence), 3)}]
    if verdict.kind != expect or (tiers and not set(tiers) <= set(found_tiers)):
        return Finding(text, False, f"expected {claim}, found {verdict.kind} {', '.join(found_tiers)}", claim, fig)
    return Finding(text, True, f"{verdict.kind} between {' and '.join(found_tiers)}", claim, fig)


def loss_finding(
    text: str,
    results: Sequence[Mapping[str, Any]],
    min_loss: Mapping[str, float] | None = None,
    max_loss: Mapping[str, float] | None = None,
) -> Finding:
    """The log service's modes ({"mode", "sent", "lost"}: lost None when unknown): holds when every
    mode in `min_loss` lost at least, and every one in `max_loss` at most, that share."""
    by_mode = {str(r["mode"]): r for r in results}
    figs = [
        {"mode": m, "sent": r.get("sent"), "lost": r.get("lost"), "lost_share": _share(r)} for m, r in by_mode.items()
    ]
    bounds = [(m, x, True) for m, x in (min_loss or {}).items()] + [(m, x, False) for m, x in (max_loss or {}).items()]
    claim = "; ".join(f"{m} loses {'more than' if low else 'at most'} {_pct(x)}" for m, x, low in bounds)
    if not bounds:
        return Finding(text, None, "the study states no loss to check", claim, figs)
    right, wrong, unknown = [], [], []
    for mode, x, low in bounds:
        share = _share(by_mode.get(mode) or {})
        if share is None:
            unknown.append(mode)
        elif (share > x) if low else (share <= x):
            right.append(f"{mode} {100 * share:.1f} %")
        else:
            wrong.append(f"{mode} lost {100 * share:.1f} % ({'not more than' if low else 'more than'} {_pct(x)})")
    if wrong:
        return Finding(text, False, "; ".join(wrong), claim, figs)
    if unknown:
        return Finding(text, None, f"loss unknown for {', '.join(unknown)}", claim, figs)
    return Finding(text, True, ", ".join(right), claim, figs)


def _share(r: Mapping[str, Any]) -> float | None:
    lost, sent = r.get("lost"), r.get("sent")
    if lost is None or not sent:
        return None
    return float(lost) / float(sent)


# --- figures of an analysis --------------------------------------------------------------------


def _bottleneck_at(rows: Sequence[Mapping[str, Any]], users: float, min_share: float) -> dict[str, Any] | None:

    level = [r for r in rows if r["users"] == users and tier_of_host(str(r["host"])) != "client"]
    # a software limit only when no hardware resource is saturated (seed 004 §5)
    kept = hardware_first({(r["host"], r["metric"]): r["share_above"] for r in level}, min_share)
    level = [r for r in level if (r["host"], r["metric"]) in kept]
    # a utilisation before the time its CPU quota bites, as the summary does
    best = max(
        level,
        key=lambda r: (r["share_above"], r["metric"] != "cpu_quota", r["mean"] or 0.0),
        default=None,
    )
    if best is None or best["share_above"] < min_share:
        return None
    return {
        "host": best["host"],
        "tier": tier_of_host(str(best["host"])),
        "resource": resource_of(str(best["metric"])),
        "share": round(float(best["share_above"]), 3),
    }


def figures_of(data: Any, min_share: float = 0.5) -> list[dict[str, Any]]:
    """Per configuration of an `Analysis`, in the study's order: its label, the fields that differ
    between the configurations (`params`, the topology among them when it is swept), maximum
    throughput, primary bottleneck (at the maximum throughput, else at the first higher level with
    one), busiest resource, every host's mean CPU and the response times at its highest level."""

    configs: dict[str, dict[str, Any]] = dict(getattr(data, "configurations", {}) or {})
    for c in data.blackbox:
        configs.setdefault(c, {})
    labels, parts = _labels(configs)
    differ = differing_fields(list(configs.values()))
    out = []
    for config, params in configs.items():
        bb, wb = data.blackbox.get(config), data.whitebox.get(config)
        fig: dict[str, Any] = {
            "config": config,
            "label": labels[config],
            "parts": parts[config],
            "params": {k: v for k, v in params.items() if k in differ},
            "measured": bb is not None,
        }
        if bb is not None:
            fig["max_throughput"] = round(float(bb.max_throughput), 2)
            fig["max_throughput_users"] = bb.max_throughput_users
            curve = bb.curve.to_pylist()
            if curve:
                top = max(curve, key=lambda r: r["users"])
                for k in STATISTICS:
                    v = top.get(k)
                    fig[k] = round(float(v), 6) if v is not None and v == v else None
                fig["rt_users"] = top["users"]
        rows = wb.shares.to_pylist() if wb is not None else []
        if rows and bb is not None:
            users = bb.max_throughput_users
            found = _bottleneck_at(rows, users, min_share)
            if found is None:  # throughput fell past its maximum (thrashing): the first level with one
                for u in sorted({r["users"] for r in rows if r["users"] > users}):
                    found = _bottleneck_at(rows, u, min_share)
                    if found is not None:
                        users = u
                        break
            fig["users"], fig["bottleneck"] = users, found
            at = [r for r in rows if r["users"] == users and tier_of_host(str(r["host"])) != "client"]
            busiest = max((r for r in at if r["metric"] != "cpu_quota"), key=lambda r: r["mean"] or 0.0, default=None)
            if busiest is not None:
                fig["busiest"] = {
                    "host": busiest["host"],
                    "resource": resource_of(str(busiest["metric"])),
                    "mean": round(float(busiest["mean"]), 1),
                }
            fig["cpu"] = {str(r["host"]): round(float(r["mean"]), 1) for r in at if r["metric"] == "cpu_util"}
        out.append(fig)
    return out


def _labels(configs: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, str], dict[str, list[tuple[str, str]]]]:
    names = list(configs)
    values = [dict(configs[n]) or {"configuration": n} for n in names]
    labels = configuration_labels(values)
    parts = label_parts(values)
    return dict(zip(names, labels)), dict(zip(names, parts))


def study_finding(data: Any, claim: Mapping[str, Any] | None) -> Finding:
    """The finding of a run's `Analysis` against the study's `claim` (None: a spec that is not a
    shipped study; its configurations' bottlenecks are stated, nothing is checked)."""
    figs = figures_of(data)
    kind = (claim or {}).get("kind", "bottleneck")
    if kind == "ratio":
        assert claim is not None
        return ratio_finding(
            figs,
            float(claim["min_ratio"]),
            claim.get("statistic", "rt_mean"),
            claim.get("host"),
            float(claim.get("same_cpu", 0.15)),
        )
    if kind == "compare":
        assert claim is not None
        return compare_finding(
            figs, claim["field"], claim["better"], claim["than"], claim.get("statistic", "rt_p90"), claim.get("at")
        )
    if kind == "busiest":
        assert claim is not None
        return busiest_finding(figs, claim["expect"])
    if kind == "verdict":
        assert claim is not None
        fine = getattr(data, "fine", None)
        where = getattr(data, "fine_point", None) or ""
        return verdict_finding(getattr(fine, "verdict", None), claim["expect"], claim.get("tiers"), where)
    found = bottleneck_finding(figs, (claim or {}).get("expect"))
    if claim is None:
        return Finding(found.text, None, "no stated finding to check: not a shipped study", "", found.figures)
    return found


def scaling_finding(rows: Sequence[Mapping[str, Any]]) -> Finding:
    """Seed 002's scaling study (`tierscope oltp scale`): per target and workload, the throughput
    per node from the fewest nodes to the most ("galera ycsb-b 812 -> 301 ops/s per node over 1-3
    nodes (0.37x)"), and for Galera the cluster's CPU time per operation (what nodes on hosts of
    their own would turn into throughput per node). The catalog states figures, not a direction:
    nothing is checked (on one machine the nodes share its cores)."""
    series: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        series.setdefault((str(r["target"]), str(r["workload"])), []).append(r)
    parts, figs = [], []
    for (target, workload), rs in series.items():
        rs = sorted(rs, key=lambda r: int(r["nodes"]))
        a, b = rs[0], rs[-1]
        pa_, pb = float(a["throughput_per_node"]), float(b["throughput_per_node"])
        figs.append(
            {
                "target": target,
                "workload": workload,
                "metric": a.get("metric"),
                "per_node": {int(r["nodes"]): r["throughput_per_node"] for r in rs},
            }
        )
        if len(rs) == 1:
            parts.append(f"{target} {workload} {pa_:g} {a.get('metric', '')} per node at {a['nodes']} node(s)")
            continue
        ratio = f" ({pb / pa_:.2f}x)" if pa_ else ""
        part = f"{target} {workload} {pa_:g} -> {pb:g} {a.get('metric', '')} per node over {a['nodes']}-{b['nodes']} nodes{ratio}"
        ca, cb = a.get("db_cpu_us_per_op"), b.get("db_cpu_us_per_op")
        if ca and cb:
            figs[-1]["db_cpu_us_per_op"] = {int(r["nodes"]): r.get("db_cpu_us_per_op") for r in rs}
            part += (
                f", the cluster's CPU per operation {float(ca):g} -> {float(cb):g} us ({float(cb) / float(ca):.2f}x)"
            )
        parts.append(part)
    if not parts:
        return Finding("no result", None, "nothing measured")
    return Finding("; ".join(parts), None, "the study states figures, no claim to check", figures=figs)
