"""Where a client's labelled windows come from: replayed dataset subjects (live sensors later).

A source (:class:`har_models.subjects.SubjectSource`) names recordings and carries the
client's train/test split; :func:`ingest_source` feeds the recordings through the same
sensor pipeline a device uses (resampling onto the 50 Hz grid, windowing) and stores the
windows with that split in the client's store. A source already ingested (same files,
same settings, same split) is not read again.
"""

from __future__ import annotations

import logging

from edge_client.replay import replay_windows
from edge_client.store import ClientStore
from har_models.subjects import SubjectSource, load_windows, recordings_of
from har_models.windowing import WindowSet

log = logging.getLogger("fedhar.client.sources")


def ingest_source(store: ClientStore, spec: SubjectSource, speed: float | None = None) -> tuple[int, int]:
    """Make sure the store holds this source's windows; return ``(n_train, n_test)``.

    Parameters
    ----------
    store : ClientStore
    spec : SubjectSource
        The recordings and the split (``spec.split``: stratified 80/20 with its seed).
    speed : float, optional
        Replay the recordings paced at ``speed`` times real time (1.0 = 50 Hz wall clock),
        sample batches arriving as from a sensor driver; None feeds them at once. Both give
        the same windows (the pipeline is chunking-invariant).

    Raises
    ------
    ValueError, OSError
        If the recordings cannot be read (the message names the file).
    """
    fp = spec.store_key()
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
    return store.replace_windows(fp, data, split=spec.split)
