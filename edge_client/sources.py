"""Where a client's labelled windows come from: replayed dataset subjects.

:func:`ingest_source` feeds a :class:`har_models.data.subjects.SubjectSource`'s recordings through
a device's sensor pipeline and stores the windows with the source's split (a source already
ingested is not read again). The ``blocks`` split and the ``label_skew`` partition are decided
here with :func:`har_models.data.splits.kept_and_split`, as the coordinator's evaluation does;
only the kept windows reach the store.
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

    ``speed``: replay paced at that multiple of real time, as from a sensor driver (None: at once;
    the same windows); ``health`` then measures each recording's pipeline. Raises ValueError or
    OSError if the recordings cannot be read (naming the file).
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
