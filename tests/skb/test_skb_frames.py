"""The direct channel's frame library (skb/native/cod_frames.c) under ASan and UBSan, and valgrind.

Its plunit tests (skb/prolog/cod_frames.plt) run in a real SWI-Prolog with the library loaded in
place of the engine's (COD_FRAMES_LIBRARY). That SWI-Prolog is its own `main` over libswipl
(tests/data/swipl_host.c), built here: Debian's `swipl` is linked with tcmalloc, whose threads
crash under valgrind and fight ASan's allocator. Its garbage-collection thread is not started
(`gc_thread` false before anything loads): ASan's teardown of that thread at `halt` fails in
ASan itself ("unable to unmap"), whatever was loaded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cod.skb.lifecycle import FRAMES_LIBRARY
from cod.skb.session import PROLOG_DIR

from helpers.paths import TESTS

SOURCE = FRAMES_LIBRARY.with_suffix(".c")
HOST = TESTS / "data" / "swipl_host.c"
CC = os.environ.get("CC") or shutil.which("cc") or "gcc"
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
# 4: the library was not loaded (so the C tests would not have run against it).
GOAL = ("set_prolog_flag(gc_thread, false), use_module(cod_frames), load_test_files([]), "
        "(cod_frames:c_frames -> true ; halt(4)), (run_tests(cod_frames) -> halt(0) ; halt(1))")


def runtime_variables() -> dict[str, str]:
    out = subprocess.run(["swipl", "--dump-runtime-variables"], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r'^(\w+)="(.*)";$', out, re.M))


def build(out: Path, source: Path, *flags: str) -> Path:
    home = runtime_variables()["PLBASE"]
    subprocess.run([CC, "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", f"-I{home}/include", *flags,
                    "-o", str(out), str(source), *(["-ljansson"] if "-shared" in flags else ["-lswipl"])],
                   check=True)
    return out


def run_units(command: list[str], library: Path, **env: str) -> str:
    home = runtime_variables()["PLBASE"]
    r = subprocess.run([*command, f"--home={home}", "-f", "none", "-g", GOAL, "-t", "halt(2)"],
                       capture_output=True, text=True, timeout=900, cwd=PROLOG_DIR,
                       env=dict(os.environ, COD_FRAMES_LIBRARY=str(library), **env))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    m = re.search(r"All (\d+) tests passed", out)
    assert m and int(m.group(1)) >= 50, out
    return out


def test_the_frame_library_passes_its_tests_under_asan_and_ubsan(tmp_path):
    # The library's file name gives its install function (install_cod_frames).
    lib = build(tmp_path / FRAMES_LIBRARY.name, SOURCE, "-shared", "-fPIC", *SANITIZE)
    host = build(tmp_path / "swipl_asan", HOST, *SANITIZE)
    out = run_units([str(host)], lib, ASAN_OPTIONS="detect_leaks=0:exitcode=86",
                    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87")
    assert "AddressSanitizer" not in out and "runtime error" not in out, out


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed (make setup installs it)")
def test_the_frame_library_passes_its_tests_under_valgrind(tmp_path):
    lib = build(tmp_path / FRAMES_LIBRARY.name, SOURCE, "-shared", "-fPIC")
    host = build(tmp_path / "swipl", HOST)
    out = run_units(["valgrind", "-q", "--error-exitcode=3", "--leak-check=no", str(host)], lib)
    assert not re.search(r"^==\d+==", out, re.M), out
