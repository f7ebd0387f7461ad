"""The seam between rounds and devices: the :class:`Grid` protocol and the errors that end a federation.

After Flower's ``Grid`` (``flwr.server.grid``): the round logic (:class:`coordinator.runner.FederationRunner`)
and the two serving loops (``fedhar-coordinator run``, :mod:`coordinator.service`; ``serve``,
:mod:`coordinator.server.serve`) know only this protocol. :class:`coordinator.mqtt_grid.MqttGrid` is the
network grid (a broker session with one carrier of model bytes, :mod:`coordinator.transport`); the tests
pass an in-memory one, so rounds, resume, growth and the serving loop run without a broker.

The grid knows the devices (their last statuses and presence) and moves models and updates; it
decides nothing about rounds: who is selected, when an exchange may close and what an update of an
earlier version is worth are the round policy's (:mod:`coordinator.rounds`), handed over as a
:class:`~coordinator.exchange.Steering` with each exchange.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from har_models.settings import doc
from har_models.wire.messages import ClientStatus

if TYPE_CHECKING:
    from coordinator.admission import Eligibility
    from coordinator.exchange import Exchange, Steering
    from coordinator.record import RoundRecord
    from coordinator.strategies import Federation
    from har_models.nn.model import ArchSpec
    from har_models.wire.messages import RoundOutlook, TrainingPlan


@dataclass(frozen=True)
class Timing:
    """The ``[timing]`` settings table: how long the coordinator waits for the devices.

    Parameters
    ----------
    expected_clients : int, optional
        Start as soon as this many clients are online (else wait ``start_timeout_s``); set by a
        launcher that knows how many it started.
    start_timeout_s : float
        Seconds to wait for ``expected_clients`` (or the quorum) before the first round.
    start_settle_s : float
        Without ``expected_clients``: start once the quorum is online and no further client has
        come online for this many seconds.
    round_timeout_s : float
        Deadline of each exchange, seconds after its announcement.
    status_refresh_s : float
        Seconds between republications of the retained coordinator status (from a thread of its
        own, so a long evaluation does not stop it); clients treat a status older than three
        periods as a dead coordinator (docs/reliability.md, "A dead coordinator").
    deadline_margin, deadline_slack_s : float
        The deadlines follow the devices (:func:`device_deadline`): an exchange closes at most
        ``margin x`` the slowest selected device's last measured round time (training, download,
        upload) ``+ slack`` after it opens, never later than ``round_timeout_s``; a device that has not
        measured one yet (new, restarted, warming up) gets ``round_timeout_s``. ``margin`` 0: always
        ``round_timeout_s``.
    """

    expected_clients: int | None = field(default=None, metadata=doc("start as soon as this many clients are online", cli=False))
    start_timeout_s: float = field(
        default=300.0, metadata=doc("seconds to wait for clients before the first round", "s", flag="--start-timeout")
    )
    start_settle_s: float = field(
        default=10.0,
        metadata=doc("without --expected-clients: start once min_clients are online and nobody new came for this long", "s",
                     flag="--start-settle"),
    )
    round_timeout_s: float = field(
        default=900.0, metadata=doc("seconds before a round closes without the missing updates", "s", flag="--round-timeout")
    )
    status_refresh_s: float = field(
        default=30.0,
        metadata=doc("republish the retained coordinator status this often; clients treat one older than three "
                     "periods as a dead coordinator", "s", flag="--status-refresh"),
    )
    deadline_margin: float = field(
        default=4.0,
        metadata=doc("an exchange closes at most this many times the slowest selected device's last measured round time "
                     "(+ deadline_slack_s) after it opens, never after round_timeout_s (0 = always round_timeout_s)"),
    )
    deadline_slack_s: float = field(default=60.0, metadata=doc("added to the devices' measured round time", "s"))

    def check(self, cfg: Any) -> None:
        """Refuse waits that cannot work (ValueError naming the setting)."""
        if self.round_timeout_s <= 0 or self.start_timeout_s < 0:
            raise ValueError("[timing] round_timeout_s (--round-timeout) must be > 0 and start_timeout_s (--start-timeout) >= 0")
        if self.deadline_margin < 0 or self.deadline_slack_s < 0:
            raise ValueError("[timing] deadline_margin and deadline_slack_s must be >= 0")
        if not self.status_refresh_s > 0:
            raise ValueError(f"[timing] status_refresh_s (--status-refresh) must be > 0 (seconds between coordinator status "
                             f"refreshes), got {self.status_refresh_s}")  # fmt: skip


def device_deadline(timing: Timing, statuses: Mapping[str, ClientStatus], selected: Sequence[str]) -> float:
    """Seconds an exchange of ``selected`` waits: what the slowest of them needs, bounded by ``round_timeout_s``.

    A device's need is ``deadline_margin x (train_s + download_s + upload_s) + deadline_slack_s`` from the timings
    its status reports of its last round; one that reports none yet, or says it is warming up (a first training
    after a start takes far longer: 47-49 s against 30-60 s deadlines in served federations), needs the whole
    ``round_timeout_s``, its first-round allowance.
    """
    if timing.deadline_margin <= 0 or not selected:
        return timing.round_timeout_s
    need = 0.0
    for cid in selected:
        st = statuses.get(cid)
        if st is None or st.warming_up or st.train_s is None:
            return timing.round_timeout_s
        took = st.train_s + (st.download_s or 0.0) + (st.upload_s or 0.0)
        need = max(need, timing.deadline_margin * took + timing.deadline_slack_s)
    return min(timing.round_timeout_s, need)


class CoordinatorError(RuntimeError):
    """The federation cannot go on (no clients, inconsistent state); the message says why and what to do."""


class StateError(CoordinatorError):
    """The run folder cannot be used as asked (another run's folder, damaged state); restarting will not help."""


class Grid(Protocol):
    """What the runner and the serving loops need of the devices' side (network or in memory)."""

    # ------------------------------------------------------------------ the session (run and serve loops)
    def open(self) -> None:
        """Connect (to the broker, the blob store); from now on devices are heard.

        Raises :class:`CoordinatorError` when the devices' side cannot be reached.
        """
        ...

    def close(self) -> None:
        """Leave: say offline to the devices and release what :meth:`open` took."""
        ...

    def clear_retained(self) -> None:
        """Forget what an earlier run left for the devices (a run that starts afresh)."""
        ...

    def finish(self, spec: ArchSpec, label_set: str) -> None:
        """Announce the run finished and take back every model it published."""
        ...

    def clear_device(self, cid: str) -> bool:
        """Remove what the devices' side keeps for device ``cid`` (revoked or forgotten); True when done."""
        ...

    def set_between(self, hook: Callable[[], None]) -> None:
        """Have ``hook`` called, in the grid's own thread, between the messages of an open exchange (about twice a second):
        what must not wait for the round to close (an operator's revocation) is done there."""
        ...

    def leaving(self) -> Mapping[str, ClientStatus]:
        """Devices whose newest status says they left from their app, by id."""
        ...

    # ------------------------------------------------------------------ the devices (runner)
    def eligibility(self, label_set: str) -> Eligibility:
        """Who a round started now could select, and why each other known device could not (the one rule)."""
        ...

    def statuses(self) -> Mapping[str, ClientStatus]:
        """The last status of each known device, by id."""
        ...

    def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for a message from the devices (a status, a late update) and take it in."""
        ...

    def gone(self) -> set[str]:
        """Devices known to have exited for good (a launcher's processes), not to be waited for.

        Raises :class:`CoordinatorError` when none is left.
        """
        ...

    def restarted(self) -> Mapping[str, float]:
        """Devices whose process a launcher restarted after a crash and that are coming back: id -> when (s since the epoch)."""
        ...

    def forget(self, cid: str) -> None:
        """Forget what is known of device ``cid`` (revoked or forgotten): not present, not eligible."""
        ...

    # ------------------------------------------------------------------ one round (runner)
    def exchange(self, fed: Federation, label_set: str, round_: int, stage: int, selected: Sequence[str],
                 plan: TrainingPlan, steering: Steering) -> Exchange:  # fmt: skip
        """One exchange: publish the models of ``fed`` the selected devices start from, announce, collect until
        ``steering`` says the exchange is complete, or the deadline; the closed exchange."""
        ...

    def new_attempt(self, round_: int, same_model: bool) -> None:
        """Round ``round_`` is run again after it closed without quorum. With ``same_model`` (nothing changed the models
        since) the updates the failed attempt counted count again and the devices that sent them send nothing more;
        otherwise every selected device answers afresh."""
        ...

    def close_failed(self, round_: int) -> None:
        """Show round ``round_`` closed at once (it closed without changing the model)."""
        ...

    def publish_progress(self, record: RoundRecord) -> None:
        """Publish the record of the last completed round for observers."""
        ...

    def publish_outlook(self, outlook: RoundOutlook) -> None:
        """Tell the people holding the devices what the coordinator is doing about rounds (kept until the next one)."""
        ...
