"""Bursty arrivals: a two-state Markov-modulated Poisson process (MMPP-2) with a given index of dispersion.

Mi, Casale, Cherkasova and Smirni (2009) inject burstiness into a closed benchmark by modulating
the users' think time with a Markov chain: a *normal* state and a *surge* state in which users
think `surge_factor` times faster. The burstiness is summarised by the index of dispersion of the
arrival counts, I = lim Var(N_t) / E(N_t) (I = 1 for Poisson).

For an MMPP-2 with rates Λn < Λs, switching rates r_ns (normal→surge) and r_sn, stationary surge
share p = r_ns / (r_ns + r_sn) and r = r_ns + r_sn:

    I = 1 + 2 (Λs - Λn)² p (1 - p) / (r · Λ̄),     Λ̄ = p Λs + (1 - p) Λn

so, given I, p and Λs/Λn, the switching speed is r = 2 (Λs - Λn)² p (1 - p) / ((I - 1) Λ̄).
Here Λ is the *offered* rate of the whole user population (users / mean think time), the rate the
arrivals would have if every user were thinking; the mean think time is kept.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Mmpp2:
    """Per-user think rates in the two states and the switching rates of the modulating chain (1/s)."""

    rate_normal: float
    rate_surge: float
    to_surge: float  # r_ns
    to_normal: float  # r_sn

    @property
    def surge_share(self) -> float:
        return self.to_surge / (self.to_surge + self.to_normal)

    def index_of_dispersion(self, users: int) -> float:
        """I of the offered arrivals of `users` users, all thinking (the formula above)."""
        p = self.surge_share
        ln, ls = users * self.rate_normal, users * self.rate_surge
        mean = p * ls + (1 - p) * ln
        r = self.to_surge + self.to_normal
        return 1 + 2 * (ls - ln) ** 2 * p * (1 - p) / (r * mean)


def mmpp2_for(users: int, think_mean_s: float, index: float, surge_share: float, surge_factor: float) -> Mmpp2:
    """The MMPP-2 whose offered arrivals have index of dispersion `index` and mean think `think_mean_s`."""
    if index <= 1:
        raise ValueError("an MMPP is only needed for I > 1")
    if think_mean_s <= 0:
        raise ValueError("bursty arrivals need a think time > 0")
    p = surge_share
    mean_rate = 1.0 / think_mean_s
    rate_normal = mean_rate / (1 - p + p * surge_factor)
    rate_surge = surge_factor * rate_normal
    ln, ls = users * rate_normal, users * rate_surge
    r = 2 * (ls - ln) ** 2 * p * (1 - p) / ((index - 1) * users * mean_rate)
    return Mmpp2(rate_normal, rate_surge, to_surge=r * p, to_normal=r * (1 - p))


class Modulation:
    """The state of the modulating chain over [0, horizon]: switch times drawn once, looked up by time."""

    def __init__(self, mmpp: Mmpp2, horizon_s: float, rng: random.Random):
        self.mmpp = mmpp
        self.switches: list[float] = []  # times where the state flips; state 0 (normal) at t=0
        surge = rng.random() < mmpp.surge_share
        self.initial = 1 if surge else 0
        t = 0.0
        while t < horizon_s:
            t += rng.expovariate(mmpp.to_normal if surge else mmpp.to_surge)
            self.switches.append(t)
            surge = not surge
        self.rate_max = max(mmpp.rate_normal, mmpp.rate_surge)
        self._rates = (mmpp.rate_normal, mmpp.rate_surge)

    def state(self, t: float) -> int:
        """0 normal, 1 surge."""
        flips = bisect.bisect_right(self.switches, t)
        return (self.initial + flips) & 1

    def rate(self, t: float) -> float:
        return self._rates[self.state(t)]

    def next_arrival(self, t: float, rng: random.Random) -> float:
        """The end of a think started at `t` (thinning of a Poisson process at the maximum rate)."""
        rmax = self.rate_max
        rates = self._rates
        while True:
            t += rng.expovariate(rmax)
            if rng.random() * rmax < rates[self.state(t)]:
                return t

    def surge_intervals(self, horizon_s: float) -> list[tuple[float, float]]:
        """The surge periods within [0, horizon] (for the events table)."""
        out = []
        edges = [0.0] + [s for s in self.switches if s < horizon_s] + [horizon_s]
        state = self.initial
        for a, b in zip(edges[:-1], edges[1:]):
            if state == 1 and b > a:
                out.append((a, b))
            state ^= 1
        return out


def open_arrivals(mmpp: Mmpp2, users: int, horizon_s: float, seed: int) -> list[float]:
    """Arrival times of the offered process (users × per-user rate, no closed loop): for tests of I."""
    rng = random.Random(seed)
    mod = Modulation(mmpp, horizon_s, rng)
    t = 0.0
    out: list[float] = []
    total_max = users * mod.rate_max
    while True:
        t += rng.expovariate(total_max)
        if t >= horizon_s:
            return out
        if rng.random() * mod.rate_max < mod.rate(t):
            out.append(t)
