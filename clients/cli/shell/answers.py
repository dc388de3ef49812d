"""Answers one at a time over a protocol that returns them in batches.

``execute_query`` returns the first N solutions of a goal.  To show answers
one at a time as SWI-Prolog's top level does, and to know whether the answer
shown is the last one (``X = 3.``) or more may follow (``X = 1 ;``), the
stream asks for one solution more than it shows, and asks again for twice as
many when the user has gone through what it has (so n answers cost O(n)
solutions in all, not O(n^2)).  A goal is re-run from the start each time:
the SKB forbids side effects in queries (docs/skb-schema.md), so its answers
come in the same order, unless facts changed in between.

When looking ahead fails (the next solution runs into the time or inference
limit), the stream asks again for exactly the answer the user wants, shows it,
and reports that more *may* follow; the error is raised only when that answer
itself cannot be had.  No I/O here: ``fetch(n)`` does the asking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

Fetch = Callable[[int], list[dict[str, Any]]]

MAX_SOLUTIONS = 10_000  # the protocol's upper bound for max_solutions


@dataclass(frozen=True)
class Answer:
    solution: dict[str, Any]
    index: int  # 0-based
    more: bool | None  # True: another answer exists; False: this is the last; None: unknown


class AnswerStream:
    def __init__(self, fetch: Fetch, *, first_batch: int = 2, limit: int = MAX_SOLUTIONS,
                 is_limit_error: Callable[[Exception], bool] | None = None) -> None:
        self._fetch = fetch
        self._first_batch = max(2, first_batch)
        self.limit = limit
        self._cache: list[dict[str, Any]] = []
        self._complete = False  # the cache holds every solution
        self._next = 0
        self.capped = False  # stopped at `limit` solutions with more possibly beyond
        self._is_limit_error = is_limit_error or (lambda err: True)
        self._ceiling: int | None = None  # the fewest solutions whose asking failed
        self._error: Exception | None = None
        self.fetches = 0

    def _load(self, want: int) -> None:
        """Make the cache hold `want` solutions (or all there are, or as many as can be had)."""
        if self._complete or len(self._cache) >= want:
            return
        ask = min(self.limit, max(want, 2 * len(self._cache), self._first_batch))
        if self._ceiling is not None:
            ask = min(ask, self._ceiling - 1)
        if ask >= want:
            try:
                self._take(self._ask(ask), ask)
                return
            except Exception as err:
                if not self._is_limit_error(err):
                    raise
        # Looking ahead ran into a limit: settle for the answer the user asked for.
        need = want - 1
        if len(self._cache) >= need:
            return
        if self._ceiling is not None and need >= self._ceiling:
            assert self._error is not None
            raise self._error
        self._take(self._ask(need), need)

    def _ask(self, n: int) -> list[dict[str, Any]]:
        self.fetches += 1
        try:
            return self._fetch(n)
        except Exception as err:
            if self._is_limit_error(err):
                # Asking for n solutions (or more) hits a limit; the goal is deterministic.
                self._ceiling = n if self._ceiling is None else min(self._ceiling, n)
                self._error = err
            raise

    def _take(self, got: list[dict[str, Any]], asked: int) -> None:
        self._cache = got
        if len(got) < asked:
            self._complete = True
        elif asked == self.limit:
            self._complete = True
            self.capped = True

    def next(self) -> Answer | None:
        """The next answer, or None when there is none (the top level's ``false``)."""
        i = self._next
        self._load(i + 2)  # this answer and one more, to know if it is the last
        if i >= len(self._cache):
            return None
        self._next += 1
        if len(self._cache) > i + 1:
            more: bool | None = True
        elif self._complete:
            more = None if self.capped else False
        else:
            more = None
        return Answer(self._cache[i], i, more)

    @property
    def shown(self) -> int:
        return self._next
