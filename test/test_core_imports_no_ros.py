"""The ROS-free half stays ROS-free: importing heisd_ros.core, .models and .store (every module)
pulls in neither rclpy, nor the generated heisd_ros.msg, nor ROS message or launch packages.

Runs in a fresh interpreter so that nothing imported by other tests hides a violation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("heisd_ros.core", "heisd_ros.models", "heisd_ros.store")
FORBIDDEN = (
    "rclpy", "heisd_ros.msg", "launch", "launch_ros", "rosidl_runtime_py",
    "builtin_interfaces", "std_msgs", "sensor_msgs", "geometry_msgs", "diagnostic_msgs",
)

_PROBE = r"""
import importlib, json, pkgutil, sys, traceback

packages, forbidden = json.loads(sys.argv[1])

def loaded_forbidden():
    return {m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in forbidden)}

report = {"imported": [], "errors": {}, "culprits": {}}

def visit(name):
    before = loaded_forbidden()
    try:
        module = importlib.import_module(name)
    except Exception:  # report every module that fails, not only the first
        report["errors"][name] = traceback.format_exc(limit=-3)
        return
    report["imported"].append(name)
    new = loaded_forbidden() - before
    if new:
        report["culprits"][name] = sorted(new)
    for info in pkgutil.iter_modules(getattr(module, "__path__", []), name + "."):
        visit(info.name)

for package in packages:
    visit(package)
report["forbidden"] = sorted(loaded_forbidden())
print(json.dumps(report))
"""


def test_core_models_store_import_without_ros(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([PACKAGES, FORBIDDEN])],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])

    assert not report["errors"], "modules that fail to import:\n" + "\n".join(
        f"--- {name}\n{tb}" for name, tb in report["errors"].items())
    assert "heisd_ros.core.config" in report["imported"]
    assert "rclpy" not in report["forbidden"], report["culprits"]
    assert not [m for m in report["forbidden"] if m.startswith("heisd_ros.msg")], report["culprits"]
    assert not report["forbidden"], f"ROS modules imported (first importer: modules): {report['culprits']}"
    # Every module file under the three packages was visited.
    for package in PACKAGES:
        folder = REPO / package.replace(".", "/")
        for path in folder.rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            assert name in report["imported"], f"{name} was not imported"
