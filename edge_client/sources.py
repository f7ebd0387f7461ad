"""Where a client's labelled windows come from: replayed dataset subjects (live sensors later).

A source (:class:`har_models.subjects.SubjectSource`) names recordings; :func:`ingest_source` feeds them through the same sensor
pipeline a device uses (resampling onto the 50 Hz grid, windowing) and stores the windows
with their train/test split in the client's store. A source already ingested (same
files, same settings) is not read again.
"""

from __future__ import annotations

import logging

from edge_client.replay import replay_windows
from edge_client.store import ClientStore
from har_models.subjects import TEST_FRACTION, SubjectSource, load_windows, recordings_of
from har_models.windowing import WindowSet

log = logging.getLogger("fedhar.client.sources")


def ingest_source(store: ClientStore, spec: SubjectSource, split_seed: int = 1, speed: float | None = None) -> tuple[int, int]:
    """Make sure the store holds this source's windows; return ``(n_train, n_test)``.

    Parameters
    ----------
    store : ClientStore
    spec : SubjectSource
    split_seed : int
        Seed of the stratified 80/20 split.
    speed : float, optional
        Replay the recordings paced at ``speed`` times real time (1.0 = 50 Hz wall clock),
        sample batches arriving as from a sensor driver; None feeds them at once. Both give
        the same windows (the pipeline is chunking-invariant).

    Raises
    ------
    ValueError, OSError
        If the recordings cannot be read (the message names the file).
    """
    fp = spec.fingerprint() + f"|seed={split_seed}"
    if store.has_source(fp):
        return len(store.windows("train")), len(store.windows("test"))
    if speed is None:
        data = load_windows(spec)
    else:
        parts = []
        for rec in recordings_of(spec):
            log.info("replaying %s %s (%.0f s of recording) at %gx real time", rec.subject, rec.session, rec.duration_s, speed)
            parts.append(replay_windows(rec, spec.labels, speed=speed))
        data = WindowSet.concat(parts, spec.labels)
    if len(data) == 0:
        log.warning("source %s yielded no labelled windows", spec.path)
    return store.replace_windows(fp, data, test_fraction=TEST_FRACTION, seed=split_seed)
