"""register_unmanaged checks the owner of the cgroup it uses (issue 47, item 4).

The finding: the daemon checked a cgroup's owner through one lookup of the path (``os.stat``) and
used the cgroup through another (``realpath``, then its ``cgroup.procs`` each period).  An
unprivileged uid that swapped what the path names between the two (a symbolic link, or on
cgroup v1 a rename inside its own delegated cgroup) had root's cgroup registered as its own group
with root as its owner: a group its CPU quota does not count.

These tests run the real daemon in this process, as root, with its real affinity enforcer, and a
real client as uid nobody.  The race is made deterministic: the attacker's move is made at the
one moment it matters, when the daemon has checked the owner and not used the cgroup yet (the
entry of `ElasticGroups.register`, which the request handler calls after its permission check).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cod.client import Client
from cod.client.errors import RMError
from cod.facts.procfs import format_cpu_list
from helpers.cgroups import cgroup_v1_root, enter, remove_tree, temp_cgroup
from helpers.procs import allowed_list
from helpers.rm_support import NOBODY, as_user, shared_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: cgroups, and a client as another uid")

def register(socket_path: str, cgroup: str, answer_fd: int) -> None:
    """What the attacker asks, as nobody (in a forked child: `as_user`); the answer goes to ``answer_fd``."""
    with Client(socket_path, app="attacker") as c:
        try:
            answer = {"group": c.register_unmanaged(cgroup=cgroup, name="race", period_s=0.5)}
        except RMError as err:
            answer = {"refused": type(err).__name__, "message": err.message}
    os.write(answer_fd, json.dumps(answer).encode())


def register_as_nobody(socket_path: str, cgroup: str) -> dict:
    read_end, write_end = os.pipe()
    try:
        assert as_user(NOBODY, register, socket_path, cgroup, write_end) == 0
        os.close(write_end)
        write_end = -1
        with os.fdopen(read_end, "rb") as f:
            read_end = -1
            return json.loads(f.read())
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)


def run_daemon_with_a_swap(tmp: Path, cgroup_arg: str, swap: Callable[[], None],
                           watched: list[int]) -> tuple[dict, list[dict], dict[int, str], bool]:
    """Start the daemon, have nobody register ``cgroup_arg`` while ``swap`` runs between the
    daemon's owner check and its use of the cgroup; (the answer, the groups then, the CPUs the
    ``watched`` processes may use then, whether the swap ran)."""
    from cod.rm.config import build_config
    from cod.rm.daemon import Daemon

    swapped: list[bool] = []

    async def scenario() -> tuple[dict, list[dict], dict[int, str]]:
        cfg = build_config(socket=str(tmp / "rm.sock"), enforce_mode="affinity", state_dir=str(tmp / "state"),
                           busy_detect=False, log_level="warning")
        daemon = Daemon(cfg)
        await daemon.start()
        groups = daemon.rm.demands.elastic
        real = groups.register

        async def register_after_the_swap(*args, **kwargs):
            swap()  # the attacker's move, after the permission check and before the cgroup is used
            swapped.append(True)
            return await real(*args, **kwargs)

        groups.register = register_after_the_swap
        try:
            loop = asyncio.get_running_loop()
            answer = await asyncio.wait_for(
                loop.run_in_executor(None, register_as_nobody, str(daemon.transport.path), cgroup_arg), 60)
            return answer, groups.listing(), {pid: allowed_list(pid) for pid in watched}
        finally:
            daemon.request_stop()
            await daemon.close()

    answer, listing, masks = asyncio.run(scenario())
    return answer, listing, masks, bool(swapped)


def started(user: int | None = None) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], user=user)


def test_a_symbolic_link_swapped_after_the_check_does_not_register_roots_cgroup():
    with shared_dir("cod-race-") as tmp, temp_cgroup("mine") as mine, temp_cgroup("roots") as roots:
        os.chown(mine, NOBODY, -1)  # delegated to nobody
        theirs, rootproc = started(NOBODY), started()
        try:
            enter(mine, theirs.pid)
            enter(roots, rootproc.pid)
            before = allowed_list(rootproc.pid)
            link = tmp / "cgroup"
            link.symlink_to(mine)

            def point_the_link_at_roots() -> None:
                (tmp / "cgroup.new").symlink_to(roots)
                os.replace(tmp / "cgroup.new", link)  # atomic, as an attacker's loop would do it

            answer, listing, masks, _ = run_daemon_with_a_swap(tmp, str(link), point_the_link_at_roots,
                                                               [rootproc.pid])
            assert all(g["owner_uid"] == NOBODY and g["cgroup"] != roots for g in listing), listing
            assert "group" not in answer or answer["group"]["owner_uid"] == NOBODY, answer
            # The path is looked up once, without following a symbolic link: refused, and it says why.
            assert answer.get("refused") == "InvalidRequest", answer
            assert f"{link} is a symbolic link (to {mine})" in answer["message"], answer
            assert masks[rootproc.pid] == before
        finally:
            for p in (theirs, rootproc):
                p.kill()
                p.wait()


V1 = cgroup_v1_root()


@pytest.mark.skipif(V1 is None, reason="needs a cgroup v1 hierarchy (v2 refuses renames)")
def test_a_v1_cgroup_renamed_after_the_check_is_not_the_one_used():
    """On cgroup v1 the owner of a delegated cgroup may rename the cgroups in it, a root-owned one
    too: the path it registered then names root's cgroup.  The group is the directory checked."""
    with shared_dir("cod-race-") as tmp, temp_cgroup("deleg", root=V1) as deleg:
        os.chown(deleg, NOBODY, -1)
        mine, roots = os.path.join(deleg, "theirs"), os.path.join(deleg, "roots")
        theirs, rootproc = started(NOBODY), started()
        try:
            os.mkdir(mine)
            os.chown(mine, NOBODY, -1)
            os.mkdir(roots)  # root's, inside nobody's cgroup
            enter(mine, theirs.pid)
            enter(roots, rootproc.pid)
            before = allowed_list(rootproc.pid)

            def rename_roots_to_theirs() -> None:  # nobody may do this: it owns the parent
                os.rename(mine, os.path.join(deleg, "was-theirs"))
                os.rename(roots, mine)

            answer, listing, masks, swapped = run_daemon_with_a_swap(tmp, mine, rename_roots_to_theirs,
                                                                     [theirs.pid, rootproc.pid])
            assert swapped and "group" in answer, answer
            group = answer["group"]
            assert group["owner_uid"] == NOBODY, group
            assert [g["owner_uid"] for g in listing] == [NOBODY], listing
            # Its member was nobody's process (now in was-theirs), pinned to the group's cores.
            assert group["members"] == 1 and masks[theirs.pid] == format_cpu_list(group["cores"]), (group, masks)
            assert masks[rootproc.pid] == before
        finally:
            for p in (theirs, rootproc):
                p.kill()
                p.wait()
            remove_tree(deleg)
