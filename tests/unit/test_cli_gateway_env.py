"""`reliable gateway start`'s environment for the Go program (reliable_cli.gateway)."""

from __future__ import annotations

from reliable_cli.gateway import QUIET_MONITOR, go_runtime_env


def test_the_monitor_is_kept_quiet_and_procs_set() -> None:
    env = go_runtime_env({"PATH": "/bin"}, 1)
    assert env == {"PATH": "/bin", "GOMAXPROCS": "1", "GODEBUG": QUIET_MONITOR}
    assert "GOMAXPROCS" not in go_runtime_env({}, None)


def test_a_godebug_of_the_callers_own_comes_after_and_wins() -> None:
    # Go reads GODEBUG left to right at start: a later setting of a name overrides it
    env = go_runtime_env({"GODEBUG": "schedtrace=0,madvdontneed=1"}, None)
    assert env["GODEBUG"] == f"{QUIET_MONITOR},schedtrace=0,madvdontneed=1"


def test_the_callers_environment_is_not_changed() -> None:
    mine = {"GODEBUG": "gctrace=1"}
    go_runtime_env(mine, 2)
    assert mine == {"GODEBUG": "gctrace=1"}
