"""Build the package's small C helpers on first use, cached by the hash of their source.

``pip install`` ships the .c files; they are compiled with the system's C compiler
into ``$XDG_CACHE_HOME/cod`` (else ``~/.cache/cod``, else a temporary directory).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import DeployError

HERE = Path(__file__).resolve().parent
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread"]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for candidate in (Path(base) / "cod", Path(tempfile.gettempdir()) / f"cod-{os.geteuid()}"):
        try:
            candidate.mkdir(parents=True, exist_ok=True)
            if os.access(candidate, os.W_OK):
                return candidate
        except OSError:
            continue
    raise DeployError("no writable cache directory to build the C helpers in")


def build(source: str | Path, extra_flags: tuple[str, ...] = ()) -> Path:
    """The executable built from ``source`` (a file name in this package, or a path)."""
    src = Path(source) if os.sep in str(source) else HERE / str(source)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise DeployError(f"no C compiler (cc or gcc) to build {src.name}; install gcc")
    flags = CFLAGS + list(extra_flags)
    digest = hashlib.sha256(src.read_bytes() + " ".join([cc, *flags]).encode()).hexdigest()[:16]
    exe = cache_dir() / f"{src.stem}-{digest}"
    if exe.exists():
        return exe
    tmp = exe.with_name(f"{exe.name}.{os.getpid()}.tmp")
    proc = subprocess.run([cc, *flags, "-o", str(tmp), str(src)], capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise DeployError(f"building {src.name} failed:\n{proc.stderr.strip()}")
    os.replace(tmp, exe)  # atomic: two builders at once both end with a whole file
    return exe
