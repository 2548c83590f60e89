"""Every documented `heisd`, `heisd-libero` and `policy_node` command line runs as written.

The command lines are read from the fenced code blocks of README.md and docs/*.md. A `heisd`
command is parsed by its own tool's argument parser, a `heisd-libero` command (the LIBERO
workbench's, skipped where heisd_libero is not installed) likewise (the tool stops right after
parsing: a usage error fails the test, and nothing trains or simulates); no page may still run a
command that moved to the workbench as `heisd <command>`. A `policy_node` command is run for
real, with the placeholders (MODEL, my_db, /path/to/checkpoint, ...) replaced by the mini policy's
files and a small database of random points built for it, until the node is active; then SIGINT,
exit 0. `ros2 ...` lines need a workspace and are left to test/ros/test_workspace_build.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # policy_node subprocesses with the mini policy

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MINI = REPO / "models" / "mini_libero"
DOMAIN_ID = 98


def documented_commands() -> list[tuple[str, str]]:
    """(file name, command line) of every heisd / policy_node line in a fenced block, continuation
    lines joined, comments cut, `;`-separated commands apart."""
    out = []
    for path in DOCS:
        for block in re.findall(r"```[a-z]*\n(.*?)```", path.read_text(), re.S):
            current = ""
            for line in block.split("\n"):
                current += line.rstrip()
                if current.endswith("\\"):
                    current = current[:-1] + " "
                    continue
                line, current = re.sub(r"\s+#.*$", "", current).strip(), ""
                for cmd in (c.strip() for c in re.split(r";|&&", line)):
                    if re.match(r"^(nice (-n \d+ )?)?(\.venv/bin/)?(heisd|heisd-libero|policy_node)(\s|$)", cmd):
                        out.append((path.name, re.sub(r"^nice (-n \d+ )?", "", cmd)))
    return out


COMMANDS = documented_commands()
WORKBENCH_COMMANDS = ("gen-demos", "dagger", "train-vla", "eval-libero", "skip-checks", "publish-mini", "sim-episodes",
                      "sim-demo", "sim-arm")
"""heisd_libero.cli's commands, named here so that collecting this file needs no workbench (a test
below checks they are the same)."""


def _is_command(command: str, program: str, subcommands) -> bool:
    """`program` alone, with --help or with a subcommand (a printed table row starting with the
    method name is not)."""
    words = command.split()
    return bool(re.match(rf"^(\.venv/bin/)?{program}$", words[0])) and (
        len(words) == 1 or words[1] in (*subcommands, "-h", "--help"))


def _heisd_subcommands():
    from heisd_ros.tools.cli import COMMANDS as SUBCOMMANDS

    return SUBCOMMANDS


HEISD = [(f, c) for f, c in COMMANDS if _is_command(c, "heisd", _heisd_subcommands())]
WORKBENCH = [(f, c) for f, c in COMMANDS if _is_command(c, "heisd-libero", WORKBENCH_COMMANDS)]
NODE = [(f, c) for f, c in COMMANDS if re.match(r"^(\.venv/bin/)?policy_node(\s|$)", c)]


def test_the_docs_hold_the_commands_users_type():
    names = {c.split()[1] for _, c in HEISD if len(c.split()) > 1}
    assert {"build-db", "calibrate", "train-drafter", "replay", "demo"} <= names
    assert {c.split()[1] for _, c in WORKBENCH if len(c.split()) > 1} >= {"eval-libero", "gen-demos"}
    assert len(NODE) >= 4


def test_no_page_runs_a_moved_command_as_heisd():
    """`heisd gen-demos` and the other workbench commands are `heisd-libero <command>` now, in code
    blocks and in the prose alike (docs/history.md records the past and keeps the old names)."""
    from heisd_ros.tools.cli import MOVED

    found = [f"{path.name}: heisd {m.group(1)}" for path in DOCS if path.name != "history.md"
             for m in re.finditer(rf"(?<![\w/-])heisd ({'|'.join(MOVED)})\b", path.read_text())]
    assert found == []


def test_the_workbench_commands_are_the_workbenchs():
    from heisd_ros.tools.cli import MOVED

    cli = pytest.importorskip("heisd_libero.cli", reason="the LIBERO workbench is not installed")
    assert set(WORKBENCH_COMMANDS) == set(cli.COMMANDS)
    assert set(MOVED) <= set(cli.COMMANDS)  # what left heisd lives in the workbench


class _Parsed(Exception):
    """Raised right after a tool's arguments parsed: the command line is valid, nothing runs."""


