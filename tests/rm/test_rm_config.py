"""Settings: defaults, TOML file, flags; bad values are named."""

from __future__ import annotations

import os

import pytest

from cod.rm.config import ConfigError, RMConfig, build_config, default_socket_path


def test_flags_override_the_file_which_overrides_defaults(tmp_path):
    f = tmp_path / "rm.toml"
    f.write_text('socket = "/tmp/x.sock"\nrevoke_deadline_s = 1.5\nsocket_mode = "0660"\nlog_level = "debug"\n')
    cfg = build_config(f, log_level="warning")
    assert cfg.socket_path() == "/tmp/x.sock"
    assert cfg.revoke_deadline_s == 1.5
    assert cfg.socket_mode == 0o660
    assert cfg.log_level == "warning"


def test_rm_table_is_accepted(tmp_path):
    f = tmp_path / "rm.toml"
    f.write_text('[rm]\nmachine = "barcelona"\n')
    cfg = build_config(f)
    assert cfg.machine == "barcelona" and cfg.enforce is False  # planning-only implies no enforcement


@pytest.mark.parametrize(
    "text, needle",
    [("sockett = 1", "unknown setting 'sockett'"), ("revoke_deadline_s = -1", "revoke_deadline_s"),
     ("enforce = 3", "enforce"), ("socket_mode = \"rwx\"", "socket_mode"), ("x = [", "not valid TOML"),
     ('log_level = "loud"', "log level"), ("event_loop_rt_priority = 100", "event_loop_rt_priority 100 is above 99"),
     ("event_loop_rt_priority = -1", "event_loop_rt_priority must be"),
     ("event_loop_rt_priority = 1.5", "event_loop_rt_priority must be")],
)
def test_bad_settings_are_named(tmp_path, text, needle):
    f = tmp_path / "rm.toml"
    f.write_text(text + "\n")
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")):
        build_config(f)


@pytest.mark.parametrize("value", [0, 1, 99])
def test_the_event_loops_real_time_priority_is_0_to_99(tmp_path, value):
    f = tmp_path / "rm.toml"
    f.write_text(f"event_loop_rt_priority = {value}\n")
    assert build_config(f).event_loop_rt_priority == value
    assert RMConfig().event_loop_rt_priority == 0  # off unless asked for


def test_machine_and_hwloc_exclude_each_other():
    with pytest.raises(ConfigError, match="not both"):
        build_config(None, machine="magnycours", hwloc="/x.xml")


def test_default_socket_follows_the_environment(monkeypatch):
    monkeypatch.setenv("COD_SOCKET", "/tmp/elsewhere.sock")
    assert default_socket_path() == "/tmp/elsewhere.sock"
    monkeypatch.delenv("COD_SOCKET")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    expected = "/run/cod/rm.sock" if os.geteuid() == 0 else "/run/user/1000/cod/rm.sock"
    assert default_socket_path() == expected


@pytest.mark.parametrize(
    "text, needle",
    [('enforce_mode = "cgroups"', "enforce mode 'cgroups'"), ('solver = "magic"', "solver 'magic'"),
     ("busy_window = 0", "busy_window"), ("busy_threshold = -0.5", "busy_threshold"),
     ('confine_others = "yes"', "confine_others"), ("refresh_interval_s = 0", "refresh_interval_s"),
     ("solver_time_limit_s = -1", "solver_time_limit_s")],
)
def test_bad_enforcement_and_solver_settings_are_named(tmp_path, text, needle):
    f = tmp_path / "rm.toml"
    f.write_text(text + "\n")
    with pytest.raises(ConfigError, match=needle):
        build_config(f)


@pytest.mark.parametrize(
    "file, flags, mode, enforce",
    [("", {}, "auto", True),
     ('enforce_mode = "affinity"\n', {}, "affinity", True),
     ('enforce_mode = "affinity"\n', {"enforce_mode": "cpuset"}, "cpuset", True),
     ("", {"enforce_mode": "none"}, "none", False),
     ("", {"enforce": False}, "none", False),  # --no-enforce
     ('enforce_mode = "cpuset"\nmachine = "shanghai"\n', {}, "none", False)],  # planning only
)
def test_the_enforcement_mode_comes_from_file_then_flags(tmp_path, file, flags, mode, enforce):
    f = tmp_path / "rm.toml"
    f.write_text(file)
    cfg = build_config(f, **flags)
    assert (cfg.enforce_mode, cfg.enforce) == (mode, enforce)


@pytest.mark.parametrize("setting, root, confined", [(None, True, True), (None, False, False),
                                                     (False, True, False), (True, False, True)])
def test_confining_busy_processes_defaults_to_on_when_root(setting, root, confined):
    cfg = build_config(confine_others=setting)
    assert cfg.wants_confinement(root) is confined


def test_the_solver_defaults_to_cpsat_with_a_time_limit():
    cfg = build_config()
    assert (cfg.solver, cfg.solver_time_limit_s) == ("cpsat", 1.0)
    assert build_config(solver="greedy", solver_time_limit_s=0.2).solver_time_limit_s == 0.2


@pytest.mark.parametrize("flag, mode", [("socket_mode=0660", 0o660), ("socket_mode=666", 0o666),
                                        ("skb_user=nobody", None)])
def test_set_reads_a_socket_mode_as_octal_and_takes_the_engine_user(flag, mode):
    cfg = build_config(sets=[flag])
    if mode is not None:
        assert cfg.socket_mode == mode
    else:
        assert cfg.skb_user == "nobody"


def test_the_elastic_facts_refresh_settings_are_read_and_checked():
    """bench/elastic_pg_ab.py switches the SKB writes of a group off with these (issue 30)."""
    cfg = build_config(sets=["elastic_facts_refresh_s=3600", "elastic_facts_load_step=1000"])
    assert (cfg.elastic_facts_refresh_s, cfg.elastic_facts_load_step) == (3600.0, 1000.0)
    assert (build_config().elastic_facts_refresh_s, build_config().elastic_facts_load_step) == (10.0, 5.0)
    with pytest.raises(ConfigError, match="elastic_facts_load_step must be a positive number"):
        build_config(sets=["elastic_facts_load_step=-1"])
