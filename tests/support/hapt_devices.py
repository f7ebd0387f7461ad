"""Devices that really train, for an in-memory grid: HAPT subjects trained by the client's own code.

Each device holds one HAPT subject (``datasets/hapt/userNN.npz``) in its own
:class:`~edge_client.store.ClientStore`, split as the main job splits it (``blocks``) by the client's
:func:`~edge_client.sources.ingest_source`. :class:`HaptDevices` is an
:data:`support.inmemory_grid.Trainer`: a device's answer to an exchange is
:meth:`edge_client.trainer.ClientTrainer.run_round` on the model it was sent (its start measure, its
local training, its update envelope in the plan's encoding), checked and decoded by the coordinator's
:func:`~coordinator.updates.validate_update`, as over MQTT. A device given a factor k in ``scaled``
sends w0 + k (w - w0) instead of its trained model w (w0: the model it received).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch

from coordinator.updates import ClientUpdate, validate_update
from edge_client.sources import ingest_source
from edge_client.store import ClientStore
from edge_client.trainer import ClientTrainer
from har_models.data.labels import HAPT_LABELS
from har_models.data.splits import SplitSpec
from har_models.data.subjects import parse_source
from har_models.nn.model import ArchSpec
from har_models.wire.messages import ClientStatus, RoundAnnouncement, TrainingPlan

HAPT = Path(__file__).resolve().parents[2] / "datasets" / "hapt"


class HaptDevices:
    """Devices ``cid -> HAPT subject number``, each with its store in ``folder / cid`` (see the module docstring).

    Parameters
    ----------
    folder : Path
    subjects : mapping of str -> int
        Device id -> HAPT subject (1..30).
    run_id : str
        The run the devices' updates name (the coordinator's ``run_id``).
    scaled : mapping of str -> float, optional
        Device id -> factor k of the change it sends (w0 + k (w - w0)).
    """

    def __init__(self, folder: Path, subjects: Mapping[str, int], run_id: str, scaled: Mapping[str, float] | None = None):
        self.run_id = run_id
        self.scaled = dict(scaled or {})
        self.stores: dict[str, ClientStore] = {}
        for cid, subject in subjects.items():
            store = ClientStore(folder / cid, HAPT_LABELS, owner=cid)
            ingest_source(store, parse_source(f"hapt:{HAPT / f'user{subject:02d}.npz'}", SplitSpec(kind="blocks")))
            self.stores[cid] = store

    def status(self, cid: str) -> ClientStatus:
        """Device ``cid``'s status as its agent reports it: present, its windows and their statistics."""
        c = self.stores[cid].window_counts()
        return ClientStatus(cid, "online", label_set=HAPT_LABELS.name, n_train=c.n_train, n_test=c.n_test,
                            train_stats=c.train_stats, class_counts=c.class_counts, refresh_s=0.0)  # fmt: skip

    def __call__(self, cid: str, spec: ArchSpec, received: Mapping[str, torch.Tensor], round_: int, stage: int,
                 plan: TrainingPlan) -> ClientUpdate:  # fmt: skip
        """Device ``cid``'s update to model ``received`` (architecture ``spec``) in round ``round_``, stage ``stage``."""
        ann = RoundAnnouncement(self.run_id, round_, "training", spec.to_dict(), HAPT_LABELS.name, (cid,), plan, stage=stage)
        w0 = {k: v.numpy() for k, v in received.items()}
        out = ClientTrainer(self.stores[cid], cid).run_round(ann, w0)
        update = validate_update(out.envelope, topic_client=cid, run_id=self.run_id, round_=round_, stage=stage, spec=spec,
                                 selected=(cid,), want_guidance=plan.guidance, reference=w0)  # fmt: skip
        k = self.scaled.get(cid)
        if k is None:
            return update
        return replace(update, state={n: received[n] + k * (w - received[n]) for n, w in update.state.items()})

    def close(self) -> None:
        """Close every device's store."""
        for store in self.stores.values():
            store.close()
