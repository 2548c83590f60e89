#!/usr/bin/env bash
# Standalone (non-workspace) setup: a venv at <repo>/.venv with everything heisd_ros needs,
# including the ROS 2 Kilted client libraries from the registry wheels and our own generated
# interfaces (heisd_ros.msg), and the LIBERO workbench beside it (heisd_libero). Idempotent: a
# no-op when nothing it depends on has changed.
#
#   usage: scripts/setup_venv.sh            (or: make setup)
#   env:   HEISD_PYTHON   interpreter for a new venv (default: python3.11)
#
# Steps (docs/install.md explains the why):
#   1. create .venv with python3.11 if missing
#   2. pip install torch==2.13.0 first (the CPU wheel on local disk), then requirements.txt
#   3. rewrite the wheel build image's Python/numpy include paths in $VIRTUAL_ENV/share/**/*.cmake
#   4. colcon build ONLY the interfaces into the venv (-DHEISD_INSTALL_PYTHON=OFF)
#   5. pip install -e . --no-deps (console scripts `heisd`, `policy_node`; source tree imports),
#      then pip install -e heisd_libero --no-deps (the workbench: console script `heisd-libero`)
#   6. check from /tmp that `import heisd_ros` and `import heisd_libero` are the source tree and
#      heisd_ros.msg imports
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
STAMP="$VENV/.heisd_setup_stamp"
BUILD="$ROOT/build"

inputs_hash() {
    # Everything whose change requires re-running a step below.
    sha256sum requirements.txt requirements-runtime.txt requirements-dev.txt CMakeLists.txt package.xml setup.cfg setup.py \
        heisd_libero/requirements.txt heisd_libero/pyproject.toml \
        scripts/setup_venv.sh msg/*.msg action/*.action | sha256sum | cut -d' ' -f1
}

up_to_date() {
    [[ -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$(inputs_hash)" ]]
}

if up_to_date; then
    echo "setup_venv: .venv is up to date"
    exit 0
fi

# Engineers share this tree: never let two setups write the same venv at once.
mkdir -p "$BUILD"
exec 9>"$BUILD/.setup_venv.lock"
flock 9
if up_to_date; then
    echo "setup_venv: .venv is up to date"
    exit 0
fi

start_s=$SECONDS
log() { echo "setup_venv [$((SECONDS - start_s))s]: $*"; }

# 1. venv ---------------------------------------------------------------------------------
if [[ ! -x "$PY" ]]; then
    base_python="${HEISD_PYTHON:-python3.11}"
    if ! command -v "$base_python" >/dev/null 2>&1; then
        echo "setup_venv: '$base_python' not found (the torch wheel is cp311); set HEISD_PYTHON" >&2
        exit 1
    fi
    log "creating .venv with $base_python"
    "$base_python" -m venv "$VENV"
fi
rm -f "$STAMP"
export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
PIP=("$PY" -m pip --disable-pip-version-check)

# 2. Python packages ----------------------------------------------------------------------
# torch first and alone: the pinned version is the CPU wheel on local disk; any other version
# (or a resolver that is free to choose) would download GBs. requirements.txt pins it too.
log "pip install torch==2.13.0"
"${PIP[@]}" install --quiet "torch==2.13.0"
log "pip install -r requirements.txt"
"${PIP[@]}" install --quiet -r requirements.txt
"$PY" - <<'PY'
import sys
from importlib.metadata import version
v = version("torch")
if not v.startswith("2.13.0"):
    sys.exit(f"setup_venv: expected torch 2.13.0, found {v}")
PY

# 3. Point the wheels' exported CMake files at this venv's Python and numpy headers ----------
log "rewriting wheel build paths in .venv/share/**/*.cmake"
"$PY" - <<'PY'
import pathlib
import re
import sys
import sysconfig

import numpy

py_include = sysconfig.get_paths()["include"]
np_include = numpy.get_include()
if not pathlib.Path(py_include, "Python.h").is_file():
    sys.exit(f"setup_venv: no Python.h in {py_include} (Python development headers missing)")
# The wheels were built in a manylinux image: /opt/python/cp311-cp311/...
numpy_path = re.compile(
    r"/opt/python/cp3\d+-cp3\d+t?/lib/python3\.\d+t?/site-packages/numpy/_?core/include")
python_path = re.compile(r"/opt/python/cp3\d+-cp3\d+t?/include/python3\.\d+t?")
changed = 0
for path in pathlib.Path(sys.prefix, "share").rglob("*.cmake"):
    text = path.read_text()
    if "/opt/python/" not in text:
        continue
    new = python_path.sub(py_include, numpy_path.sub(np_include, text))
    if new != text:
        path.write_text(new)
        changed += 1
print(f"setup_venv: rewrote {changed} file(s) -> {py_include}, {np_include}")
PY

# 4. The interfaces only, into the venv ----------------------------------------------------
log "colcon build (interfaces only) into .venv"
if ! CMAKE_PREFIX_PATH="$VENV" AMENT_PREFIX_PATH="$VENV" \
    "$VENV/bin/colcon" --log-base "$BUILD/log" build \
    --paths "$ROOT" \
    --merge-install \
    --install-base "$VENV" \
    --build-base "$BUILD/colcon" \
    --cmake-args -DHEISD_INSTALL_PYTHON=OFF -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$PY"; then
    echo "setup_venv: colcon build failed; log: $BUILD/log/latest_build/heisd_ros/stdout_stderr.log" >&2
    tail -n 40 "$BUILD/log/latest_build/heisd_ros/stdout_stderr.log" >&2 || true
    exit 1
fi

# The generated heisd_ros.msg lives outside sys.path (.venv/lib/heisd_ros_interfaces) and is
# reached through site-packages/heisd_ros.pkg (see CMakeLists.txt): a heisd_ros directory in
# site-packages (e.g. from an older or a full build into the venv) would shadow the source tree.
site_packages="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ -e "$site_packages/heisd_ros" ]]; then
    log "removing $site_packages/heisd_ros (it would shadow the source tree)"
    rm -rf "$site_packages/heisd_ros"
fi
if [[ ! -f "$site_packages/heisd_ros.pkg" ]]; then
    echo "setup_venv: colcon build did not write $site_packages/heisd_ros.pkg" >&2
    exit 1
fi

# 5. The source tree, editable: the node, then the workbench beside it ----------------------
log "pip install -e . --no-deps"
"${PIP[@]}" install --quiet --no-deps --no-build-isolation -e "$ROOT"
log "pip install -e heisd_libero --no-deps"
"${PIP[@]}" install --quiet --no-deps --no-build-isolation -e "$ROOT/heisd_libero"

# 6. Check from a neutral directory -------------------------------------------------------
got="$(cd /tmp && "$PY" -c '
import heisd_ros, heisd_ros.core.config
from heisd_ros.msg import ArmCommand, DecodeStats
import heisd_libero, heisd_libero.cli
print(heisd_ros.__file__, heisd_libero.__file__)')"
if [[ "$got" != "$ROOT/heisd_ros/__init__.py $ROOT/heisd_libero/__init__.py" ]]; then
    echo "setup_venv: import heisd_ros, heisd_libero give '$got', expected the source tree $ROOT" >&2
    exit 1
fi

inputs_hash >"$STAMP"
log "done (.venv ready: $PY)"
