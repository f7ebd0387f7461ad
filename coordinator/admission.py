"""Who may take part in a round: the one eligibility rule, used both to decide and to explain.

:func:`eligibility` says from the devices' last statuses which a round started now may select and
why each other may not: the coordinator selects from ``eligible`` and the home server's waiting line
prints ``left_out``, so the line never explains a decision that was not made. :class:`Admission`
holds what the deployment adds (revoked and enrolled devices, charging); ``run`` admits everyone.
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

    Callables asked at every look, so a revocation or reload made elsewhere counts at once. A
    ``revoked(cid)`` device is never heard again (status, updates, selection).
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
    """The devices a round started now may select, and a reason (:data:`REASONS`, first that applies) for each other.

    A device is eligible when not revoked, enrolled, not offline and ``fresh(id)`` (presence: three
    refresh periods; an id used twice is never fresh), with training windows, no reported ``fault``, the
    federation's ``label_set`` (when given) and, when charging is required, not reporting ``charging``
    False (a board on mains that does not report it counts as charging).
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
