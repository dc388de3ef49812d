"""Issue 47, item 2, through the daemon: the query that killed the engine with SIGSEGV, on both of a
client's channels and as a derived property, is refused with a clear error and the engine lives on."""

from __future__ import annotations

import pytest

from cod.client import Client, CodError
from test_rm_security import engine_pid
from helpers.rm_support import start_daemon

CRASH = "tabled_call(between(1, inf, _)), fail"   # then "tabled_call(length(L, N))" crashed it
GOALS = (CRASH, "tabled_call(length(L, N))", "undefined", "trie_new(T)")


@pytest.mark.parametrize("direct", [True, False], ids=["direct channel", "through the daemon"])
def test_tabling_is_refused_and_the_engine_lives(tmp_path, direct):
    d = start_daemon(tmp_path, "--machine", "magnycours")
    try:
        pid = engine_pid(d)
        with Client(str(d.path), app="attacker") as c:
            c.direct_queries = direct
            for goal in GOALS:
                with pytest.raises(CodError) as err:
                    c.execute_query(goal)
                assert "not allowed in the sandbox" in err.value.message, err.value
            with pytest.raises(CodError) as err:
                c.register_task("t1", min_cores={"query": "tabled_call(length(L, N))", "var": "N"})
            assert "not allowed in the sandbox" in err.value.message or "tabl" in err.value.message, err.value
            assert c.execute_query("get_nr_cores(N)") == [{"N": 48}]
        assert engine_pid(d) == pid, "the engine was restarted"
    finally:
        d.stop()
