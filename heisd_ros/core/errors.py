"""One exception hierarchy for the whole package.

Callers catch `HeisdError` (or a subclass) and never a bare `Exception`. Every raise inside the
package chains its cause with `raise ... from err` so the original failure stays visible.
"""


class HeisdError(Exception):
    """Base class of every error raised on purpose by heisd_ros."""


class ConfigError(HeisdError, ValueError):
    """A configuration value is missing, out of range or inconsistent with another."""


class InvalidObservationError(HeisdError, ValueError):
    """An observation cannot be acted on: wrong image shape/dtype, NaN pose, missing view."""


class InputLimitError(InvalidObservationError):
    """An input lies beyond a configured limit (instruction length, frame size, workspace, pose jump);
    it is refused before any work is spent on it."""


class UnknownTaskError(HeisdError, KeyError):
    """The instruction/task has no entry where one is required (database partition, norm stats)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown task"


class ModelLoadError(HeisdError):
    """A model, drafter or statistics file is missing, corrupt or does not match the expected shapes."""


class DatabaseError(HeisdError):
    """The demonstration database failed (base class for the store errors below)."""


class DatabaseUnavailableError(DatabaseError):
    """The database cannot be reached or opened (server down, timeout, files missing)."""


class EmptyDatabaseError(DatabaseError):
    """The database (or the task's partition) holds no demonstrations."""


class CalibrationError(HeisdError):
    """A calibration file is unreadable or inconsistent."""


class DataFileError(HeisdError):
    """An input data file (demonstration HDF5, rosbag2) is malformed or unsafe to read."""


class BagError(DataFileError):
    """A rosbag2 directory is missing or damaged, or cannot be written."""


class MissingDependencyError(HeisdError, ImportError):
    """A package one feature needs, and the node package's install does not pull, is not installed
    (h5py, matplotlib, the LIBERO workbench: heisd_ros.pipeline.optional)."""
