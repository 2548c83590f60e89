"""An embedded database's build manifest: which model (digest, dtype) and how many query views its
vectors were computed with, and which episodes are done. Written by `heisd build-db`, read by
whatever opens the database to check that its vectors fit the loaded model."""

from __future__ import annotations

from pathlib import Path

from heisd_ros.core.errors import DatabaseError
from heisd_ros.core.files import read_json

MANIFEST = "build_db_manifest.json"


def manifest_path(db_path: str | Path) -> Path:
    return Path(db_path) / MANIFEST


def read_manifest(db_path: str | Path | None) -> dict | None:
    """The manifest as a dict; None when there is none or it is unreadable (that is build-db's
    business: the store itself may still open fine). One over `MAX_JSON_BYTES` is a DatabaseError
    naming it: no build writes one, and it is not read to find out."""
    if not db_path:
        return None
    path = manifest_path(db_path)
    if not path.is_file():
        return None
    try:
        data = read_json(path, DatabaseError)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
