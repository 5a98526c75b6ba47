"""A discrete-event simulator of closed N-tier systems that writes the tables a real run writes.

Ground truth for tests and a teaching tool: users with think time, tiers of servers each with a
thread pool and cores, synchronous calls down the chain, injectable stop-the-world freezes and
bursty (MMPP) arrivals. It also writes `saturation_truth`: which server was saturated when.
See docs/simulate.md.

    from tierscope.simulate import load_spec, simulate
    sim = simulate(load_spec("examples/simulate/alternating.toml"))
    sim.write("out/")
"""

from __future__ import annotations

from .output import FILES, SATURATION_TRUTH, Simulation, to_tables
from .spec import Spec, SpecError, load_spec, parse_spec


def simulate(spec: Spec) -> Simulation:
    """Run the simulation of `spec` and return its tables."""
    from .engine import run

    return to_tables(spec, run(spec))


__all__ = [
    "FILES",
    "SATURATION_TRUTH",
    "Simulation",
    "Spec",
    "SpecError",
    "load_spec",
    "parse_spec",
    "simulate",
]
