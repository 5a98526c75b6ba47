"""Which backend reply answers which request message (pure bookkeeping).

The proxy sends a backend the client's messages, sometimes with messages of its own in between
(a Parse that recreates a statement the client prepared earlier on another connection) and
sometimes without some of the client's (a Parse of a statement the proxy keeps itself). The
PostgreSQL reply to each message is fixed by the protocol, so a queue of what was sent tells, for
every reply, whether to pass it to the client, hide it (an answer to the proxy's own message), or
add an answer of the proxy's own (for a message not sent).

Replies per message: Parse -> ParseComplete; Bind -> BindComplete; Close -> CloseComplete;
Describe statement -> ParameterDescription, then RowDescription or NoData; Describe portal ->
RowDescription or NoData; Execute -> DataRow*, then CommandComplete, EmptyQueryResponse or
PortalSuspended; Sync -> ReadyForQuery; Flush -> nothing; a simple Query -> per statement RowDescription,
DataRow*, CommandComplete or EmptyQueryResponse, then ReadyForQuery. After an ErrorResponse the server skips
everything up to Sync. Notices, parameter status and notifications may come at any time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tierscope.middleware import wire

PASS, HIDE, SYNTH = "pass", "hide", "synth"

_FINAL = {
    wire.PARSE: {wire.PARSE_COMPLETE},
    wire.BIND: {wire.BIND_COMPLETE},
    wire.CLOSE: {wire.CLOSE_COMPLETE},
    wire.EXECUTE: {wire.COMMAND_COMPLETE, wire.EMPTY_QUERY, wire.PORTAL_SUSPENDED},
    wire.SYNC: {wire.READY},
    wire.QUERY: {wire.READY},
}
_INTERIM = {
    wire.EXECUTE: {wire.DATA_ROW, wire.ROW_DESCRIPTION},
    wire.QUERY: {wire.ROW_DESCRIPTION, wire.DATA_ROW, wire.COMMAND_COMPLETE, wire.EMPTY_QUERY},
}


@dataclass
class Expect:
    kind: bytes  # the request message type ("D" with target "S"/"P" for Describe)
    mode: str = PASS
    target: str = ""
    synth: bytes = b""  # the encoded answer for SYNTH
    seen_param_desc: bool = False


@dataclass
class ReplyPlan:
    """The replies still due for the messages sent in one unit of work."""

    queue: deque = field(default_factory=deque)
    errors: int = 0
    skipping: bool = False  # an error came and no Sync has been sent since: the server ignores all

    def sent(self, kind: bytes, mode: str = PASS, target: str = "") -> None:
        if kind == wire.FLUSH:
            return
        if self.skipping:
            if kind not in (wire.SYNC, wire.QUERY):
                return
            self.skipping = False
        self.queue.append(Expect(kind, mode, target))

    def answered_here(self, answer: bytes) -> None:
        """A message the proxy answers itself (it was not sent); `answer` is encoded."""
        if not self.skipping:
            self.queue.append(Expect(b"", SYNTH, synth=answer))

    def due_now(self) -> list[bytes]:
        """Answers of the proxy's own that are next in line (before any backend reply)."""
        out = []
        while self.queue and self.queue[0].mode == SYNTH:
            out.append(self.queue.popleft().synth)
        return out

    def reply(self, kind: bytes) -> tuple[bool, list[bytes]]:
        """A backend reply arrived: (pass it on?, the proxy's answers due right after it)."""
        if kind in wire.ASYNC:
            return True, []
        if kind == wire.ERROR:
            self.errors += 1
            # the client must learn that its unit failed, even when the proxy's own message did
            while self.queue and self.queue[0].kind not in (wire.SYNC, wire.QUERY):
                self.queue.popleft()
            if not self.queue:  # the Sync ending the skip has not been sent yet (a Flush came first)
                self.skipping = True
            return True, []
        if not self.queue:
            raise wire.ProtocolError(f"backend sent {kind!r} with nothing outstanding")
        head = self.queue[0]
        if head.kind == wire.DESCRIBE:
            if head.target == "S" and kind == wire.PARAMETER_DESCRIPTION and not head.seen_param_desc:
                head.seen_param_desc = True
                return head.mode == PASS, []
            if kind in (wire.ROW_DESCRIPTION, wire.NO_DATA):
                self.queue.popleft()
                return head.mode == PASS, self.due_now()
            raise wire.ProtocolError(f"backend sent {kind!r} in reply to Describe")
        if kind in _INTERIM.get(head.kind, ()):
            return head.mode == PASS, []
        if kind in _FINAL.get(head.kind, ()):
            self.queue.popleft()
            return head.mode == PASS, self.due_now()
        raise wire.ProtocolError(f"backend sent {kind!r} in reply to {head.kind!r}")

    @property
    def done(self) -> bool:
        return not self.queue
