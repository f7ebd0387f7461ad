"""Reader for the raw REALWORLD archive (RealWorld HAR 2016, University of Mannheim).

REALWORLD (Sztyler and Stuckenschmidt, IEEE PerCom 2016, doi:10.1109/PERCOM.2016.7456521):
15 subjects, 8 activities, 7 body positions, phone accelerometer (m/s^2, gravity included) and
gyroscope (rad/s) at a nominal 50 Hz. Users download ``realworld2016_dataset.zip``
(``datasets/fetch_realworld.py``); the data never ships with the project. This file only
re-exports: ``config``, ``layout`` (where things are), ``csvfile`` and ``timestamps`` (one CSV
to a stream), ``anomalies``, ``recordings`` (acc and gyro paired, and windows), ``prepared``
(the per-subject cache).

Every anomaly of the real archive is handled, recorded as an :class:`Anomaly` and logged once
(kinds in brackets; sources and details in ``datasets/realworld/README.md``): zip-in-zip
multi-part recordings, each part its own ``{act}/{pos}/part{i}``, acc and gyro paired by
(activity, position, part), never by name [multipart]; ``_2`` names of single recordings
[odd_name]; several CSVs for one position [ambiguous_csv]; [missing_archive],
[missing_recording], [missing_sensor]; gyroscopes with up to 3.8x the accelerometer's rows,
resampled onto one grid rather than dropped as in FedDist [rate_mismatch]; [span_mismatch],
[no_overlap]; [duplicate_stamps], [out_of_order] and [gaps] up to 1.5 s, handled by the
:class:`~har_models.data.resample.Resampler`; time units other than ms, converted when certain
[time_unit], else skipped [bad_time_unit]; [malformed_rows], [no_header], [bad_header],
[empty], [corrupt_archive], [corrupt_member] skip the row, file or archive; other members are
ignored [unexpected_member] (``readMe``, hidden files, ``__MACOSX`` silently).
"""

from har_models.data.realworld.anomalies import WARNING_KINDS, Anomaly
from har_models.data.realworld.config import (
    ACTIVITIES,
    ARCHIVE_PREFIX,
    CSV_COLUMNS,
    CSV_PREFIX,
    NOMINAL_RATE_HZ,
    POSITIONS,
    SENSORS,
    RealWorldConfig,
)
from har_models.data.realworld.csvfile import MAX_TIME_SPREAD_MS, parse_realworld_csv, read_realworld_csv
from har_models.data.realworld.layout import realworld_subject_ids, subject_has_sensor_pair
from har_models.data.realworld.prepared import REALWORLD_CACHE_FORMAT, PreparedSubject, load_realworld_subject
from har_models.data.realworld.recordings import (
    RATE_MISMATCH_RATIO,
    SPAN_MISMATCH_SHARE,
    RealWorldSubject,
    read_realworld_subject,
    realworld_subject_windows,
    recording_from_csv_files,
)
from har_models.data.realworld.timestamps import TimeUnitGuess, guess_time_unit

__all__ = [
    "ACTIVITIES",
    "ARCHIVE_PREFIX",
    "CSV_COLUMNS",
    "CSV_PREFIX",
    "MAX_TIME_SPREAD_MS",
    "NOMINAL_RATE_HZ",
    "POSITIONS",
    "RATE_MISMATCH_RATIO",
    "REALWORLD_CACHE_FORMAT",
    "SENSORS",
    "SPAN_MISMATCH_SHARE",
    "WARNING_KINDS",
    "Anomaly",
    "PreparedSubject",
    "RealWorldConfig",
    "RealWorldSubject",
    "TimeUnitGuess",
    "guess_time_unit",
    "load_realworld_subject",
    "parse_realworld_csv",
    "read_realworld_csv",
    "read_realworld_subject",
    "realworld_subject_ids",
    "realworld_subject_windows",
    "recording_from_csv_files",
    "subject_has_sensor_pair",
]
