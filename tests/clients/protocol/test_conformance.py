"""The shared conformance table, run by both clients against one live daemon.

Python: every case through `cod.client.Client.call`.  C: the same file through libcod
(clients/c/tests/conformance.c), whose last line must report no failure.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from cod.client import Client, RMError
from helpers.paths import REPO
from helpers.conformance import CASES, error_mismatch, load_cases, mismatch
from helpers.rm_support import start_daemon

CDIR = REPO / "clients" / "c"
CASES_LIST = load_cases()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("conformance"), "--machine", "magnycours", "--log-level", "warning")
    yield d
    d.stop()


def run_case(path: Path, index: int, case: dict) -> str | None:
    """Why the Python client's outcome of a case differs from the table, or None."""
    with Client.connect(str(path), app=f"conf_{index}", reconnect=False) as c:
        for method, params in case.get("setup", []):
            c.call(method, params)
        method, params = case["call"]
        try:
            result = c.call(method, params)
        except RMError as err:
            if "error" not in case:
                return f"unexpected error {err.code}: {err.message}"
            return error_mismatch(case["error"], err.code, err.message, err.data)
        if "result" not in case:
            return f"expected error {case['error']['code']}, got result {result!r}"
        return mismatch(case["result"], result, "result")


@pytest.mark.parametrize("index", range(len(CASES_LIST)), ids=[c["name"] for c in CASES_LIST])
def test_python_client(daemon, index):
    why = run_case(daemon.path, index, CASES_LIST[index])
    assert why is None, why


def test_c_client(daemon):
    subprocess.run(["make", "-s", "-C", str(CDIR), "build/conformance"], check=True, capture_output=True)
    r = subprocess.run([str(CDIR / "build" / "conformance"), str(daemon.path), str(CASES)],
                       capture_output=True, text=True, timeout=300)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    m = re.fullmatch(r"(\d+) passed, (\d+) failed", last)
    assert m and int(m.group(1)) == len(CASES_LIST) and m.group(2) == "0", r.stdout + r.stderr
    assert r.returncode == 0
