"""The package's native helpers, built by every install (pip, a wheel, an sdist, `make setup`).

The metadata is in pyproject.toml; this file adds the two shared objects of the SKB engine that
skb/lifecycle.py finds by path in cod/skb/native/:

- ``cod_noexec.so``: the engine's seccomp filter against execve (preloaded by skb/lockdown.py);
- ``cod_frames.so``: the direct channel's frames in C (SWI-Prolog's foreign headers, jansson).

They are not Python extensions: each keeps its plain name (no ``.cpython-311-...`` tag) and
links no Python.  Each is optional: a machine without a compiler, jansson or SWI-Prolog's headers
still gets a working install, and the daemon says at start which helper is missing and the command
that builds it (skb/native_libs.py).  An editable install (``make setup``) builds them in place,
in skb/native/.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# As the house style asks of every C file; a warning is an error here too, which, the helpers
# being optional, leaves that helper out (and says so) rather than building one nobody checked.
C_FLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]
SWIPL_INCLUDE_FALLBACK = "/usr/lib/swi-prolog/include"  # Debian's swi-prolog-nox


def swipl_include() -> str:
    """SWI-Prolog's foreign headers: PLBASE/include of the swipl on PATH, else Debian's place."""
    swipl = shutil.which("swipl")
    if swipl:
        try:
            out = subprocess.run([swipl, "--dump-runtime-variables"], capture_output=True, text=True,
                                 timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():
            if line.startswith("PLBASE="):
                return os.path.join(line.split("=", 1)[1].strip('";'), "include")
    return SWIPL_INCLUDE_FALLBACK


class BuildNativeHelpers(build_ext):
    """build_ext for plain shared objects loaded by path: ``cod/skb/native/NAME.so``."""

    def build_extensions(self) -> None:
        # The compiler Python was configured with ($CC wins), but none of Python's own flags,
        # include and library paths or run path: nothing here links or includes Python.
        cc = os.environ.get("CC", "").split() or self.compiler.compiler_so[:1]
        self.compiler.set_executables(compiler_so=[*cc, "-fPIC"], linker_so=[*cc, "-shared"])
        self.compiler.set_include_dirs([])
        self.compiler.set_library_dirs([])
        self.compiler.set_runtime_library_dirs([])
        super().build_extensions()

    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return ext.export_symbols  # no PyInit_ function: this is no Python module


NATIVE_HELPERS = [
    Extension("cod.skb.native.cod_noexec", ["skb/native/cod_noexec.c"], extra_compile_args=C_FLAGS,
              optional=True),
    Extension("cod.skb.native.cod_frames", ["skb/native/cod_frames.c"], include_dirs=[swipl_include()],
              libraries=["jansson"], extra_compile_args=C_FLAGS, optional=True),
]

setup(ext_modules=NATIVE_HELPERS, cmdclass={"build_ext": BuildNativeHelpers})
