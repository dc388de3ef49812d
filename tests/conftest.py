"""The tests' folders mirror the product (tests/rm/enforce/ tests rm/enforce/, ...).

pytest puts a test module's own folder on sys.path; this puts tests/ there too, so every test
imports the shared parts as ``helpers.*`` whatever folder it is in.  A few test modules import
another's fixtures by module name: the folders of those are listed in ``SHARED`` (basenames are
unique across folders: tests/project/test_tests_layout.py checks it).
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SHARED = ["rm", "rm/allocator", "rm/enforce", "rm/elastic", "clients/c", "clients/cscs", "clients/python"]

for folder in [TESTS, *(TESTS / name for name in SHARED)]:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
