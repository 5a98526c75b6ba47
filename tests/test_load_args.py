"""`tierscope load`'s options reach the engine's argv (and only when given)."""

from __future__ import annotations

from tierscope.load import engine_args


def test_embedded_options_are_passed_only_when_given():
    plain = engine_args("w.toml", target="http://x")
    assert "--no-embedded" not in plain and "--embedded-connections" not in plain
    argv = engine_args("w.toml", target="http://x", no_embedded=True, embedded_connections=2)
    assert argv[argv.index("--embedded-connections") + 1] == "2" and argv[-1] == "--no-embedded"
    assert argv[1:3] == ["load", "w.toml"]


def test_the_session_minimum_is_passed_only_when_given():
    assert "--session-min" not in engine_args("w.toml")
    argv = engine_args("w.toml", session_min="20.0s")
    assert argv[argv.index("--session-min") + 1] == "20.0s"
