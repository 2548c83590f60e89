"""Middleware settings of the policy node's process: received messages must not pin memory.

rmw_fastrtps gives every subscription a sample pool that is reallocated to the largest message
ever received and kept (PREALLOCATED_WITH_REALLOC): after one 4000x3000 rgb8 frame, each camera
subscription holds 36 MB for the rest of the process's life, whether the frame was used, refused
or never completed. With the DYNAMIC history memory policy a sample's buffer is allocated when it
arrives and freed once taken, so the node's memory returns to its steady state after any input.
The publishers keep rmw_fastrtps's defaults (asynchronous publication, reallocated pool: the
node's own messages are small).

Fast DDS takes that policy only from an XML profile, and only with RMW_FASTRTPS_USE_QOS_FROM_XML=1
(every QoS the node sets in code still applies). `fastdds_reader_memory` writes the profile to a
temporary file and points the process's environment at it, before the first node is created; a
user who configures Fast DDS themselves (a profiles file or RMW_FASTRTPS_USE_QOS_FROM_XML already
set) or runs another middleware is left alone.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from pathlib import Path
from typing import MutableMapping

PROFILE_XML = """<?xml version="1.0" encoding="UTF-8" ?>
<profiles xmlns="http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles">
  <data_reader profile_name="heisd_policy_node_reader" is_default_profile="true">
    <historyMemoryPolicy>DYNAMIC</historyMemoryPolicy>
  </data_reader>
  <data_writer profile_name="heisd_policy_node_writer" is_default_profile="true">
    <qos>
      <publishMode>
        <kind>ASYNCHRONOUS</kind>
      </publishMode>
    </qos>
    <historyMemoryPolicy>PREALLOCATED_WITH_REALLOC</historyMemoryPolicy>
  </data_writer>
</profiles>
"""
"""Readers: each sample's buffer freed once taken; writers: rmw_fastrtps's own defaults."""

USER_SETTINGS = ("FASTDDS_DEFAULT_PROFILES_FILE", "FASTRTPS_DEFAULT_PROFILES_FILE", "RMW_FASTRTPS_USE_QOS_FROM_XML")
"""Environment variables through which a user configures Fast DDS; any of them set: hands off."""


def fastdds_reader_memory(environ: MutableMapping[str, str] = os.environ) -> Path | None:
    """Point Fast DDS at `PROFILE_XML` (call before the process creates its first node); returns the
    profile's path, or None when the middleware is not Fast DDS or the user configures it. The file is
    removed when the process exits."""
    rmw = environ.get("RMW_IMPLEMENTATION", "")
    if (rmw and not rmw.startswith("rmw_fastrtps")) or any(environ.get(k) for k in USER_SETTINGS):
        return None
    fd, name = tempfile.mkstemp(prefix="heisd_fastdds_", suffix=".xml")
    with os.fdopen(fd, "w") as f:
        f.write(PROFILE_XML)
    path = Path(name)
    atexit.register(path.unlink, missing_ok=True)
    environ["FASTDDS_DEFAULT_PROFILES_FILE"] = str(path)
    environ["RMW_FASTRTPS_USE_QOS_FROM_XML"] = "1"
    return path
