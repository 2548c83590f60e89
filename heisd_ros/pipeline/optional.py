"""Packages a few features of the node package need and its install does not pull (docs/install.md).

The node (`heisd_ros`) installs without them: h5py reads LIBERO-layout HDF5 demonstrations (setup.cfg
extra `hdf5`), matplotlib draws plots (extra `plots`), and the LIBERO workbench (`heisd_libero`, the
package beside the node) records the LIBERO bag of `heisd demo`. Each is imported where it is used,
inside `optional_dependency`, so that a missing one names what to install instead of a bare
ModuleNotFoundError:

    with optional_dependency("reading HDF5 demonstrations"):
        import h5py
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

from heisd_ros.core.errors import MissingDependencyError

WORKBENCH_INSTALL = "pip install -r heisd_libero/requirements.txt && pip install -e heisd_libero"
"""How the LIBERO workbench is installed (from the repository root; docs/install.md)."""
INSTALL: dict[str, str] = {
    "h5py": "pip install h5py (or the node's extra: pip install -e '.[hdf5]')",
    "matplotlib": "pip install matplotlib (or the node's extra: pip install -e '.[plots]')",
    "heisd_libero": f"it is the LIBERO workbench beside the node: {WORKBENCH_INSTALL}",
}
"""Top-level module -> how to install it."""


@contextmanager
def optional_dependency(feature: str) -> Iterator[None]:
    """Turn the ModuleNotFoundError of a missing optional package (a key of INSTALL) raised in the
    block into a MissingDependencyError naming `feature` and the install command; any other error
    passes unchanged."""
    try:
        yield
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if top not in INSTALL:
            raise
        raise MissingDependencyError(f"{feature} needs {top}, which is not installed: {INSTALL[top]}") from err


def installed(module: str) -> bool:
    """Whether a top-level module can be imported (without importing it)."""
    return importlib.util.find_spec(module) is not None
