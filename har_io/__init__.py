"""fedhar's I/O adapters, shared by the edge client and the coordinator.

The pure core (:mod:`har_models`) holds math and formats only; everything that touches
the network, the command line, credentials or the operating system lives here:
:mod:`har_io.mqtt_link` (the MQTT link), :mod:`har_io.cli` (options generated from the
typed configuration, logging), :mod:`har_io.files` (crash-safe writes) and
:mod:`har_io.memory` (returning freed heap to the OS).
"""

from har_io.files import atomic_write, atomic_write_bytes, fsync_dir

__all__ = ["atomic_write", "atomic_write_bytes", "fsync_dir"]
