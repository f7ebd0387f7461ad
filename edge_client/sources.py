"""Where a client's labelled windows come from: replayed dataset subjects (live sensors later).

A source (:class:`har_models.data.subjects.SubjectSource`) names recordings and carries the
client's train/test split; :func:`ingest_source` feeds the recordings through the same
sensor pipeline a device uses (resampling onto the 50 Hz grid, windowing) and stores the
windows with that split in the client's store. A source already ingested (same files,
same settings, same split) is not read again.

Any split works. The FedDist paper's split is decided from labels alone, in the store. The
leak-free ``blocks`` split needs the windows' start times and drops the gap windows, and
the ``label_skew`` partition needs the subject's name and drops the classes the client does
not keep: those are decided here with :func:`har_models.data.splits.kept_and_split` (the very
function the coordinator's evaluation harness uses through :meth:`SubjectSource.train_test
<har_models.data.subjects.SubjectSource.train_test>`), and only the kept windows reach the store.
"""

from __future__ import annotations

import logging

from edge_client.freshness import SensingHealthMeter
from edge_client.sensors.replay import ReplaySource
from edge_client.store import ClientStore
from har_models.data.pipeline import SensorPipeline
from har_models.data.splits import kept_and_split
from har_models.data.subjects import SubjectSource, load_windows, recordings_of
from har_models.data.windowing import WindowSet

log = logging.getLogger("fedhar.client.sources")


def ingest_source(
    store: ClientStore, spec: SubjectSource, speed: float | None = None, health: SensingHealthMeter | None = None
) -> tuple[int, int]:
    """Make sure the store holds this source's kept windows under ``spec.split``; return ``(n_train, n_test)``.

    Parameters
    ----------
    store : ClientStore
    spec : SubjectSource
        The recordings and the split (``spec.split``, any kind and partition).
    speed : float, optional
        Replay the recordings paced at ``speed`` times real time (1.0 = 50 Hz wall clock),
        sample batches arriving as from a sensor driver; None feeds them at once. Both give
        the same windows (the pipeline is chunking-invariant).
    health : SensingHealthMeter, optional
        With ``speed``: measures each replayed recording's pipeline (the last one's figures
        remain), so the status reports the rates, gaps and late samples the pipeline received.
        Not fed when the store already holds the source or ``speed`` is None (no pipeline runs).

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
            pipe = SensorPipeline(spec.labels, rec.labels)  # as replay_windows, with the meter watching
            if health is not None:
                health.watch(pipe)
            got: list[WindowSet] = []

            def take(ws: WindowSet, got: list[WindowSet] = got) -> None:
                got.append(ws)
                if health is not None:
                    health.note(ws)

            ReplaySource(rec, speed).run(pipe, take)
            parts.append(WindowSet.concat(got, spec.labels))
        data = WindowSet.concat(parts, spec.labels)
    if len(data) == 0:
        log.warning("source %s yielded no labelled windows", spec.path)
    if spec.split.plain:
        return store.replace_windows(fp, data, split=spec.split)
    kept, split = kept_and_split(data, spec.split, spec.name)
    log.info("%s: split %s keeps %d of %d windows", spec.name, spec.split.text, len(kept), len(data))
    # The store only calls split.indices(y) and split.to_json(); FixedSplit answers both for exactly these windows.
    return store.replace_windows(fp, kept, split=split)  # type: ignore[arg-type]
