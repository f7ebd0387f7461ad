"""Reader for the raw REALWORLD archive (RealWorld HAR 2016, University of Mannheim).

REALWORLD (T. Sztyler and H. Stuckenschmidt, "On-body Localization of Wearable Devices: An
Investigation of Position-Aware Activity Recognition", IEEE PerCom 2016,
doi:10.1109/PERCOM.2016.7456521): 15 subjects ``proband1`` .. ``proband15``, 8 activities,
7 body positions, phone accelerometer (m/s^2, gravity included) and gyroscope (rad/s) at a
nominal 50 Hz. Users download ``realworld2016_dataset.zip`` (``datasets/fetch_realworld.py``)
and point the loader at the zip or at the folder it was extracted to; the data never ships
with the project (``datasets/realworld/README.md``).

One module per job; this file only re-exports:

* :mod:`~har_models.data.realworld.config`: names of the archive and :class:`RealWorldConfig`;
* :mod:`~har_models.data.realworld.layout`: where subjects, sensor archives, parts and CSVs are
  (a folder, the zip, zip-in-zip; :class:`zipfile.Path` and :class:`pathlib.Path`);
* :mod:`~har_models.data.realworld.csvfile` and :mod:`~har_models.data.realworld.timestamps`: one
  CSV to a timestamped stream, with the time column's unit checked;
* :mod:`~har_models.data.realworld.anomalies`: the record of every irregularity met;
* :mod:`~har_models.data.realworld.recordings`: acc and gyro paired into recordings, and their windows;
* :mod:`~har_models.data.realworld.prepared`: a subject's windows through the per-subject cache.

Anomalies of the real archive, each handled, recorded as an :class:`Anomaly` in the result
and logged once through the ``har_models.data.realworld`` logger (kind names in brackets):

* zip-in-zip multi-part recordings (probands 4, 7, 14 climbing): the outer archive holds
  one inner archive per part; acc part 1 is ``acc_{act}_1_csv.zip`` but gyro part 1 is
  ``gyr_{act}_csv.zip``, parts 2-3 ``{st}_{act}_{i}_csv.zip``; CSVs may carry the part infix
  (``acc_{act}_2_{pos}.csv``). Acc and gyro are paired by (activity, position, part index),
  never by file name; each part is its own recording ``{act}/{pos}/part{i}`` [multipart];
* ``_2`` file names of single recordings (``acc_walking_2_shin.csv``) [odd_name]; several
  CSVs for one position [ambiguous_csv];
* missing archives [missing_archive], recordings [missing_recording] and one-sensor
  recordings [missing_sensor] (proband2 climbingup forearm, proband6 jumping thigh);
* gyroscope files with up to 3.8x more rows than the accelerometer: both streams are
  resampled onto one 50 Hz grid over their common span, the faster one low-passed before
  decimation, instead of being dropped as in FedDist [rate_mismatch]; streams covering
  different times: only the common span is used [span_mismatch], and none at all [no_overlap];
* duplicated [duplicate_stamps] and out-of-order [out_of_order] timestamps and gaps up to
  1.5 s [gaps], handled by :class:`~har_models.data.resample.Resampler` (first arrival wins; late
  samples beyond the reorder horizon dropped; no grid point or window inside a gap);
* time columns in another unit than milliseconds: converted when the unit is certain
  [time_unit], the file skipped with the suspected unit named otherwise [bad_time_unit];
* truncated or malformed rows [malformed_rows], a missing [no_header] or unusable
  [bad_header] header line, files without valid rows [empty], corrupt archives
  [corrupt_archive] and unreadable members [corrupt_member]: the row, file or archive is
  skipped, the rest of the subject loads;
* other members [unexpected_member] are ignored (``readMe``, hidden files and macOS
  ``__MACOSX`` folders silently).

Sources: the layout and the anomalies as found by the FedDist authors' preprocessing
(getalp/PerCom2021-FL, ``DATA_REALWORLD_SPLITSUB.ipynb``) and other public REALWORLD
loaders, summarised with references in ``datasets/realworld/README.md``; the FedDist
preprocessing this loader departs from (Ek et al., PerCom 2021) windows rows by index and
drops recordings whose acc and gyro lengths differ.
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
