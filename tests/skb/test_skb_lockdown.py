"""The SKB engine without privileges (issue 23): an escape from its sandbox runs as an unprivileged
uid with no capabilities that can execute nothing and write nowhere but its private directory.

The escape is planted on purpose: a trusted stored-procedure library that only these tests load
(tests/data/skb_escape/cod_test_escape.pl) runs shell/2, open/3 and process_create/3 unchecked.
Also here: the direct socket's mode after a restart, the engine's standard error in the log, and
what both drivers do with a reply line that names no request."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest

from cod.skb import SKB, AsyncSKB, EngineConfig
from cod.skb.lifecycle import FRAMES_LIBRARY, NOEXEC_LIBRARY, engine_identity
from cod.skb.lockdown import landlock_abi
from cod.skb.session import Session
from cod.skb.stderr_log import BURST, RateLimit, printable
from helpers.paths import TESTS
from helpers.rm_support import as_user, start_daemon

ESCAPE = TESTS / "data" / "skb_escape"
NOBODY = 65534
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="dropping the engine's uid needs root")
needs_landlock = pytest.mark.skipif(landlock_abi() == 0, reason="this kernel has no Landlock (landlock_create_ruleset)")
needs_seccomp = pytest.mark.skipif(not NOEXEC_LIBRARY.exists(),
                                   reason=f"the seccomp filter library {NOEXEC_LIBRARY.name} is not built (make setup)")
LOADER = "/lib64/ld-linux-x86-64.so.2"


def escaped(**config) -> SKB:
    return SKB(config=EngineConfig(library_dir=ESCAPE, **config))


def ask(skb: SKB, goal: str) -> str:
    [answer] = skb.execute_query("attacker", goal)
    return str(answer["R"])


def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


@pytest.fixture
def open_dir():
    """A directory every uid may write (so that only the engine's sandbox can refuse a write)."""
    with tempfile.TemporaryDirectory(prefix="cod-lockdown-") as tmp:
        os.chmod(tmp, 0o1777)
        yield Path(tmp)


# ---- who the engine is -------------------------------------------------------------------------
@needs_root
def test_the_engine_runs_as_an_unprivileged_uid_with_no_capabilities():
    uid, gid = engine_identity("cod-skb")
    with escaped() as skb:
        st = status(skb.pid)
        assert st["Uid"].split() == [str(uid)] * 4 and st["Gid"].split() == [str(gid)] * 4
        assert uid != 0 and st["Groups"] == ""
        for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(st[caps], 16) == 0, (caps, st[caps])
        assert st["NoNewPrivs"] == "1"
        if NOEXEC_LIBRARY.exists():
            assert st["Seccomp"] == "2"
        assert ask(skb, "escape_shell('id -u', R)") != "0"


def test_the_locked_down_engine_loads_its_frame_library():
    """The direct channel's frames in C (skb/native/cod_frames.c): the engine reaches the library
    through its lockdown, or it would read every frame in Prolog at twice the CPU, silently."""
    assert FRAMES_LIBRARY.exists(), f"{FRAMES_LIBRARY} is not built: make setup"
    with escaped() as skb:
        assert FRAMES_LIBRARY.name in Path(f"/proc/{skb.pid}/maps").read_text()


# ---- what an escape can do ---------------------------------------------------------------------
@needs_root
@needs_landlock
def test_an_escape_can_neither_run_a_program_nor_write_outside_its_directory(open_dir, tmp_path):
    with escaped() as skb:
        marker = open_dir / "ran"
        assert ask(skb, f"escape_shell('id > {marker}', R)") != "0"
        assert ask(skb, f"escape_loader(['{LOADER}', '/bin/sh', '-c', 'id > {marker}'], R)") != "0"
        assert not marker.exists()
        # The directory is open to every uid: only Landlock refuses these.
        for target in (open_dir / "written", tmp_path / "written", Path("/dev/shm") / f"cod-{os.getpid()}"):
            assert "permission_error" in ask(skb, f"escape_write('{target}', R)")
            assert not target.exists()
        # It may write where it must: its private directory (the proof that the probe can succeed).
        private = skb._engine.engine_path(skb._engine.private_dir)
        assert ask(skb, f"escape_write('{private}/mine', R)") == "ok"
        assert (Path(skb._engine.private_dir) / "mine").read_text() == "escaped"


@needs_root
@needs_seccomp
def test_without_landlock_the_seccomp_filter_still_refuses_every_program(open_dir, tmp_path):
    """As on a kernel without Landlock: no program runs (seccomp), and the uid's own file
    permissions are all that bound writes: a directory open to every uid can be written."""
    with escaped(landlock=False) as skb:
        assert status(skb.pid)["Seccomp"] == "2"
        marker = open_dir / "ran"
        assert ask(skb, f"escape_shell('id > {marker}', R)") != "0"
        assert ask(skb, f"escape_loader(['{LOADER}', '/bin/sh', '-c', 'id > {marker}'], R)") != "0"
        assert not marker.exists()
        assert "permission_error" in ask(skb, f"escape_write('{tmp_path / 'root-only'}', R)")
        assert ask(skb, f"escape_write('{open_dir / 'written'}', R)") == "ok"
        assert (open_dir / "written").stat().st_uid == engine_identity("cod-skb")[0]


@needs_root
@needs_landlock
def test_landlock_alone_refuses_programs_but_not_the_elf_interpreter(open_dir, monkeypatch):
    """Without the seccomp filter: Landlock refuses every program but the ELF interpreter, which
    the engine itself needs and which loads any readable program by hand (what the filter closes);
    writes are still refused."""
    import cod.skb.lifecycle as lifecycle

    monkeypatch.setattr(lifecycle, "NOEXEC_LIBRARY", Path("/nonexistent/cod_noexec.so"))
    with escaped() as skb:
        assert status(skb.pid)["Seccomp"] == "0"
        assert ask(skb, "escape_loader(['/bin/true'], R)") != "exit(0)"
        assert ask(skb, f"escape_loader(['{LOADER}', '/bin/true'], R)") == "exit(0)"
        probe = open_dir / "probe"
        assert ask(skb, f"escape_loader(['{LOADER}', '/bin/touch', '{probe}'], R)") == "exit(1)"
        assert not probe.exists()


# ---- the direct socket after a restart -----------------------------------------------------------
@needs_root
def test_the_direct_socket_keeps_its_mode_after_an_engine_restart():
    with tempfile.TemporaryDirectory(prefix="cod-lockdown-") as tmp:
        os.chmod(tmp, 0o755)
        d = start_daemon(Path(tmp), "--machine", "magnycours", "--set", "socket_mode=0666")
        try:
            direct = Path(f"{d.path}.skb.d") / "direct.sock"
            engine = int(Path(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children").read_text().split()[0])
            before = direct.stat().st_ino
            os.kill(engine, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the new engine's socket, once the daemon has set its mode
                try:
                    st = direct.stat()
                except FileNotFoundError:
                    st = None
                if st is not None and st.st_ino != before and stat.S_IMODE(st.st_mode) == 0o666:
                    break
                time.sleep(0.1)
            assert stat.S_IMODE(direct.stat().st_mode) == 0o666, oct(direct.stat().st_mode)

            def connect(path: str) -> None:
                s = socket.socket(socket.AF_UNIX)
                s.connect(path)
                s.close()

            assert as_user(NOBODY, connect, str(direct)) == 0
        finally:
            d.stop()


# ---- the engine's standard error -------------------------------------------------------------
def test_the_engine_cannot_flood_the_log_through_its_standard_error(caplog):
    caplog.set_level(logging.WARNING, logger="cod.skb")
    with escaped() as skb:
        pid = skb.pid
        skb.execute_query("attacker", "escape_stderr(5000)")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any("not logged" in r.getMessage() for r in caplog.records):
        time.sleep(0.05)
    mine = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"SKB engine {pid}:")]
    assert sum("flood" in m for m in mine) == BURST
    assert any(f"{5000 - BURST} more lines" in m for m in mine), mine[-3:]


@pytest.mark.parametrize("raw, shown", [
    (b"plain\n", "plain"),
    (b"\x1b[31mred\x07\n", "?[31mred?"),
    (b"\xff\xfe\n", "\ufffd\ufffd"),
    (b"x" * 400 + b"\n", "x" * 300 + " [cut]"),
])
def test_a_line_of_engine_output_is_made_printable_and_cut(raw, shown):
    assert printable(raw) == shown


@pytest.mark.parametrize("times, expected_logged, expected_report", [
    ([0.0] * 3, [True, True, False], [0, 0, 0]),
    ([0.0, 0.0, 0.0, 10.0, 10.0], [True, True, False, True, True], [0, 0, 0, 1, 0]),
])
def test_the_rate_limit_admits_a_burst_per_window_and_reports_what_it_dropped(times, expected_logged,
                                                                             expected_report):
    limit = RateLimit(burst=2, window_s=10.0)
    got = [limit.admit(t) for t in times]
    assert [g[0] for g in got] == expected_logged and [g[1] for g in got] == expected_report


# ---- a reply line that names no request ------------------------------------------------------------
@pytest.mark.parametrize("line, expected", [
    (b'{"id":7,"ok":1}', (7, 1)),
    (b"garbage{", None),
    (b'{"ok":1}', None),
    (b"[1,2]", None),
])
def test_a_reply_line_is_decoded_or_skipped(line, expected, caplog):
    assert Session.decode(line) == expected
    assert (expected is None) == any("SKB engine" in r.getMessage() for r in caplog.records)


def test_both_drivers_skip_a_line_that_names_no_request_and_go_on(caplog):
    caplog.set_level(logging.ERROR, logger="cod.skb")
    goal = "escape_reply_line('not json at all'), X = 1"
    with escaped() as skb:
        assert skb.execute_query("attacker", goal) == [{"X": 1}]
        assert skb.execute_query("attacker", "X = 2") == [{"X": 2}] and skb.restarts == 0

    async def run() -> None:
        engine = await AsyncSKB.start(EngineConfig(library_dir=ESCAPE))
        try:
            assert await engine.execute_query("attacker", goal) == [{"X": 1}]
            assert await engine.execute_query("attacker", "X = 2") == [{"X": 2}] and engine.restarts == 0
        finally:
            await engine.close()

    asyncio.run(run())
    assert sum("unreadable reply" in r.getMessage() for r in caplog.records) == 2


def test_a_link_in_place_of_the_direct_socket_does_not_get_its_permissions(tmp_path):
    """The private directory belongs to the engine's uid: a link it puts where the socket goes
    must not make the daemon (root) chmod another file."""
    from cod.skb.errors import SKBError
    from cod.skb.lifecycle import EngineProcess

    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    private = tmp_path / "engine"
    config = EngineConfig(load_library=False, private_dir=str(private), direct_socket=str(private / "direct.sock"))
    engine = EngineProcess(config, Session())
    (private / "direct.sock").symlink_to(victim)
    with pytest.raises(SKBError, match="direct.sock"):
        engine._set_socket_permissions(str(private / "direct.sock"), lambda p: os.chmod(p, 0o666))
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    engine.close()


@needs_root
@needs_landlock
def test_started_by_an_unprivileged_user_the_lockdown_does_what_it_can(open_dir):
    """`cod query` by a user: no uid to drop, but no_new_privs, Landlock and the filter hold."""
    import shutil

    from cod.skb import lockdown

    swipl = shutil.which("swipl")
    private = open_dir / "private"
    goal = (f"catch(open('{open_dir / 'written'}', write, _), E, (print_message(error, E), fail)) -> halt(1) ; "
            "read_file_to_string('/proc/self/status', S, []), "
            "sub_string(S, B, _, _, \"NoNewPrivs:\"), sub_string(S, B, 14, _, L), write(L), halt(0)")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 77
        try:
            os.dup2(write, 1)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            private.mkdir()
            if not os.access(lockdown.__file__, os.R_OK) or not os.access(swipl, os.X_OK):
                os._exit(77)
            code = lockdown.main(["--private", str(private), "--", swipl, "-q", "-f", "none", "-g", goal])
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as out:
        text = out.read()
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if status == 77:
        pytest.skip("swipl or this checkout cannot be read by uid 65534")
    assert status == 0 and text.split() == ["NoNewPrivs:", "1"], (status, text)
    assert not (open_dir / "written").exists()
