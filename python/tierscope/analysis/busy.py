"""A busy caller, from its own stamps: the time a process spent running one request's code while
others waited, which stretches the CLIENT spans it stamps (issue 26).

A process that records its own spans stamps a time whenever it moves a request on: it takes one
up (the request arrives, a reply to one of its calls comes back), sends a call, or answers. A
process waiting on its callee breaks its silences with what comes from outside: replies, new
requests. A process busy with one request's code (a single event loop, threads under one GIL, its
cores all taken) stamps nothing else until that code yields; the replies of its other requests
wait in their sockets, and the CLIENT spans of those calls end late, looking like a slow callee.

So, per recorder: a **busy silence** is a gap between two consecutive stamps of the recorder, at
least MIN_GAP_NS long, that

* begins with a stamp that hands a request to the process (its arrival, or a reply to one of its
  calls), the request having no other call open (its own code runs: nothing downstream holds it);
* ends with a stamp that is not a reply (the request's own next step, a new request or anything
  else the process got round to once that code yielded: not a reply breaking the silence);
* passes while the recorder held at least one other request of its own (someone was waiting).

A process waiting for a connection of its own pool breaks its silences with the reply that frees
one, so a full pool is no busy silence; nor is a single slow request of an idle process (no one
waited). The fine-grained analysis takes a caller whose busy silences cover enough of the trace
(fine.BUSY_SHARE) as having stretched the calls it stamped: its callee's apparent saturation, seen
only through those calls, is the caller's.

A step of a request that follows at once (HANDOFF_NS) on another request's reply may have waited
for what that reply freed, a pooled connection handed on: it neither ends a busy silence nor makes
the silence before it its request's own code. A clock that stamps starts in whole milliseconds
(Node's SDK) places them up to one early: a silence begun by such an arrival counts from a
millisecond later, and such a start with a reply stamped within a millisecond after it may have
followed that reply.

Counted once (a one-off probe, not a bench: `busy_silences` over each cached corpus case's
spans.otlp.json, busy time over the trace's span): busy silences covered 14-61 % of the trace in
the diagnosis corpus' 7 cases of a CPU-bound or CPU-starved app, at most 4 % in its 42 cases
without a fault in the app (the database paused, saturated or disk-bound, a full pool, no fault),
8 % in a paused app.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa

#: A busy silence is at least this long (ns): longer than a process takes to stamp a request it
#: moves on, and than a whole-millisecond clock (Node's span starts) blurs.
MIN_GAP_NS = 2_000_000

# stamp kinds, in the order of stamps at one instant: the end of a piece of code before the next
_CALL, _ANSWER, _ARRIVE, _REPLY = 0, 1, 2, 3
MS = 1_000_000  # ns
#: A stamp within this long (ns) after another request's reply may have waited for what the reply
#: freed (a pooled connection handed on): it does not end a busy silence, nor is a request whose
#: next step it is taken as running its own code before it.
HANDOFF_NS = 1_000_000


def busy_silences(requests: pa.Table, parent_row: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per recorder (named as its server rows are): the busy silences' starts and ends (ns), sorted
    (see the module docstring). Only recorders that stamped CLIENT rows (a callee's row whose
    recorder is not its own server) are looked at: the others' stamps stretch no callee."""
    if "recorder" not in requests.column_names or requests.num_rows == 0:
        return {}
    recorder = np.asarray(requests.column("recorder").to_numpy(zero_copy_only=False), object)
    server = np.asarray(requests.column("server").to_numpy(zero_copy_only=False), object)
    arrival = np.asarray(requests.column("arrival_ns"), np.int64)
    departure = np.asarray(requests.column("departure_ns"), np.int64)
    own = recorder == server
    calls = ~own & (recorder != None)  # noqa: E711 (an object array: elementwise)
    callers = set(recorder[calls].tolist())
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for who in callers:
        mine = np.flatnonzero(own & (server == who))
        sent = np.flatnonzero(calls & (recorder == who))
        if mine.size == 0 or sent.size == 0:
            continue
        parents = parent_row[sent]
        # the stamps: (time, kind, the recorder's own request it concerns)
        times = np.concatenate([arrival[mine], departure[mine], arrival[sent], departure[sent]])
        kinds = np.concatenate(
            [
                np.full(mine.size, _ARRIVE),
                np.full(mine.size, _ANSWER),
                np.full(sent.size, _CALL),
                np.full(sent.size, _REPLY),
            ]
        )
        owner = np.concatenate([mine, mine, parents, parents])
        # a clock that stamps starts in whole milliseconds (Node's SDK) places them up to one before
        # the moment they stand for
        starts = np.concatenate([arrival[mine], arrival[sent]])
        coarse = MS if starts.size >= 20 and not (starts % MS).any() else 0
        order = np.lexsort((kinds, times))
        times, kinds, owner = times[order], kinds[order], owner[order]
        # the recorder's own requests held after each stamp
        held = np.cumsum(np.where(kinds == _ARRIVE, 1, np.where(kinds == _ANSWER, -1, 0)))
        # a silence begun by an arrival stamped early is counted from the latest moment it stands for
        begin = times[:-1] + np.where(kinds[:-1] == _ARRIVE, coarse, 0)
        gap = times[1:] - begin
        # a step that follows at once on another request's reply may have waited for what that reply
        # freed (a pooled connection): a start stamped early may even come before that reply
        reply_at = np.where(kinds == _REPLY, times, np.iinfo(np.int64).max)
        next_reply = np.minimum.accumulate(reply_at[::-1])[::-1]
        last_reply = np.maximum.accumulate(np.where(kinds == _REPLY, times, -(2**62)))  # none yet: far back
        handoff = (times - last_reply <= HANDOFF_NS) | (
            (coarse > 0) & np.isin(kinds, (_ARRIVE, _CALL)) & (next_reply - times < coarse)
        )
        # each stamp's request's next stamp
        by_owner = np.lexsort((np.arange(times.size), owner))
        next_own = np.full(times.size, -1)
        same = owner[by_owner[1:]] == owner[by_owner[:-1]]
        next_own[by_owner[:-1][same]] = by_owner[1:][same]
        nxt = next_own[:-1]
        waited = (nxt >= 0) & handoff[np.maximum(nxt, 0)] & (kinds[np.maximum(nxt, 0)] != _REPLY)
        cand = np.flatnonzero(
            (gap >= MIN_GAP_NS)
            & ((kinds[:-1] == _ARRIVE) | (kinds[:-1] == _REPLY))
            & (kinds[1:] != _REPLY)
            & ~handoff[1:]
            & ~waited
            & (held[:-1] >= 2)
            & (owner[:-1] >= 0)
        )
        if cand.size == 0:
            continue
        # the request taken up has no other call open across the gap (its own code runs)
        open_calls: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for row, parent in zip(sent.tolist(), parents.tolist()):
            if parent >= 0:
                open_calls[parent].append((int(arrival[row]), int(departure[row])))
        keep = []
        for i in cand.tolist():
            t0, t1, req = int(begin[i]), int(times[i + 1]), int(owner[i])
            if all(not (a < t1 and b > t0) for a, b in open_calls.get(req, ())):
                keep.append(i)
        if keep:
            k = np.asarray(keep)
            out[str(who)] = (begin[k], times[k + 1])
    return out
