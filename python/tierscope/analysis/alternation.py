"""Alternation between tiers: load correlations, one-without-the-other shares, switches, the verdict.

Inputs are per-tier series on one common window axis (a tier's load is the sum over its servers;
a tier is saturated in a window when at least half of its servers are). Rules (docs/analysis.md):

* A tier *takes part* when it is saturated in at least `min_share` (2 %) of the windows and in at
  least a tenth of the share of the most saturated tier.
* No tier takes part → "none": no saturated tier.
* One tier → "single": single bottleneck at X.
* A participant A that calls a participant B (parent/child links) and is saturated mostly
  (>= 2/3 of its saturated windows) while B is, with B saturated at least 0.9 times as often, is dropped:
  its saturation is B's queue amplified upstream (Wang et al., Lightning in the Cloud).
* Two or more: they *alternate* when they are rarely saturated together — the windows where both
  are saturated are fewer than `together_max` (1/3) of the smaller tier's saturated windows —
  for the two leading tiers; then "alternating" between them (plus any other participant that
  also alternates with the leader). Otherwise "several": several saturated at once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import pyarrow as pa

from tierscope.contracts import DEFAULT_WINDOW_NS

MIN_SHARE = 0.02
RELATIVE_SHARE = 0.1
TOGETHER_MAX = 1 / 3
INHERITED = 2 / 3
CALLEE_SHARE = 0.9  # rule 2: the callee saturated at least this share as often as the caller
FULL_CONFIDENCE_WINDOWS = 200  # 10 s of 50 ms windows
MIN_WINDOWS = 40  # fewer windows than this (2 s of 50 ms): "not enough data", no verdict
#: confidence factor of a verdict naming a tier whose N* was estimated this well (NStar.confidence)
N_STAR_WEIGHT = {"high": 1.0, "medium": 0.85, "low": 0.6}
#: confidence of "no saturated tier" when some server held a queue that no N* explains
UNEXPLAINED_NONE = 0.4
#: confidence cap of any verdict while such a server exists (it may be saturated unseen)
UNEXPLAINED_ANY = 0.6
#: confidence of "no saturated tier" when servers without N* held more than one request often
UNCERTAIN_NONE = 0.6
#: confidence cap of any other verdict while such servers exist
UNCERTAIN_ANY = 0.75
#: confidence cap of a verdict that partial inheritance changed (rule 2, `partial`)
PARTIAL_CAP = 0.6
#: a tier saturated in at least this share of the share needed to take part is near it...
NEAR = 0.5
#: ...and caps the verdict's confidence: a small error in its share would change the verdict
NEAR_CAP = 0.75
#: confidence cap of a verdict that dropped a caller as inherited (rule 2) from a callee seen only
#: through that caller's own stamps (CLIENT spans): the callee's times include the caller's delays
BLIND_CAP = 0.45
#: confidence cap of a verdict that dropped a tier as inherited (rule 2): the caller's own
#: saturation, if any, hides inside the callee's windows
INHERITED_CAP = 0.75


@dataclass(frozen=True)
class Verdict:
    """Where the bottleneck is, in plain words."""

    kind: str  # "single", "alternating", "none", "several", "insufficient" (not enough data)
    tiers: list[str]
    text: str  # e.g. "single bottleneck at db", "bottleneck alternating between app and db"
    confidence: float  # 0..1
    evidence: str  # the numbers behind it


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation; NaN when either series is constant."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.size < 2 or np.std(a) == 0 or np.std(b) == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])


def pair_table(
    tiers: list[str],
    load_inclusive: dict[str, np.ndarray],
    load_exclusive: dict[str, np.ndarray],
    saturated: dict[str, np.ndarray],
) -> pa.Table:
    """For every pair of tiers: load correlations and the shares of windows one is saturated alone."""
    rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "tier_a",
            "tier_b",
            "corr_inclusive",
            "corr_exclusive",
            "a_without_b_share",
            "b_without_a_share",
            "both_share",
        )
    }
    for a, b in combinations(tiers, 2):
        sa, sb = saturated[a], saturated[b]
        n = max(sa.size, 1)
        rows["tier_a"].append(a)
        rows["tier_b"].append(b)
        rows["corr_inclusive"].append(pearson(load_inclusive[a], load_inclusive[b]))
        rows["corr_exclusive"].append(pearson(load_exclusive[a], load_exclusive[b]))
        rows["a_without_b_share"].append(float((sa & ~sb).sum() / n))
        rows["b_without_a_share"].append(float((sb & ~sa).sum() / n))
        rows["both_share"].append(float((sa & sb).sum() / n))
    return pa.table(
        {
            "tier_a": pa.array(rows["tier_a"], pa.string()),
            "tier_b": pa.array(rows["tier_b"], pa.string()),
            "corr_inclusive": pa.array(rows["corr_inclusive"], pa.float64()),
            "corr_exclusive": pa.array(rows["corr_exclusive"], pa.float64()),
            "a_without_b_share": pa.array(rows["a_without_b_share"], pa.float64()),
            "b_without_a_share": pa.array(rows["b_without_a_share"], pa.float64()),
            "both_share": pa.array(rows["both_share"], pa.float64()),
        }
    )


def switches_per_second(tiers: list[str], saturated: dict[str, np.ndarray], window_ns: int) -> float:
    """How often the saturated tier changes: over the windows where exactly one tier is saturated,
    in time order, the number of changes of that tier, per second of the whole series."""
    if not tiers:
        return 0.0
    stack = np.vstack([saturated[t] for t in tiers])
    n_windows = stack.shape[1]
    if n_windows == 0:
        return 0.0
    alone = stack.sum(0) == 1
    who = np.argmax(stack[:, alone], axis=0)
    changes = int((who[1:] != who[:-1]).sum()) if who.size > 1 else 0
    return float(changes / (n_windows * window_ns / 1e9))


def data_weight(n_windows: int) -> float:
    """Confidence scale for the amount of data: full from FULL_CONFIDENCE_WINDOWS windows on."""
    return min(1.0, n_windows / FULL_CONFIDENCE_WINDOWS)


def verdict(tiers: list[str], saturated: dict[str, np.ndarray], switches: float, **options: Any) -> Verdict:
    """The verdict in words from per-tier saturated-window indicators (rules in the module docstring;
    options as `_verdict`). When partial inheritance (rule 2) changed the verdict, it is said with
    at most PARTIAL_CAP: the windows given to the callee may have been the caller's own too; when
    it did not, with no more confidence than the verdict without it."""
    found = _stable(_verdict(tiers, saturated, switches, **options), tiers, saturated, switches, options)
    if "windows are" not in found.evidence:
        return found
    whole = _verdict(tiers, saturated, switches, **{**options, "partial": False})
    if (whole.kind, sorted(whole.tiers)) == (found.kind, sorted(found.tiers)):
        # no surer than without the attribution (its margins, e.g. the together ratio, were thinner)
        return dataclasses.replace(found, confidence=min(found.confidence, whole.confidence))
    return dataclasses.replace(
        found,
        confidence=min(found.confidence, PARTIAL_CAP),
        evidence=found.evidence + f"; counting those windows for both tiers would say: {whole.text}",
    )


#: A verdict that the thirds of the trace do not all give is said with at most this confidence.
UNSTABLE_CAP = 0.6


def _stable(
    found: Verdict, tiers: list[str], saturated: dict[str, np.ndarray], switches: float, options: dict[str, Any]
) -> Verdict:
    """`found`, with at most UNSTABLE_CAP when one of the trace's thirds (each of at least
    MIN_WINDOWS windows) gives another verdict: the evidence does not agree across the windows."""
    n_windows = max((saturated[t].size for t in tiers), default=0)
    if found.kind not in ("single", "several", "alternating") or n_windows < 3 * MIN_WINDOWS:
        return found
    cuts = np.linspace(0, n_windows, 4).astype(int)
    own = options.get("own")
    other = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        part = _verdict(
            tiers,
            {t: saturated[t][lo:hi] for t in tiers},
            switches,
            **{**options, "own": {t: v[lo:hi] for t, v in own.items()} if own else own},
        )
        if (part.kind, sorted(part.tiers)) != (found.kind, sorted(found.tiers)):
            other.append(f"{part.text} in windows {lo}-{hi}")
    if not other:
        return found
    return capped(found, UNSTABLE_CAP, "not the same verdict in every third of the trace: " + "; ".join(other))


def capped(found: Verdict, cap: float, why: str, text: str | None = None) -> Verdict:
    """`found` said with at most `cap`, `why` added to its evidence (and its text replaced)."""
    return dataclasses.replace(
        found,
        text=found.text if text is None else text,
        confidence=min(found.confidence, cap),
        evidence=found.evidence + "; " + why,
    )


def _verdict(
    tiers: list[str],
    saturated: dict[str, np.ndarray],
    switches: float,
    *,
    min_share: float = MIN_SHARE,
    together_max: float = TOGETHER_MAX,
    window_ns: int = DEFAULT_WINDOW_NS,
    n_star_text: dict[str, str] | None = None,
    calls: set[tuple[str, str]] | None = None,
    n_star_weight: dict[str, float] | None = None,
    unexplained: list[str] | None = None,
    uncertain: list[str] | None = None,
    partial: bool = True,
    own: dict[str, np.ndarray] | None = None,
    observed_by: dict[str, str] | None = None,
) -> Verdict:
    """The verdict (see `verdict`).

    `n_star_weight` (tier -> 0..1) scales the confidence of a verdict naming that tier by how well
    its N* was estimated; `unexplained` lists servers that held a queue no N* accounts for (no
    saturation point could be estimated): "no saturated tier" is then said with low confidence.
    Rule 2 drops a caller mostly saturated inside its callee's saturation; a caller mostly
    saturated on its own (`partial`) loses just those windows: a caller's queue for connections or
    threads to a saturated callee is the callee's (a pool per process fills before the callee's
    total does, so the callee need not look full); when that changes
    the verdict, it is said with at most medium confidence. `own` (tier -> bool per window): the
    caller was slow after its last calls (`after_calls`), saturated on its own whatever its callee
    did; rule 2 leaves those windows to the caller. `uncertain` lists servers without N*
    that held more than one request for half of a window often enough to matter (were their N* 1,
    they would take part): "no saturated tier" is then said with at most medium confidence.
    `observed_by` (callee tier -> caller tier): tiers seen only through the times their one caller
    stamped (an uninstrumented database behind the app's CLIENT spans): dropping that caller as
    inherited from it leaves a verdict the trace cannot back (at most BLIND_CAP)."""
    shares = {t: float(saturated[t].mean()) if saturated[t].size else 0.0 for t in tiers}
    n_windows = max((saturated[t].size for t in tiers), default=0)
    ranked = sorted(tiers, key=lambda t: -shares[t])
    lead = shares[ranked[0]] if ranked else 0.0
    part = [t for t in ranked if shares[t] >= min_share and shares[t] >= RELATIVE_SHARE * lead]
    inherited = []
    dropped = set()
    blind: list[str] = []
    for a in list(part):
        for b in part:
            if a != b and calls and (a, b) in calls:
                held = saturated[b] if own is None or a not in own else saturated[b] & ~own[a]
                inside = float((saturated[a] & held).sum()) / max(float(saturated[a].sum()), 1.0)
                if inside >= INHERITED and shares[b] >= CALLEE_SHARE * shares[a]:
                    inherited.append(f"{a}'s saturation lies {inside:.0%} inside that of {b}, which it calls")
                    part.remove(a)
                    dropped.add(a)
                    if observed_by and observed_by.get(b) == a:
                        blind.append(
                            f"{b} is seen only through the calls {a} stamped, and {a} was saturated at the same "
                            f"time: those calls' times include {a}'s own delay in taking the replies (a busy "
                            f"event loop, a thread waiting for the GIL or a core), so the trace cannot tell "
                            f"{a}'s saturation from {b}'s; the resources of both (CPU, or {b}'s own "
                            f"traces) would"
                        )
                    break
                if partial and inside > 0:
                    # partly inherited: the windows in which the callee was saturated are
                    # the callee's; the caller keeps the rest as its own (a freeze, its own cores)
                    saturated = {**saturated, a: saturated[a] & ~held}
                    inherited.append(
                        f"{a}'s saturation lies {inside:.0%} inside that of {b}, which it calls "
                        f"(those windows are {b}'s)"
                    )
                    shares[a] = float(saturated[a].mean())
    part = [t for t in part if shares[t] >= min_share and shares[t] >= RELATIVE_SHARE * lead]
    part.sort(key=lambda t: -shares[t])
    ranked = sorted(tiers, key=lambda t: -shares[t])
    ms = window_ns / 1e6
    share_text = ", ".join(
        f"{t} {shares[t]:.1%}" + (f" ({n_star_text[t]})" if n_star_text and t in n_star_text else "") for t in ranked
    )
    evidence = f"saturated share of {n_windows} windows of {ms:g} ms: {share_text}"
    if inherited:
        evidence += "; not counted (queue amplification from downstream): " + "; ".join(inherited)
    if n_windows < MIN_WINDOWS:
        return Verdict(
            "insufficient",
            [],
            f"not enough data: {n_windows} windows of {ms:g} ms (at least {MIN_WINDOWS} needed)",
            0.0,
            evidence,
        )
    if not part:
        conf = 1.0 - (lead / min_share if min_share > 0 else 0.0) * 0.5
        if unexplained:
            conf = min(conf, UNEXPLAINED_NONE)
            evidence += (
                "; held a queue with no saturation point estimated (saturation cannot be ruled out): "
                + ", ".join(unexplained)
            )
        elif uncertain:
            conf = min(conf, UNCERTAIN_NONE)
            evidence += (
                "; no saturation point estimated for servers that held more than one request often "
                "(with N* = 1 they would be saturated): " + ", ".join(uncertain)
            )
        return Verdict("none", [], "no saturated tier", _clip(conf) * data_weight(n_windows), evidence)
    weight = min((n_star_weight or {}).get(t, 1.0) for t in part)
    cap = 1.0
    if unexplained:
        cap = UNEXPLAINED_ANY
        evidence += "; held a queue with no saturation point estimated (its saturation cannot be judged): " + ", ".join(
            unexplained
        )
    if dropped:
        cap = min(cap, INHERITED_CAP)
    if blind and any(t in part for t in (observed_by or {})):
        cap = min(cap, BLIND_CAP)
        evidence += "; " + "; ".join(blind)
    if uncertain and not unexplained:
        cap = min(cap, UNCERTAIN_ANY)
        evidence += (
            "; no saturation point estimated for servers that held more than one request often (their "
            "saturated share is a lower bound): " + ", ".join(uncertain)
        )
    bar = max(min_share, RELATIVE_SHARE * lead)

    def inherited_from_callee(t: str) -> bool:
        """Saturated mostly inside the saturation of a tier it calls: rule 2 would drop it."""
        own_windows = float(saturated[t].sum())
        return own_windows > 0 and any(
            (t, b) in (calls or set()) and float((saturated[t] & saturated[b]).sum()) >= INHERITED * own_windows
            for b in tiers
            if b != t
        )

    near = [
        t
        for t in ranked
        if t not in part and t not in dropped and shares[t] >= NEAR * bar and not inherited_from_callee(t)
    ]
    if near:
        cap = min(cap, NEAR_CAP)
        evidence += f"; near the {bar:.1%} needed to take part: " + ", ".join(f"{t} {shares[t]:.1%}" for t in near)
    if len(part) == 1:
        t = part[0]
        # the runner-up among the tiers whose saturation is their own (not a callee's, rule 2)
        runner = max((shares[r] for r in ranked if r != t and r not in dropped), default=0.0)
        conf = min(1.0, shares[t] / (min_share * 5)) * (1.0 - runner / max(shares[t], 1e-12))
        return Verdict(
            "single",
            [t],
            f"single bottleneck at {t}",
            min(cap, _clip(conf) * weight) * data_weight(n_windows),
            evidence,
        )
    a = part[0]
    alternating = [a]
    together_ratios = []
    for b in part[1:]:
        both = float((saturated[a] & saturated[b]).sum())
        smaller = float(min(saturated[a].sum(), saturated[b].sum()))
        ratio = both / smaller if smaller else 1.0
        together_ratios.append((b, ratio))
        if ratio < together_max:
            alternating.append(b)
    together_text = "; ".join(
        f"{a} and {b} saturated together in {r:.0%} of the smaller one's windows" for b, r in together_ratios
    )
    evidence += f"; {together_text}; the saturated tier switches {switches:.1f} times per second"
    if len(alternating) >= 2:
        worst = max(r for b, r in together_ratios if b in alternating)
        conf = (1.0 - worst / together_max) * min(1.0, switches / 0.5)
        names = sorted(alternating, key=tiers.index)
        text = "bottleneck alternating between " + _join(names)
        return Verdict(
            "alternating", names, text, min(cap, _clip(0.5 + 0.5 * conf) * weight) * data_weight(n_windows), evidence
        )
    names = sorted(part, key=tiers.index)
    best = min(r for _, r in together_ratios)
    conf = min(1.0, (best - together_max) / (1 - together_max) + 0.5)
    return Verdict(
        "several",
        names,
        "several tiers saturated at once: " + _join(names),
        min(cap, _clip(conf) * weight) * data_weight(n_windows),
        evidence,
    )


def _join(names: list[str]) -> str:
    if len(names) <= 2:
        return " and ".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def _clip(x: float) -> float:
    return float(min(1.0, max(0.0, x)))
