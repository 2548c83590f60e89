"""The `heisd` command line holds the node package's commands only; a command that moved to the LIBERO
workbench says where it went instead of running."""

from __future__ import annotations

import pytest

from heisd_ros.tools import cli


def test_every_command_is_the_node_packages() -> None:
    assert all(module.startswith("heisd_ros.tools.") for module, _ in cli.COMMANDS.values())
    assert not set(cli.COMMANDS) & set(cli.MOVED)


@pytest.mark.parametrize("name", cli.MOVED)
def test_a_moved_command_names_its_new_command_line(name, capsys) -> None:
    assert cli.main([name, "--help"]) == 2
    assert f"moved: heisd-libero {name}" in capsys.readouterr().err


def test_an_unknown_command_lists_the_commands(capsys) -> None:
    assert cli.main(["fly"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'fly'" in err and "build-db" in err and "eval-libero" not in err
