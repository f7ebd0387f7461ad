"""Who may take part in a round: the one eligibility rule, used both to decide and to explain.

A federation's devices are known by the last status each sent (``har_models.wire.messages.ClientStatus``).
:func:`eligibility` says, from those statuses, which devices a round started now may select and
why each other one may not; the coordinator selects from its ``eligible`` and the home server's
waiting line prints its ``left_out``, so the line never explains a decision that was not made.
:class:`Admission` holds what the deployment adds to the rule (revoked and enrolled devices, the
schedule's charging requirement); ``fedhar-coordinator run`` uses the open one (everyone admitted).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from har_models.wire.messages import ClientStatus

REASONS = ("revoked", "not_enrolled", "offline", "stale", "no_training_windows", "device_fault", "label_set", "not_charging")
"""Why a device is not eligible, in the order the rule tests them (the first that applies is given)."""


def _nobody(cid: str) -> bool:
    return False


def _everybody(cid: str) -> bool:
    return True


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Admission:
    """The deployment's part of eligibility: who is refused for good, who is enrolled, whether charging is required.

    Each is a callable asked at every look, so a revocation or a settings reload made elsewhere
    counts at once.

    Parameters
    ----------
    revoked : callable, optional
        ``revoked(client_id)`` True for a device that must never be heard again (revoked or
        forgotten on the home server): its status is not counted as present, its updates are
        rejected, it is never selected. Default: nobody.
    enrolled : callable, optional
        ``enrolled(client_id)`` False for a device the federation does not know. Default: everybody.
    require_charging : callable, optional
        ``require_charging()`` True when a device that reports being off its charger must not
        train (``[schedule] require_charging``). Default: never.
    """

    revoked: Callable[[str], bool] = _nobody
    enrolled: Callable[[str], bool] = _everybody
    require_charging: Callable[[], bool] = _never

    def refused(self, cid: str) -> bool:
        """True if ``cid`` is refused for good (revoked or forgotten)."""
        return self.revoked(cid)


OPEN = Admission()
"""Everyone admitted, nobody refused: ``fedhar-coordinator run`` and the simulation."""


@dataclass(frozen=True)
class Eligibility:
    """Which devices may take part now, and why the others may not.

    ``eligible``: sorted ids; ``left_out``: id -> reason (one of :data:`REASONS`).
    """

    eligible: tuple[str, ...]
    left_out: dict[str, str]


def eligibility(
    statuses: Mapping[str, ClientStatus],
    *,
    fresh: Callable[[str], bool],
    admission: Admission = OPEN,
    label_set: str = "",
) -> Eligibility:
    """The devices a round started now may select, from the last status each sent, and a reason for each other one.

    A device is eligible when it is not refused (``admission.revoked``) and is enrolled
    (``admission.enrolled``), its status is not offline and still fresh (``fresh(id)``, the
    coordinator's presence: a status older than three of its refresh periods is stale, and an id
    used by two processes is never fresh), it has training windows (``n_train`` > 0), it reports no
    fault (``fault``: its state folder cannot be written, its sensor was refused or stopped), its label
    set is the federation's (when ``label_set`` is given: none before the federation exists) and,
    when ``admission.require_charging()``, it does not report that it is off the charger
    (``charging`` False; a device that does not report it, a board on mains, counts as charging).

    Parameters
    ----------
    statuses : mapping of str -> ClientStatus
        The last status of each known device, by id.
    fresh : callable
        ``fresh(id)``: whether the device's status is still fresh.
    admission : Admission
        The deployment's part of the rule (default :data:`OPEN`).
    label_set : str
        The federation's label set, or "" before there is one.

    Returns
    -------
    Eligibility
    """
    charging_needed = admission.require_charging()
    ok: list[str] = []
    out: dict[str, str] = {}
    for cid in sorted(statuses):
        st = statuses[cid]
        if admission.revoked(cid):
            out[cid] = "revoked"
        elif not admission.enrolled(cid):
            out[cid] = "not_enrolled"
        elif st.state == "offline":
            out[cid] = "offline"
        elif not fresh(cid):
            out[cid] = "stale"
        elif st.n_train <= 0:
            out[cid] = "no_training_windows"
        elif st.fault:  # the device says it cannot take part (its storage or sensor), in its status
            out[cid] = "device_fault"
        elif label_set and st.label_set != label_set:
            out[cid] = "label_set"
        elif charging_needed and st.charging is False:
            out[cid] = "not_charging"
        else:
            ok.append(cid)
    return Eligibility(tuple(ok), out)
