"""Reference machines: fact files under facts/machines/NAME.json.

The files are generated from :mod:`cod.facts.synthetic` by
``python -m cod.facts.machines --write`` and checked in, so a user can read
and edit them; a test keeps them in step with the generator.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

from .model import FactsError, Machine
from .synthetic import REFERENCE_SHAPES, build

MACHINES_DIR = Path(__file__).resolve().parent / "machines"


def names() -> list[str]:
    return sorted(p.stem for p in MACHINES_DIR.glob("*.json"))


@lru_cache(maxsize=None)
def load(name: str) -> Machine:
    path = MACHINES_DIR / f"{name}.json"
    if not path.is_file():
        raise FactsError(f"unknown machine {name!r}; known machines: {', '.join(names())}")
    try:
        return Machine.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as err:
        raise FactsError(f"{path}: not a valid machine fact file: {err}") from err


def write_reference_files() -> None:
    MACHINES_DIR.mkdir(exist_ok=True)
    for name, shape in REFERENCE_SHAPES.items():
        text = json.dumps(build(shape).to_dict(), indent=1) + "\n"
        (MACHINES_DIR / f"{name}.json").write_text(text)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_reference_files()
    else:
        print("usage: python -m cod.facts.machines --write", file=sys.stderr)
        sys.exit(2)
