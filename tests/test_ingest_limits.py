"""The JSON importers on corrupt or hostile input: nesting is bounded with an error naming the file
and line, strings are scanned in linear time, and the lexical scanner that enforces both agrees
with a byte-by-byte reference on every chunk boundary."""

from __future__ import annotations

import json
import random
import time

import pytest

from tierscope.ingest import FormatError, _json, load_file

DEEP = 100_000
OPEN_STRING = '{\n"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "'


def _span_doc(n: int = 3) -> dict:
    spans = [
        {
            "traceId": f"{1:032x}",
            "spanId": f"{i + 1:016x}",
            "name": "GET /x",
            "kind": 2,
            "startTimeUnixNano": str(1_000_000 + i),
            "endTimeUnixNano": str(2_000_000 + i),
        }
        for i in range(n)
    ]
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "web"}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}


@pytest.mark.parametrize(
    "layout,line",
    [
        ("one line", 1),  # read as NDJSON first: json.loads used to raise RecursionError
        ("document", 3),  # streamed: ijson built a prefix per level (O(depth^2) memory)
    ],
)
def test_deep_nesting_is_a_clear_error_naming_file_and_line(tmp_path, layout, line):
    path = tmp_path / "deep.json"
    body = "[" * DEEP + "]" * DEEP
    if layout == "one line":
        path.write_text('{"resourceSpans": ' + body + "}")
    else:
        path.write_text('{\n"resourceSpans": [\n' + body + "\n]}\n")
    t = time.process_time()
    with pytest.raises(FormatError) as err:
        load_file(path, format="otlp")
    assert time.process_time() - t < 5
    msg = str(err.value)
    assert msg.startswith(f"{path}: line {line}, byte offset ")
    assert f"nested deeper than {_json.MAX_DEPTH} levels" in msg
    offset = int(msg.split("byte offset ")[1].split(":")[0])
    assert path.read_bytes()[offset : offset + 1] == b"["  # the bracket that went one level too deep


def test_deep_value_inside_a_span_and_in_jaeger_and_zipkin(tmp_path):
    deep = "[" * DEEP + "]" * DEEP
    cases = {
        "otlp": '{"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [{"spanId": ' + deep + "}]}]}]}",
        "jaeger": '{"data": [{"traceID": "1", "spans": [{"spanID": ' + deep + '}], "processes": {}}]}',
        "zipkin": '[{"traceId": "1", "id": ' + deep + "}]",
    }
    for fmt, text in cases.items():
        path = tmp_path / f"{fmt}.json"
        path.write_text(text.replace(", ", ",\n"))
        with pytest.raises(FormatError, match=f"^{path}: line 2, byte offset \\d+: JSON nested deeper"):
            load_file(path, format=fmt)


def test_jaeger_single_trace_object_is_bounded_too(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text('{"traceID": "1", "spans": [], "processes": {"p": ' + "[" * 5000 + "]" * 5000 + "}}")
    with pytest.raises(FormatError, match="nested deeper than 256 levels"):
        load_file(path, format="jaeger")


def test_ndjson_line_too_deep_is_skipped_and_counted_the_others_read(tmp_path):
    good = json.dumps(_span_doc(3))
    path = tmp_path / "spans.ndjson"
    path.write_text(good + "\n" + '{"resourceSpans": ' + "[" * 2000 + "]" * 2000 + "}\n" + good + "\n")
    result = load_file(path, format="otlp")
    assert result.requests.num_rows == 6
    assert result.skipped == 1
    assert result.skipped_at[0].startswith(f"{path}:2: ") and "nested deeper than 256" in result.skipped_at[0]


def test_nesting_up_to_the_bound_is_read(tmp_path):
    doc = _span_doc(2)
    value: object = "leaf"
    for _ in range(_json.MAX_DEPTH - 12):  # the span sits 7 levels down; attributes add 3
        value = [value]
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"] = [{"key": "deep", "value": value}]
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(doc, indent=1))
    assert load_file(path, format="otlp").requests.num_rows == 2


def _open_string_file(path, mib: int) -> None:
    with open(path, "w") as f:
        f.write(OPEN_STRING)
        f.write("a" * (mib * 2**20))


def _reject_cpu(path) -> float:
    best = float("inf")
    for _ in range(2):
        t = time.process_time()
        with pytest.raises(FormatError, match="is not closed by the end of the file"):
            load_file(path, format="otlp")
        best = min(best, time.process_time() - t)
    return best


