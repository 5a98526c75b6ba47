"""Orphaned labs (issue 21): a lab whose owner was SIGKILLed is named by `tierscope testbed status`
("lab N: orphaned, owner pid P dead") and removed whole by `tierscope testbed clean --orphans`
(processes in its hosts and holding its point directory, namespaces, bridge, veths, cgroups, state
file); a lab whose owner lives is neither. `--resume` never deletes a point directory live
processes hold. Real processes and namespaces; needs root."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tierscope.testbed.lab import Testbed, holders, namespaces_unavailable, state_dir

BIN = Path(sys.executable).parent
LAB = 9  # the orphan (test_testbed uses 6 and 7, test_testbed_clean 8)
LIVE = 10  # a lab whose owner (this test) lives
TINY = Path(__file__).resolve().parent.parent / "examples" / "specs" / "tiny.toml"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "tierscope"), "testbed", *args], capture_output=True, text=True, timeout=120)


def netns() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


def links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


CHILD = """
import os, subprocess, sys, time
from pathlib import Path
from tierscope.spec import expand, load_spec
from tierscope.testbed.lab import Testbed
point_dir = Path(sys.argv[1])
tb = Testbed(lab=int(sys.argv[2]), workdir=point_dir / "testbed", point_dir=point_dir)
tb.up(expand(load_spec(sys.argv[3]))[0])
# a server in a host (its cgroup and namespace), a capture-like writer outside the hosts holding a
# file of the point, and one working in the point's directory: what a killed run leaves running
server = subprocess.Popen(tb.hosts["db1"].wrap(["sleep", "300"]), start_new_session=True)
writer = subprocess.Popen(["sh", "-c", "exec 3>>capture.pcap; exec sleep 300"], cwd=point_dir, start_new_session=True)
mover = subprocess.Popen(["sleep", "301"], cwd=point_dir / "testbed", start_new_session=True)
time.sleep(0.3)
print(server.pid, writer.pid, mover.pid, flush=True)
time.sleep(300)
"""


@pytest.fixture
def needs_namespaces():
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"namespaced hosts unavailable: {reason}")


def test_sigkilled_owner_leaves_an_orphan_that_status_names_and_clean_orphans_removes(needs_namespaces, tmp_path):
    point_dir = tmp_path / "point"
    point_dir.mkdir()
    owner = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(point_dir), str(LAB), str(TINY)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    live = Testbed(lab=LIVE, workdir=tmp_path / "live")
    pids: list[int] = []
    try:
        line = owner.stdout.readline()
        assert line.strip(), owner.stderr.read() if owner.poll() is not None else "no pids"
        pids = [int(x) for x in line.split()]
        live.up_hosts([("web1", None)])
        assert all(alive(p) for p in pids)
        owner.send_signal(signal.SIGKILL)  # no atexit, no teardown
        owner.wait()
        assert f"tierscope{LAB}-db1" in netns() and f"tsbr{LAB}" in links()

        st = cli("status")
        assert st.returncode == 0, st.stderr
        assert f"lab {LAB}: orphaned, owner pid {owner.pid} dead" in st.stdout, st.stdout
        assert f"lab {LIVE}: orphaned" not in st.stdout  # its owner (this process) lives

        out = cli("clean", "--orphans")
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"lab {LAB}: orphaned, owner pid {owner.pid} dead: removed 3 processes, 4 namespaces" in out.stdout
        # nothing of the orphan remains: namespaces, bridge, veths, cgroups, processes, state
        assert not [n for n in netns() if n.startswith(f"tierscope{LAB}-")]
        assert f"tsbr{LAB}" not in links() and f" ts{LAB}-" not in links()
        assert not list(Path("/sys/fs/cgroup").glob(f"*/tierscope/{LAB}"))
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in pids if alive(p)]
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        assert "sleep 301" not in ps
        assert not (state_dir() / f"lab{LAB}.json").exists()
        assert (point_dir / "capture.pcap").exists()  # a run's files are results: kept
        # the live lab is untouched
        assert f"tierscope{LIVE}-web1" in netns() and f"tsbr{LIVE}" in links()
        assert "no orphaned lab" in cli("clean", "--orphans").stdout
    finally:
        if owner.poll() is None:
            owner.kill()
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        live.down()
        if (state_dir() / f"lab{LAB}.json").exists():
            cli("clean", "--orphans")
    assert f"tsbr{LIVE}" not in links()


def test_resume_never_deletes_a_point_directory_live_processes_hold(tmp_path):
    """A killed run's tcpdump still writes in its unfinished point: the point is not deleted under
    it (it fails, naming the holder); once the holder is gone the point is run afresh."""
    from tierscope.runner import FAILED, Progress, run_point
    from tierscope.spec import expand, load_spec

    spec = load_spec(TINY)
    point = expand(spec)[0]
    pdir = tmp_path / "run" / point.id
    pdir.mkdir(parents=True)
    (pdir / "capture.pcap").write_bytes(b"half a capture")
    holder = subprocess.Popen(["sh", "-c", f"exec 3>>{pdir / 'capture.pcap'}; exec sleep 300"], cwd=tmp_path)
    try:
        time.sleep(0.2)
        assert holders([pdir]) == {holder.pid: f"open file {pdir / 'capture.pcap'}"}
        status, reason = run_point(point, spec, tmp_path / "run", {}, "loopback", Progress(), {})
        assert status == FAILED
        assert f"not deleting {pdir}: 1 live process(es) still hold it (pid {holder.pid}" in reason
        assert (pdir / "capture.pcap").read_bytes() == b"half a capture"
    finally:
        holder.kill()
        holder.wait()
    assert holders([pdir]) == {}


def _spec(tmp_path: Path, name: str, run: str) -> Path:
    text = TINY.read_text().replace("users = [5, 10]", "users = [5]").replace('run = "5s"', f'run = "{run}"')
    text = text.replace('name = "tiny"', f'name = "{name}"')
    f = tmp_path / f"{name}.toml"
    f.write_text(text)
    return f


@pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump not installed")
def test_sigkilled_run_is_reported_and_removed_by_the_next_run(needs_namespaces, tmp_path):
    """The issue's drill: SIGKILL `tierscope run` mid-point (its database, app server, nginx,
    generator and tcpdump keep running in their lab); the next `tierscope run` says "lab N:
    orphaned, owner pid P dead", removes it, and nothing of it remains."""
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    run = subprocess.Popen(
        [str(BIN / "tierscope"), "run", str(_spec(tmp_path, "killed", "120s")), "-o", str(out1)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and run.poll() is None:  # mid-point: capturing and driving
            caps = list(out1.glob("killed/*/capture.pcap"))
            if caps and caps[0].stat().st_size > 0 and list(out1.glob("killed/*/generator.stderr.log")):
                break
            time.sleep(0.5)
        assert run.poll() is None, "the run ended before it could be killed"
        pdir = caps[0].parent
        for f in state_dir().glob("lab*.json"):
            s = json.loads(f.read_text())
            if s.get("point_dir") == str(pdir):
                state = s
        assert state is not None and state["owner"]["pid"] == run.pid
        lab = state["lab"]
        run.kill()
        run.wait()
        time.sleep(1)
        left = holders([pdir])
        assert left, "a killed run leaves processes writing in its point (tcpdump at least)"
        assert f"tierscope{lab}-db1" in netns()

        again = subprocess.run(
            [str(BIN / "tierscope"), "run", str(_spec(tmp_path, "next", "1s")), "-o", str(out2)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        err = " ".join(again.stderr.split())
        assert f"lab {lab}: orphaned, owner pid {run.pid} dead: removed" in err, again.stdout + again.stderr
        assert again.returncode == 0, again.stdout + again.stderr
        # nothing of the killed run's lab remains
        assert not [n for n in netns() if n.startswith(f"tierscope{lab}-")]
        assert f"tsbr{lab}:" not in links() and f" ts{lab}-" not in links()
        assert not list(Path("/sys/fs/cgroup").glob(f"*/tierscope/{lab}"))
        assert not [p for p in left if alive(p)]
        assert holders([pdir]) == {}
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert str(pdir) not in ps
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if state is not None and (state_dir() / f"lab{state['lab']}.json").exists():
            cli("clean", "--orphans")
