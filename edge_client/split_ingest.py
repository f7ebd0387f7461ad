"""Fill a client's store under any split: the paper's by subject, leak-free blocks, label skew.

:func:`edge_client.sources.ingest_source` hands the store a split decided from labels
alone (the FedDist paper's). The leak-free ``blocks`` split needs the windows' start times
and drops the gap windows; the ``label_skew`` partition needs the subject's name and drops
the classes the client does not keep. Here those are decided with
:func:`har_models.splits.kept_and_split` (the very function the coordinator's evaluation
harness uses through :meth:`SubjectSource.train_test
<har_models.subjects.SubjectSource.train_test>`), and only the kept windows reach the store.
"""

from __future__ import annotations

import logging

from edge_client.replay import replay_windows
from edge_client.sources import ingest_source
from edge_client.store import ClientStore
from har_models.splits import kept_and_split
from har_models.subjects import SubjectSource, load_windows, recordings_of
from har_models.windowing import WindowSet

log = logging.getLogger(__name__)


def ingest_split_source(store: ClientStore, spec: SubjectSource, speed: float | None = None) -> tuple[int, int]:
    """Make sure the store holds this source's kept windows under ``spec.split``; return ``(n_train, n_test)``.

    Parameters
    ----------
    store : ClientStore
    spec : SubjectSource
        Recordings, subject and split (``spec.split``, any kind and partition).
    speed : float, optional
        Replay pacing, as :func:`~edge_client.sources.ingest_source` (None: at once).

    Raises
    ------
    ValueError, OSError
        If the recordings cannot be read (the message names the file).
    """
    if spec.split.plain:
        return ingest_source(store, spec, speed=speed)
    key = spec.store_key()
    if store.has_source(key):
        return len(store.windows("train")), len(store.windows("test"))
    if speed is None:
        data = load_windows(spec)
    else:
        data = WindowSet.concat([replay_windows(r, spec.labels, speed=speed) for r in recordings_of(spec)], spec.labels)
    kept, split = kept_and_split(data, spec.split, spec.name)
    log.info("%s: split %s keeps %d of %d windows", spec.name, spec.split.text, len(kept), len(data))
    # The store only calls split.indices(y) and split.to_json(); FixedSplit answers both for exactly these windows.
    return store.replace_windows(key, kept, split=split)  # type: ignore[arg-type]
