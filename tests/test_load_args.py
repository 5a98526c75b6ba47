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


def test_a_specs_workload_gives_every_generator_the_same_options():
    """Local and remote generators take their phases, think time and session minimum from one
    place (`workload_options`): a spec's `session_min` reaches the engine, a dispersion of 1 does not."""
    from tierscope.load import workload_options
    from tierscope.spec import expand, parse_spec

    spec = '[workload]\nusers = [5]\nthink_time = "1s"\nsession_min = "20s"\nrun = "30s"\n'
    w = expand(parse_spec(spec, where="t.toml"))[0].config.workload
    argv = engine_args("w.toml", **workload_options(w))
    assert argv[argv.index("--session-min") + 1] == "20.0s"
    assert argv[argv.index("--duration") + 1] == "30.0s" and argv[argv.index("--think") + 1] == "1.0"
    assert "--think-dispersion" not in argv
