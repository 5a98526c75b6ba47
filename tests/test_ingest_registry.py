"""Users add formats: a registered format is detected, read, and its bad lines counted like the rest."""

from tierscope.ingest import Format, FormatError, detect, formats, load_file, register_format


def _sniff(head: bytes) -> bool:
    return head.startswith(b"#tiny-csv")


def _read(path, sink, **_options):
    with open(path) as f:
        if f.readline().strip() != "#tiny-csv":
            raise FormatError(f"{path}: not tiny-csv")
        for lineno, line in enumerate(f, 2):
            parts = line.strip().split(",")
            if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
                sink.skip(f"{path}:{lineno}", "expected tier,server,arrival_ns,departure_ns")
                continue
            sink.add(tier=parts[0], server=parts[1], arrival_ns=int(parts[2]), departure_ns=int(parts[3]))


def test_registered_format_is_detected_and_read(tmp_path):
    register_format(Format("tiny-csv", "a test format", _sniff, _read))
    try:
        path = tmp_path / "x.csv"
        path.write_text("#tiny-csv\ncache,c1,10,20\ncache,c1,15,40\noops\n")
        assert detect(path) == "tiny-csv"
        result = load_file(path)
        assert result.requests.column("departure_ns").to_pylist() == [20, 40]
        assert result.requests.column("source").to_pylist() == ["tiny-csv", "tiny-csv"]
        assert result.skipped == 1 and result.skipped_at == [f"{path}:4: expected tier,server,arrival_ns,departure_ns"]
    finally:
        from tierscope.ingest import registry

        registry._FORMATS.pop("tiny-csv", None)
    assert "tiny-csv" not in formats()
