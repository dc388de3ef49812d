"""tests/ mirrors the product (issue 49): a test module lives in the folder of what it tests.

tests/rm/enforce/ tests rm/enforce/, tests/clients/c/ tests clients/c/, and so on; tests/project/
holds the checks of the whole tree, tests/vm/ the guests' suites, tests/bench/ the benches'
accounting.  Module names stay unique across folders, because pytest imports each by its name.
"""

from __future__ import annotations

from collections import Counter

from helpers.paths import REPO, TESTS


NOT_PRODUCT = {"project", "vm", "bench", "helpers", "data"}


def modules() -> list:
    return [p for p in TESTS.rglob("test_*.py") if "data" not in p.relative_to(TESTS).parts]


def test_no_test_module_is_left_at_the_top() -> None:
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_every_folder_names_a_folder_of_the_product() -> None:
    folders = {p.parent.relative_to(TESTS) for p in modules()}
    wrong = [str(f) for f in folders if f.parts[0] not in NOT_PRODUCT and not (REPO / f).is_dir()]
    assert wrong == [], f"tests/{wrong} mirror no folder of the product"


def test_module_names_are_unique() -> None:
    twice = [name for name, n in Counter(p.name for p in modules()).items() if n > 1]
    assert twice == []
