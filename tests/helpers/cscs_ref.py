"""A plain reference for the CSCS engine (clients/cscs): the same table, built
by a Python port of its generator, and a full scan per request.

Mirrors clients/cscs/schema.c (change both together).  Used to check every
answer the engine gave, from the file its ``--results`` option writes.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CSCS_DIR = REPO / "clients" / "cscs"

M64 = (1 << 64) - 1
TUPLES_PER_KEY = 4
# (type, width) of the 48 attributes: id, key, 30 x int32, 7 x int64, 9 x char.
SCHEMA: list[tuple[str, int]] = (
    [("i64", 8), ("i64", 8)]
    + [("i32", 4)] * 30
    + [("i64", 8)] * 7
    + [("char", w) for w in (3, 3, 8, 8, 15, 15, 20, 20, 31)]
)
assert len(SCHEMA) == 48 and sum(w for _, w in SCHEMA) == 315

Row = list  # [id, key, ...]: ints, and str for char attributes


def build(target: str = "cscs") -> Path:
    """Build the engine (``cscs`` or ``build/cscs_asan``) and return its path."""
    subprocess.run(["make", "-s", "-C", str(CSCS_DIR), target], check=True)
    return CSCS_DIR / target


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def signed(x: int, bits: int) -> int:
    x &= (1 << bits) - 1
    return x - (1 << bits) if x >> (bits - 1) else x


def nkeys(ntuples: int) -> int:
    return max(1, ntuples // TUPLES_PER_KEY)


def generate_row(seedh: int, n_keys: int, tid: int) -> Row:
    def mix(slot: int) -> int:
        return splitmix64((seedh + (tid << 8) + slot) & M64)

    row: Row = [tid, mix(4) % n_keys]
    for attr in range(2, 48):
        kind, width = SCHEMA[attr]
        if kind == "i32":
            row.append(signed(mix(attr * 4), 32))
        elif kind == "i64":
            row.append(signed(mix(attr * 4), 64))
        else:
            chars = []
            h = 0
            for j in range(width):
                if j % 12 == 0:
                    h = mix(attr * 4 + j // 12)
                chars.append(chr(ord("a") + ((h >> (5 * (j % 12))) & 31) % 26))
            row.append("".join(chars))
    return row


def generate_table(seed: int, ntuples: int) -> list[Row]:
    seedh = splitmix64(seed)
    n_keys = nkeys(ntuples)
    return [generate_row(seedh, n_keys, tid) for tid in range(ntuples)]


@dataclass
class Query:
    key: int
    answer: list[Row] = field(default_factory=list)


@dataclass
class Batch:
    seq: int
    cpus: str
    updates: list[tuple[int, int, int]] = field(default_factory=list)  # key, attr, value
    queries: list[Query] = field(default_factory=list)


def parse_results(path: Path) -> list[Batch]:
    batches: list[Batch] = []
    for line in path.read_text().splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "B":
            seq, cpus = rest.split(" ")
            batches.append(Batch(int(seq), cpus))
        elif tag == "U":
            key, attr, value = map(int, rest.split(" "))
            batches[-1].updates.append((key, attr, value))
        elif tag == "Q":
            key, _n = map(int, rest.split(" "))
            batches[-1].queries.append(Query(key))
        elif tag == "R":
            fields = rest.split(" ")
            row: Row = [v if SCHEMA[i][0] == "char" else int(v) for i, v in enumerate(fields)]
            batches[-1].queries[-1].answer.append(row)
        else:
            raise ValueError(f"{path}: unexpected line {line!r}")
    return batches


def check_answers(table: list[Row], batches: list[Batch]) -> int:
    """Replay the batches on ``table`` (updates first, then queries, as the
    engine's batch semantics say) and assert every answer; returns the
    number of answers checked."""
    by_key: dict[int, list[int]] = {}
    for row in table:
        by_key.setdefault(row[1], []).append(row[0])
    checked = 0
    for batch in batches:
        for key, attr, value in batch.updates:
            assert SCHEMA[attr][0] != "char" and attr >= 2, (batch.seq, attr)
            for tid in by_key.get(key, []):
                table[tid][attr] = value
        for i, q in enumerate(batch.queries):
            expected = [table[tid] for tid in sorted(by_key.get(q.key, []))]
            assert q.answer == expected, f"batch {batch.seq} query {i} (key {q.key}) on CPUs {batch.cpus}"
            checked += 1
    return checked
