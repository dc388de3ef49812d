"""`cod rm` settings end to end: --config TOML, socket ownership and mode, --hwloc planning daemons."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

import pytest

from helpers.data import HWLOC_DIR
from helpers.rm_support import RawConn, start_daemon

TOPOLOGIES = HWLOC_DIR


def test_config_file_sets_the_socket_mode_group_and_machine(tmp_path):
    group = grp.getgrgid(os.getgid()).gr_name
    cfg = tmp_path / "rm.toml"
    cfg.write_text(f'[rm]\nmachine = "nehalem-ex"\nsocket_mode = "0660"\nsocket_group = "{group}"\n'
                   f'revoke_deadline_s = 0.25\nlog_level = "debug"\n')
    d = start_daemon(tmp_path, "--config", str(cfg))
    try:
        st = os.stat(d.path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
        c = RawConn(d.path)
        info = c.hello()
        assert info["machine"] == "nehalem-ex" and info["enforce"] is False
        assert "DEBUG" in d.log_text()  # log_level from the file
    finally:
        d.stop()


@pytest.mark.parametrize("xml, cpus", [("192em64t-24n8c2t.xml", 384), ("64amd64-4p2n4ca2co.xml", 64),
                                       ("16amd64-4distances.xml", 16)])
def test_hwloc_file_gives_a_planning_daemon_for_that_machine(tmp_path, xml, cpus):
    path = TOPOLOGIES / xml
    if not path.exists():
        pytest.skip(f"{path} not present")
    d = start_daemon(tmp_path, "--hwloc", str(path))
    try:
        c = RawConn(d.path)
        assert c.hello()["enforce"] is False
        assert c.call("execute_query", {"goal": "get_nr_cores(N)"})["result"]["solutions"][0]["N"] == cpus
        r = c.call("register_task", {"name": "db", "properties": {"min_cores": 2, "max_cores": cpus // 2,
                                                                  "sensitive": ["numa"]}})["result"]
        assert len(r["allocation"]["cores"]) == cpus // 2 and r["allocation"]["numa_nodes"]
    finally:
        d.stop()


def test_half_sent_frames_of_many_peers_share_one_bounded_budget(tmp_path):
    import socket
    import struct

    cfg = tmp_path / "rm.toml"
    cfg.write_text('machine = "shanghai"\nmax_buffered_input_bytes = 3000000\n')
    d = start_daemon(tmp_path, "--config", str(cfg))
    try:
        peers, refused = [], 0
        for _ in range(6):  # each announces a 1 MiB frame and sends ~0.9 MiB of it
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(d.path))
            s.settimeout(5)
            try:
                s.sendall(struct.pack(">I", 1 << 20) + b" " * 900_000)
            except OSError:
                pass  # refused while still sending: the error frame is read below
            peers.append(s)
        for s in peers:
            s.settimeout(1)
            try:
                data = s.recv(4096)
            except socket.timeout:
                continue  # still held: within the budget
            except OSError:
                data = b"reset"
            if data and (b"incomplete frames" in data or data == b"reset"):
                refused += 1
        assert refused == 3  # 3 x 0.9 MB fit in 3 MB; the others are refused
        c = RawConn(d.path)
        assert c.hello()["machine"] == "shanghai"
    finally:
        d.stop()
