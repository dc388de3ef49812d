"""The SKB engine's native helpers: where they are, what a missing one costs, and the command that
builds them for the install at hand.

Every install builds them (setup.py: a wheel, an sdist, ``make setup``'s editable install), each
only if it can: a machine without a C compiler, jansson or SWI-Prolog's headers gets a working
install without the helper.  The daemon says so once at its start (:func:`startup_warning`); a
one-shot command (``cod query``, ``cod plan``, ``cod shell --machine``) says nothing, as each of
its calls would say it again.
"""

from __future__ import annotations

import json
import shlex
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

NATIVE_DIR = Path(__file__).resolve().parent / "native"
NOEXEC_LIBRARY = NATIVE_DIR / "cod_noexec.so"
# The direct channel's frames in C (native/cod_frames.c); the engine is told where it is
# (COD_FRAMES_LIBRARY) and reads its frames in Prolog without it.
FRAMES_LIBRARY = NATIVE_DIR / "cod_frames.so"

DISTRIBUTION = "cod-policy-engine"
# What a helper's absence costs, by file name.
WITHOUT = {
    NOEXEC_LIBRARY.name: "the SKB engine runs without its seccomp filter against execve",
    FRAMES_LIBRARY.name: "the SKB engine reads the direct channel's frames in Prolog, at about twice the CPU",
}
# What building them needs (Debian's names); `make setup` installs these itself.
BUILD_NEEDS = "a C compiler, jansson and SWI-Prolog's headers (Debian: gcc libc6-dev libjansson-dev swi-prolog-nox)"


def missing(directory: Path | None = None) -> list[str]:
    """The helpers' file names that are not built in ``directory`` (default: this install's)."""
    where = NATIVE_DIR if directory is None else directory
    return [name for name in WITHOUT if not (where / name).exists()]


def installed_from() -> dict | None:
    """This install's PEP 610 record (direct_url.json: a checkout, an editable checkout, an sdist or
    a wheel file), or None (installed from an index, or not installed at all)."""
    # The first installed copy that has one: a build's .egg-info in the current directory (a
    # checkout) is a distribution too, without the record.
    for dist in metadata.distributions(name=DISTRIBUTION):
        text = dist.read_text("direct_url.json")
        try:
            record = json.loads(text) if text else None
        except ValueError:
            continue
        if isinstance(record, dict):
            return record
    return None


def fix_command(record: dict | None, python: str = sys.executable) -> str:
    """The command that builds the helpers for an install made as ``record`` (installed_from) says."""
    url = record.get("url", "") if record else ""
    parsed = urlparse(url)
    local = unquote(parsed.path) if parsed.scheme == "file" else ""
    editable = bool(record and isinstance(record.get("dir_info"), dict) and record["dir_info"].get("editable"))
    if editable and local and (Path(local) / "Makefile").exists():
        return f"make -C {shlex.quote(local)} setup"
    pip = f"{shlex.quote(python)} -m pip install --force-reinstall --no-deps"
    if local.endswith(".whl"):  # the wheel was built where the helpers could not be: build from source
        source = "SOURCE  (the checkout or sdist " + Path(local).name + " was built from)"
        return f"install {BUILD_NEEDS}, then {pip} {source}"
    if local:
        return f"install {BUILD_NEEDS}, then {pip} {shlex.quote(local)}"
    if url:
        return f"install {BUILD_NEEDS}, then {pip} {shlex.quote(url)}"
    return f"install {BUILD_NEEDS}, then {pip} --no-binary {DISTRIBUTION} {DISTRIBUTION}"


def startup_warning(directory: Path | None = None, fix: str | None = None) -> str | None:
    """One sentence naming each helper that is not built, what that costs and the command that
    builds it (``fix``, default: this install's :func:`fix_command`); None when both are built."""
    absent = missing(directory)
    if not absent:
        return None
    costs = "; ".join(f"{name} is not built: {WITHOUT[name]}" for name in absent)
    how = fix if fix is not None else fix_command(installed_from())
    return f"{costs}. To build {'it' if len(absent) == 1 else 'them'}: {how}"
