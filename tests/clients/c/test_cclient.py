"""libcod, the C client (clients/c): built, installed, and its C test program run against a
real `cod rm` plain, under AddressSanitizer + UndefinedBehaviorSanitizer and under valgrind;
the paper's Listing 1 in C; a short run of the reply parser's fuzz target.

The C test program starts the daemon itself from the command line it is given (it kills and
restarts it to test reconnection); it runs in a session of its own, killed whole at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from cod.facts import from_args
from helpers.paths import REPO
from test_client_listing1 import expected_cores
from helpers.rm_support import COD, start_daemon
from test_rm_write_outcomes import DAEMON_ARGS as WRITE_OUTCOME_ARGS, engine_pid

CDIR = REPO / "clients" / "c"
BUILD = CDIR / "build"
DAEMON_ARGS = ["--machine", "magnycours", "--revoke-deadline", "0.5", "--log-level", "warning"]


def make(*targets: str) -> None:
    r = subprocess.run(["make", "-s", "-C", str(CDIR), *targets], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def built():
    make("all", "check-progs")
    return BUILD


def run_test_program(cmd: list[str], tmp_path: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    sock = tmp_path / "rm.sock"
    full = cmd + ["--socket", str(sock), "--", *COD, "rm", "--socket", str(sock), *DAEMON_ARGS]
    proc = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=os.environ | {"UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"})
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the program and every daemon it started
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(full, proc.returncode, out, err)


def assert_all_passed(r: subprocess.CompletedProcess[str], at_least: int = 900) -> None:
    lines = r.stdout.strip().splitlines()
    last = lines[-1] if lines else ""
    m = re.fullmatch(r"(\d+) passed, (\d+) failed", last)
    assert m, f"no summary line; stdout:\n{r.stdout}\nstderr:\n{r.stderr[-5000:]}"
    assert m.group(2) == "0" and int(m.group(1)) >= at_least, r.stderr[-5000:]
    assert r.returncode == 0, r.stderr[-5000:]


def test_c_program(built, tmp_path):
    r = run_test_program([str(built / "test_cod")], tmp_path, timeout=600)
    assert_all_passed(r)


def test_c_program_under_sanitizers(built, tmp_path):
    make("asan")
    r = run_test_program([str(built / "test_cod_san")], tmp_path, timeout=600)
    assert "ERROR: AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-5000:]
    assert "LeakSanitizer" not in r.stderr, r.stderr[-5000:]
    assert_all_passed(r)


@pytest.mark.slow
def test_c_program_under_valgrind(built, tmp_path):
    valgrind = shutil.which("valgrind")
    assert valgrind, "valgrind is installed by `make setup`"
    cmd = [valgrind, "--leak-check=full", "--show-leak-kinds=definite,indirect,possible",
           "--errors-for-leak-kinds=definite,indirect,possible", "--error-exitcode=99", str(built / "test_cod"),
           "--quick"]
    r = run_test_program(cmd, tmp_path, timeout=1500)
    assert "ERROR SUMMARY: 0 errors" in r.stderr, r.stderr[-5000:]
    assert_all_passed(r)


@pytest.mark.parametrize("program", ["test_write_outcomes", "test_write_outcomes_san"])
def test_c_write_outcomes_with_a_stopped_engine(built, tmp_path, program):
    """libcod against a daemon whose SKB engine the program stops: COD_EUNKNOWN, never a failure, and
    cod_retry learns the first outcome without applying the write twice (test_rm_write_outcomes.py);
    plain and under AddressSanitizer + UndefinedBehaviorSanitizer."""
    if program.endswith("_san"):
        make("asan")
    d = start_daemon(tmp_path, *WRITE_OUTCOME_ARGS)
    try:
        r = subprocess.run([str(built / program), str(d.path), str(engine_pid(d.proc.pid))], capture_output=True,
                           text=True, timeout=300, env=os.environ | {"UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"})
    finally:
        d.stop()
    assert "ERROR: AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-5000:]
    assert_all_passed(r, at_least=20)


def test_install_and_pkg_config(built, tmp_path):
    prefix = tmp_path / "prefix"
    make("install", f"PREFIX={prefix}")
    for rel in ("include/cod.h", "include/cod_paper.h", "lib/libcod.a", "lib/libcod.so", "lib/libcod.so.0",
                "lib/pkgconfig/cod.pc"):
        assert (prefix / rel).exists(), rel
    # Only the cod_ API is exported from the shared library.
    nm = subprocess.run(["nm", "-D", "--defined-only", str(prefix / "lib" / "libcod.so")], capture_output=True,
                        text=True, check=True)
    names = [line.split()[-1] for line in nm.stdout.splitlines() if line.strip()]
    assert names and all(n.startswith("cod_") for n in names), [n for n in names if not n.startswith("cod_")]
    # A program built with pkg-config's flags against the installed library.
    src = tmp_path / "hello.c"
    src.write_text("#include <cod.h>\n#include <cod_paper.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
                   'int main(void) { cod_conn *c = cod_connect("/nonexistent/rm.sock", NULL);\n'
                   '  printf("%s|%s\\n", c ? "connected" : "refused", cod_connect_error());\n'
                   '  char *q = cod_quote_atom("it\'s"); printf("%s\\n", q); free(q); return c != NULL; }\n')
    env = os.environ | {"PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "cod"], capture_output=True, text=True, env=env,
                           check=True).stdout.split()
    assert f"-I{prefix}/include" in flags and "-lcod" in flags and f"-Wl,-rpath,{prefix}/lib" in flags
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", str(src), "-o",
                    str(tmp_path / "hello"), *flags], check=True, env=env)
    # It runs as built: cod.pc's run path finds libcod.so.0 in the private prefix (no LD_LIBRARY_PATH).
    run_env = {k: v for k, v in env.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run([str(tmp_path / "hello")], capture_output=True, text=True, env=run_env)
    assert r.returncode == 0 and r.stdout.splitlines() == ["refused|no COD daemon answers on /nonexistent/rm.sock: "
                                                           "No such file or directory", "'it\\'s'"], r.stdout


def run_listing1(sock: Path, sla_ms: int) -> tuple[int, dict[str, object], str]:
    r = subprocess.run([str(BUILD / "listing1"), "--socket", str(sock), "--sla-ms", str(sla_ms)],
                       capture_output=True, text=True, timeout=60)
    lines: dict[str, object] = {}
    for line in r.stdout.splitlines():
        title, _, value = line.partition(": ")
        lines.setdefault(title, json.loads(value))
    return r.returncode, lines, r.stderr


@pytest.mark.parametrize("machine, sla_ms", [("magnycours", 3000), ("magnycours", 200), ("nehalem-ex", 100)])
def test_listing1_in_c(built, tmp_path, machine, sla_ms):
    d = start_daemon(tmp_path, "--machine", machine)
    try:
        rc, out, err = run_listing1(d.path, sla_ms)
    finally:
        d.stop()
    assert rc == 0, err
    n = expected_cores(from_args(machine=machine), sla_ms)
    derived = out["deployment derived by the SKB"]
    assert derived["NrCores"] == n and derived["Status"] == 0
    assert f"db_rtime({sla_ms})" in out["facts pushed"]
    assert out["upcall allocation_changed"]["cores"]  # the registration's upcall
    assert len(out["allocation"]["cores"]) == n and out["allocation"]["numa_nodes"]
    assert out["timing"]["connect_to_first_upcall_ms"] > 0


def test_listing1_in_c_reports_a_machine_too_small(built, tmp_path):
    d = start_daemon(tmp_path, "--machine", "shanghai")  # 16 cores
    try:
        rc, out, err = run_listing1(d.path, 10)  # needs ~135 cores
    finally:
        d.stop()
    assert rc == 2 and "not enough free cores" in err


def test_fuzz_reply_parser_short_run(tmp_path):
    assert shutil.which("clang"), "clang is installed by `make setup`"
    make("fuzz")
    corpus = tmp_path / "corpus"
    shutil.copytree(CDIR / "fuzz" / "corpus", corpus)
    r = subprocess.run([str(BUILD / "fuzz_reader"), "-runs=100000", "-max_total_time=120", f"-artifact_prefix={tmp_path}/",
                        str(corpus)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-5000:]
    assert re.search(r"Done \d+ runs", r.stderr), r.stderr[-2000:]
