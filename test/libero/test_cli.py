"""The `heisd-libero` command line: the workbench's commands, dispatched like `heisd`'s."""

from __future__ import annotations

import subprocess
import sys

import pytest

from heisd_ros.tools import cli as node_cli

from heisd_libero import cli


def test_the_workbench_holds_the_commands_that_left_heisd() -> None:
    assert set(node_cli.MOVED) <= set(cli.COMMANDS)
    assert not set(cli.COMMANDS) & set(node_cli.COMMANDS)  # one home per command
    assert all(module.startswith("heisd_libero.") for module, _ in cli.COMMANDS.values())


@pytest.mark.parametrize("name", ["build-db", "demo"])
def test_a_node_command_is_sent_to_heisd(name, capsys) -> None:
    assert cli.main([name]) == 2
    assert f"heisd {name}" in capsys.readouterr().err


def test_python_dash_m_runs_the_command_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "heisd_libero", "--help"], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0 and "eval-libero" in proc.stdout, proc.stderr
