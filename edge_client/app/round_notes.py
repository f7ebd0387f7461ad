"""What the app keeps of the rounds this device took part in, for the person: quality per round, the server's model numbers.

In the store's metadata: :data:`QUALITY_KEY`, per round the confusion matrices of the update's own
test windows, ``start`` (the model this device starts training from, the quality guard's start
measure) and ``personal`` (after training); :data:`VERSIONS_KEY`, the server's number of the model
each round started from ("model v18" in the server's numbering); :data:`SERVER_SEEN_KEY`, when the
server was last known alive (kept across app restarts). No Kivy or PyTorch.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from edge_client.server_state import ServerState, ServerWatch
from edge_client.store import ClientStore
from har_models.wire import codec

log = logging.getLogger("fedhar.app")

QUALITY_KEY = "round_quality"
"""Store metadata key of the per-round confusion matrices (a JSON list, oldest first)."""
QUALITY_KEPT = 50
"""Rounds kept in :data:`QUALITY_KEY`."""
VERSIONS_KEY = "server_versions"
"""Store metadata key of ``[run_id, round, model_version]`` triples, oldest first."""
VERSIONS_KEPT = 200
"""Rounds kept in :data:`VERSIONS_KEY`."""
SERVER_SEEN_KEY = "server_last_online_unix"
"""Store metadata key of the last time the home server was known alive (s since the epoch)."""
SEEN_WRITE_S = 60.0
"""Least advance of :data:`SERVER_SEEN_KEY` that is written to the store (s): not a write at every refresh."""


def note_update(store: ClientStore, envelope: bytes, t_unix: float | None = None) -> dict[str, Any] | None:
    """Keep the confusion matrices of an update envelope under :data:`QUALITY_KEY` (one entry per run and round); return
    the entry, None when the envelope carries no matrix."""
    try:
        head = codec.peek_header(envelope)
    except codec.EnvelopeError as exc:
        log.debug("quality: unreadable update: %s", exc)
        return None
    meta = head.get("meta", {})
    cms = meta.get("confusion") or {}
    if not cms.get("trained"):
        return None
    when = time.time() if t_unix is None else t_unix
    entry = {"run_id": str(meta.get("run_id", "")), "round": int(head.get("round", -1)), "t_unix": when,
             "start": cms.get("initial") or cms.get("received"), "personal": cms["trained"],
             "n_train": int(meta.get("n_train", 0)), "n_test": int(meta.get("n_test", 0))}  # fmt: skip
    kept = [e for e in store.get_meta(QUALITY_KEY, []) if (e.get("run_id"), e.get("round")) != (entry["run_id"], entry["round"])]
    store.set_meta(QUALITY_KEY, [*kept, entry][-QUALITY_KEPT:])
    return entry


def note_version(store: ClientStore, run_id: str, round_: int, version: int) -> None:
    """Keep that round ``round_`` of run ``run_id`` started from the server's model version ``version``."""
    rows = store.get_meta(VERSIONS_KEY, [])
    if [run_id, round_, version] in rows:
        return
    kept = [r for r in rows if r[:2] != [run_id, round_]]
    store.set_meta(VERSIONS_KEY, [*kept, [run_id, int(round_), int(version)]][-VERSIONS_KEPT:])


def versions_of(store: ClientStore) -> dict[tuple[str, int], int]:
    """``(run_id, round) -> model version`` as kept by :func:`note_version`."""
    return {(str(r[0]), int(r[1])): int(r[2]) for r in store.get_meta(VERSIONS_KEY, []) if len(r) == 3}


class ServerNotes:
    """The home server's state for the app, its last sign of life (and the rounds' model versions) kept in ``store``."""

    def __init__(self, store: ClientStore):
        self.store = store
        seen = store.get_meta(SERVER_SEEN_KEY)
        self.watch = ServerWatch(float(seen) if isinstance(seen, int | float) else None)
        self._written = self.watch.last_online_unix or 0.0

    def observe(self, agent: Any, now_unix: float) -> ServerState:
        """The server's state as ``agent`` sees it at ``now_unix``; notes the model version of the round it has open."""
        state = self.watch.observe(agent.coordinator, agent.coordinator_presence, now_unix, agent.outlook)
        seen = self.watch.last_online_unix
        if seen is not None and seen - self._written >= SEEN_WRITE_S:
            self.store.set_meta(SERVER_SEEN_KEY, seen)
            self._written = seen
        st, ann = state.outlook, agent.announcement
        if state.presence != "online" or st is None or ann is None or st.model_version is None:
            return state
        if st.open_round == ann.round and st.run_id == ann.run_id:
            note_version(self.store, ann.run_id, int(ann.round), st.model_version)
        return state


def trained_accuracy(envelope: bytes) -> float | None:
    """Accuracy on the local test windows of the model in an update envelope (its confusion matrix)."""
    try:
        cm = codec.peek_header(envelope).get("meta", {}).get("confusion", {}).get("trained")
    except codec.EnvelopeError:
        return None
    if not cm:
        return None
    m = np.asarray(cm, dtype=np.float64)
    return float(np.trace(m) / m.sum()) if m.sum() else None