def _parses(cli, where: str, command: str, monkeypatch, capsys) -> None:
    """`command` parsed by `cli.main` up to its tool's arguments (nothing runs)."""
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        parse(self, args, namespace)  # a usage error exits 2 here
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    argv = [os.path.expandvars(a) for a in shlex.split(command)[1:]]
    if argv[:1] in ([], ["-h"], ["--help"]):  # the program alone prints its commands
        assert cli.main(argv) == 0
        return
    with pytest.raises((_Parsed, SystemExit)) as stopped:
        cli.main(argv)
    assert stopped.type is _Parsed, f"{where}: `{command}` is a usage error:\n{capsys.readouterr().err}"


@pytest.mark.parametrize("where, command", HEISD, ids=[f"{f}: {c[:60]}" for f, c in HEISD])
def test_heisd_command_parses(where, command, monkeypatch, capsys):
    from heisd_ros.tools import cli

    _parses(cli, where, command, monkeypatch, capsys)


@pytest.mark.parametrize("where, command", WORKBENCH, ids=[f"{f}: {c[:60]}" for f, c in WORKBENCH])
def test_heisd_libero_command_parses(where, command, monkeypatch, capsys):
    cli = pytest.importorskip("heisd_libero.cli", reason="the LIBERO workbench is not installed")
    _parses(cli, where, command, monkeypatch, capsys)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The mini policy's files and a database of random points with its dimensions."""
    import numpy as np

    from heisd_ros.core.config import StoreConfig
    from heisd_ros.models.loader import load_vla
    from heisd_ros.store import make_store
    from heisd_ros.store.schema import DemoPoint

    root = tmp_path_factory.mktemp("docs_commands")
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.pipeline.calibration import apply_calibration

    vla = load_vla(MINI / "vla")
    views = apply_calibration(DecoderConfig(), MINI / "calibration.json").query_view_count  # the shipped point's
    obs_dim, feat_dim = views * vla.query_dim, vla.hidden_size
    rng = np.random.default_rng(0)
    task = "pick up the alphabet soup and place it in the basket"
    first = vla.action_tokenizer.first_token_id
    points = [DemoPoint("docs", task, task, 0, k, rng.normal(size=obs_dim), rng.normal(size=feat_dim),
                        rng.normal(size=feat_dim), np.zeros(7), tuple(int(t) for t in rng.integers(first, first + 256, 7)),
                        rng.uniform(-0.1, 0.1, 3)) for k in range(8)]  # fmt: skip
    with make_store(StoreConfig(backend="edge", path=str(root / "db")), obs_dim, feat_dim, create=True) as store:
        store.upsert(points)
    params = root / "my_policy.yaml"
    params.write_text(json.dumps({"/**": {"ros__parameters": {
        "model_dir": str(MINI / "vla"), "drafter_dir": str(MINI / "drafter"), "db_path": str(root / "db"),
        "calibration_path": str(MINI / "calibration.json")}}}))  # JSON is YAML
    return {"vla": str(MINI / "vla"), "drafter": str(MINI / "drafter"), "db": str(root / "db"),
            "calibration": str(MINI / "calibration.json"), "params": str(params)}


def _substituted(command: str, files: dict) -> list[str]:
    """The command with its placeholders replaced by real files, as argv for this venv."""
    swaps = {"MODEL": files["vla"], "/path/to/checkpoint": files["vla"], "my_vla": files["vla"],
             "my_drafter": files["drafter"], "/path/to/drafter": files["drafter"], "my_db": files["db"],
             "artifacts/mini_db": files["db"], "/path/to/db": files["db"],
             "my_calibration.json": files["calibration"], "my_policy.yaml": files["params"]}  # fmt: skip
    argv = []
    for arg in shlex.split(command)[1:]:
        key, sep, value = arg.rpartition(":=")
        if sep and value in swaps:
            arg = f"{key}:={swaps[value]}"
        argv.append(swaps.get(arg, arg))
    return [sys.executable, "-m", "heisd_ros.ros.node", *argv]


@pytest.mark.parametrize("where, command", NODE, ids=[f"{f}: {c[:70]}" for f, c in NODE])
def test_policy_node_command_starts(where, command, files):
    argv = _substituted(command, files)
    env = {**os.environ, "ROS_DOMAIN_ID": str(DOMAIN_ID), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, deadline = [], time.monotonic() + 90.0
    wanted = "waiting for configure" if "autostart:=false" in command else ": active:"
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if wanted in line:
                break
        started = any(wanted in line for line in lines)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + out
    assert started, f"{where}: `{command}` did not start:\n{text[-3000:]}"
    assert proc.returncode == 0 and "Traceback" not in text, f"{where}: `{command}`:\n{text[-3000:]}"