def test_unterminated_string_is_scanned_in_linear_time(tmp_path):
    small, big = tmp_path / "s.json", tmp_path / "b.json"
    _open_string_file(small, 2)
    _open_string_file(big, 8)
    with pytest.raises(FormatError) as err:
        load_file(big, format="otlp")
    assert str(err.value) == (
        f"{big}: not OTLP JSON: JSON syntax error before the first complete span (a string opened at "
        f"line 2, byte offset 98 is not closed by the end of the file ({8 * 2**20 + 1:,} bytes later))"
    )
    # The operation count: the parser is handed the string once, in one piece (fed in 64 KiB
    # pieces, yajl re-read it from its start 128 times: 8 MiB x 128 / 2 = 512 MiB of scanning).
    with _json.guarded(big) as reader:
        pieces = list(iter(lambda: reader.read(reader.buf_size), b""))
    # The string opens in the first 64 KiB chunk and never closes: the whole file is one piece.
    assert reader.pieces == len(pieces) == 1 and len(pieces[0]) == reader.bytes == big.stat().st_size
    assert reader.open_ends == 1  # that piece ends inside the string (the end of the file)
    # And the clock, loosely: 4x the size costs about 4x the time (quadratic was 16x).
    ratio = _reject_cpu(big) / max(_reject_cpu(small), 1e-3)
    assert ratio < 9, ratio


def test_string_longer_than_the_bound_is_refused_early(tmp_path, monkeypatch):
    monkeypatch.setattr(_json, "MAX_STRING", 2**20)
    path = tmp_path / "long.json"
    _open_string_file(path, 3)
    with pytest.raises(FormatError) as err:
        load_file(path, format="otlp")
    msg = str(err.value)
    assert msg.startswith(f"{path}: line 2, byte offset 98: a string longer than 1,048,576 bytes"), msg
    assert "no closing quote by byte 1,1" in msg  # stopped after about 1 MiB, not at the end of 3 MiB


def test_long_strings_with_escapes_are_never_fed_open(tmp_path):
    """Strings of 300 KiB full of escaped quotes and backslashes: the reader never ends a piece
    inside one (so the parser reads each once), and the spans around them are all read."""
    doc = _span_doc(5)
    blob = ('x\\"y\\\\' * 60_000)[: 300 * 1024]
    for i, span in enumerate(doc["resourceSpans"][0]["scopeSpans"][0]["spans"]):
        span["attributes"] = [{"key": "blob", "value": {"stringValue": blob + str(i)}}]
    path = tmp_path / "blobs.json"
    path.write_text(json.dumps(doc))
    with _json.guarded(path) as reader:
        while reader.read(reader.buf_size):
            pass
    assert reader.open_ends == 0 and reader.bytes == path.stat().st_size
    assert reader.largest > 300 * 1024  # a string crossing chunks came in one piece
    assert load_file(path, format="otlp").requests.num_rows == 5


def _reference(data: bytes, cuts: list[int]) -> list[tuple[bool, int]]:
    """String state and depth after each cut, byte by byte."""
    out, ins, esc, depth, k = [], False, False, 0, 0
    for i, c in enumerate(data):
        if ins:
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                ins = False
        elif c == 0x22:
            ins = True
        elif c in b"[{":
            depth += 1
        elif c in b"]}":
            depth = max(0, depth - 1)
        while k < len(cuts) and cuts[k] == i + 1:
            out.append((ins, depth))
            k += 1
    return out


def test_scanner_agrees_with_a_byte_by_byte_reference_at_every_cut():
    rnd = random.Random(7)
    alphabet = ['"', "\\", "[", "]", "{", "}", "a", ",", ":", "\n"]
    for trial in range(200):
        # valid-ish JSON text with strings full of escapes and brackets, cut at random places
        parts = []
        for _ in range(rnd.randint(1, 40)):
            kind = rnd.random()
            if kind < 0.4:
                parts.append(json.dumps("".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12)))))
            elif kind < 0.7:
                parts.append(rnd.choice("[{"))
            else:
                parts.append(rnd.choice(["]", "}", ",", "1", "\n"]))
        data = "".join(parts).encode()
        cuts = sorted(set(rnd.sample(range(1, len(data) + 1), min(len(data), rnd.randint(1, 6))) + [len(data)]))
        scan = _json.Scanner("x", max_depth=10**6)
        got, prev = [], 0
        for cut in cuts:
            scan.feed(data[prev:cut])
            prev = cut
            got.append((scan.in_string, scan.depth))
        assert got == _reference(data, cuts), (trial, data, cuts)
