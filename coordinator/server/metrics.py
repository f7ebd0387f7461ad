"""Prometheus metrics of the home server, folded from the round records.

A Prometheus counter must only grow and must survive a restart of the exporter; the round
records in the run's database are both (a completed round is never removed). So the figures
are not counted in the serve loop as rounds go by: they are folded from the records
(:class:`coordinator.record.RoundRecord`) into :class:`RoundTotals`, once over every record
when the page starts and then one record at a time as rounds complete, so a scrape costs the
same at round 10 as at round 100,000 (``benchmarks/bench_status_page.py``). The device gauges
come from the server database and the monitor at that moment. The collector lives
in its own :class:`prometheus_client.CollectorRegistry` (never the global one), so two servers
in one process, or a test, do not see each other's figures.

Exported (prefix ``fedhar_``)::

    rounds_completed_total                       counter
    round_duration_seconds                       summary (count, sum) over completed rounds
    last_round_duration_seconds                  gauge
    last_round                                   gauge: index of the last completed round (-1: none)
    updates_accepted_total                       counter: valid updates (main exchanges)
    round_attempts                               summary (count, sum): exchanges per completed round
    rounds_without_quorum_total                  counter: exchanges that closed without quorum, counted as each closes
                                                 (the run's round_failed events; ServerView.totals)
    rollbacks_total                              counter: quality-guard rollbacks (coordinator/guard.py)
    updates_rejected_total{reason}               counter: rejected messages by reason code
    bytes_in_total{encoding}                     counter: update envelopes received, by encoding
    bytes_out_total{encoding}                    counter: model envelopes sent (float32)
    devices{state}                               gauge: enrolled, online, revoked, forgotten
    last_macro_f1{measure}                       gauge: global, personalisation, start (latest round that has it;
                                                 start: the devices' measure of the shared model they received)
    last_accuracy{measure}                       gauge
    device_updates_clipped_total{device}         counter: a device's updates the quality guard clipped
    device_messages_rejected_total{device}       counter: a device's messages the coordinator rejected
    device_quarantined{device}                   gauge: 1 while the device is quarantined, else 0 (devices with any harm count)
    build_info{version}                          gauge: 1, labelled with the release (importlib.metadata)
    disk_free_bytes, disk_next_round_bytes       gauge: free space of the data folder's filesystem, what the next round writes
    monitor_malformed_messages_total{kind}       counter: messages the monitor ignored
    broker_link_up                               gauge: 1 while the page's own broker session is up
    seconds_since_last_round                     gauge: since the newest completed round was recorded
    certificate_expiry_seconds{which}            gauge: until the broker's server certificate / CA expires
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from coordinator.record import DEFAULT_ENCODING, MEASURES, GuardNote, RoundRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Content type of the text exposition format."""

UNKNOWN_REASON = "unspecified"
"""Reason label of rejected messages a record counts without saying why (``rejected`` above the
sum of its ``rejections``, as in records written before reasons were kept)."""

DEVICE_STATES = ("enrolled", "online", "revoked", "forgotten")

EXPORTED_MEASURES = (*MEASURES[:2], "start")
"""The measures whose latest accuracy and macro-F1 ``/metrics`` exports: global, personalisation and start
(the devices' measure of the shared model they received; :data:`coordinator.record.MEASURES`)."""


def release_version() -> str:
    """The installed fedhar's release (``importlib.metadata.version("fedhar")``); "unknown" without package metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedhar")
    except PackageNotFoundError:
        return "unknown"


@dataclass
class RoundTotals:
    """The sums and latest values ``/metrics`` exports, folded one round record at a time.

    :meth:`add` costs O(1) per record (a record's own rejections and encodings aside), so the
    status page keeps one instance current as rounds complete and a scrape reads it as it is.

    Attributes
    ----------
    rounds : int
        Records folded.
    seconds : float
        Sum of their wall times (s).
    last_seconds : float or None
        Wall time of the newest record (s).
    last_round : int
        Index of the newest record; -1 before any.
    updates : int
        Valid updates of the rounds' main exchanges.
    rejected : Counter reason -> messages
        Rejected messages by reason code; the part a record counts without a reason under
        :data:`UNKNOWN_REASON`.
    bytes_in, bytes_out : Counter encoding -> bytes
        Update envelopes received and model envelopes sent (models go out as float32).
    attempts : int
        Sum of the records' ``attempts`` (exchanges, 1 for a round completed at once).
    without_quorum : int
        Exchanges that closed without quorum before their round completed (attempts - 1 summed). Folded from
        records alone, a round still failing is counted once it completes; :meth:`coordinator.server.web.ServerView.totals`
        raises it to the run's ``round_failed`` events, written as each exchange closes.
    rollbacks : int
        Records whose quality guard rolled back.
    last_rollback : tuple (round, GuardNote) or None
        The newest of them: the round it happened in and the guard's note (to which round, why).
    last : dict (measure, key) -> float
        The newest finite value of ``key`` ("accuracy", "macro_f1") of ``measure`` ("global",
        "personalisation").
    """

    rounds: int = 0
    seconds: float = 0.0
    last_seconds: float | None = None
    last_round: int = -1
    updates: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    bytes_in: Counter[str] = field(default_factory=Counter)
    bytes_out: Counter[str] = field(default_factory=Counter)
    attempts: int = 0
    without_quorum: int = 0
    rollbacks: int = 0
    last_rollback: tuple[int, GuardNote] | None = None
    last: dict[tuple[str, str], float] = field(default_factory=dict)

    @classmethod
    def of(cls, recs: Iterable[RoundRecord]) -> RoundTotals:
        """The totals of ``recs`` (in round order)."""
        out = cls()
        for r in recs:
            out.add(r)
        return out

    def add(self, r: RoundRecord) -> None:
        """Fold one completed round (the newest so far) into the totals."""
        self.rounds += 1
        self.seconds += float(r.seconds)
        self.last_seconds = float(r.seconds)
        self.last_round = r.round
        p = r.participation
        self.updates += p.updates
        self.attempts += r.attempts
        self.without_quorum += r.attempts - 1
        if r.guard is not None and r.guard.action == "rollback":
            self.rollbacks += 1
            self.last_rollback = (r.round, r.guard)
        for rej in p.rejections:
            self.rejected[rej.reason] += rej.count
        rest = p.rejected - sum(rej.count for rej in p.rejections)
        if rest > 0:
            self.rejected[UNKNOWN_REASON] += rest
        t = r.traffic
        if t is not None:
            if t.up_by_encoding:
                for enc, n in t.up_by_encoding.items():
                    self.bytes_in[enc] += n
            elif t.bytes_up:
                self.bytes_in[DEFAULT_ENCODING] += t.bytes_up
            self.bytes_out[DEFAULT_ENCODING] += t.bytes_down
        for measure in EXPORTED_MEASURES:
            m = r.measure(measure)
            if m is None:
                continue
            for key in ("accuracy", "macro_f1"):
                v = float(getattr(m, key))
                if math.isfinite(v):
                    self.last[(measure, key)] = v


class FederationCollector(Collector):
    """A prometheus-client collector over the federation's round totals and devices (see the module docstring).

    Parameters
    ----------
    totals : callable returning RoundTotals, or a sequence of RoundRecord
        The folded completed rounds (e.g. ``ServerView.totals``), read at each scrape. A callable
        that returns the records themselves is folded at each scrape (O(rounds); for tests and
        short runs).
    devices : callable returning dict state -> int, optional
        Device counts by state (:data:`DEVICE_STATES`); a missing state is exported as 0.
    malformed : callable returning dict kind -> int, optional
        The monitor's counts of ignored messages.
    broker_link : callable returning bool or None, optional
        Whether the status page's broker session is up (None: it has none; not exported).
    since_last_round : callable returning float or None, optional
        Seconds since the newest completed round was recorded (None: none yet; not exported).
    certificates : callable returning dict, optional
        Seconds until each of the broker's certificates expires, by ``"server"``/``"ca"`` (empty: not exported).
    harm : callable returning dict, optional
        Each device's :class:`coordinator.server.harm.DeviceHarm` (``clipped``, ``rejected_total``, ``quarantine``).
    release : str, optional
        The release for ``fedhar_build_info`` (default :func:`release_version`).
    disk : callable returning (free bytes, next round's bytes) or None, optional
        The data folder's free space and what the next round needs (None: not known; not exported).
    """

    def __init__(
        self,
        totals: Callable[[], RoundTotals | Sequence[RoundRecord]],
        devices: Callable[[], dict[str, int]] | None = None,
        malformed: Callable[[], dict[str, int]] | None = None,
        broker_link: Callable[[], bool | None] | None = None,
        since_last_round: Callable[[], float | None] | None = None,
        certificates: Callable[[], dict[str, float]] | None = None,
        *,
        harm: Callable[[], Mapping[str, Any]] | None = None,
        release: str | None = None,
        disk: Callable[[], tuple[int, int] | None] | None = None,
    ):
        self._totals = totals
        self._devices = devices
        self._malformed = malformed
        self._link = broker_link
        self._since = since_last_round
        self._certs = certificates
        self._harm = harm
        self._release = release if release is not None else release_version()
        self._disk = disk

    def collect(self) -> Iterator[Metric]:
        """The metric families as of now (called by the registry at every scrape)."""
        got = self._totals()
        t = got if isinstance(got, RoundTotals) else RoundTotals.of(got)
        yield CounterMetricFamily("fedhar_rounds_completed", "Rounds completed", value=t.rounds)
        yield SummaryMetricFamily("fedhar_round_duration_seconds", "Wall time of completed rounds, from selection to the stored record",
                                  count_value=t.rounds, sum_value=t.seconds)  # fmt: skip
        last = GaugeMetricFamily("fedhar_last_round_duration_seconds", "Wall time of the last completed round")
        if t.last_seconds is not None:
            last.add_metric([], t.last_seconds)
        yield last
        yield GaugeMetricFamily("fedhar_last_round", "Index of the last completed round (-1: none)", value=t.last_round)
        yield CounterMetricFamily("fedhar_updates_accepted", "Valid updates received in the rounds' main exchanges", value=t.updates)
        yield SummaryMetricFamily("fedhar_round_attempts", "Exchanges per completed round (1 + those that closed without quorum)",
                                  count_value=t.rounds, sum_value=t.attempts)  # fmt: skip
        yield CounterMetricFamily("fedhar_rounds_without_quorum", "Exchanges that closed without quorum",
                                  value=t.without_quorum)  # fmt: skip
        yield CounterMetricFamily("fedhar_rollbacks", "Quality-guard rollbacks to the best version", value=t.rollbacks)
        rej = CounterMetricFamily("fedhar_updates_rejected", "Rejected update messages by reason", labels=["reason"])
        for reason, n in sorted(t.rejected.items()):
            rej.add_metric([reason], n)
        yield rej
        bin_ = CounterMetricFamily("fedhar_bytes_in", "Bytes of valid update envelopes received, by encoding", labels=["encoding"])
        for enc, n in sorted(t.bytes_in.items()):
            bin_.add_metric([enc], n)
        yield bin_
        bout = CounterMetricFamily("fedhar_bytes_out", "Bytes of model envelopes sent, by encoding", labels=["encoding"])
        for enc, n in sorted(t.bytes_out.items()):
            bout.add_metric([enc], n)
        yield bout
        f1 = GaugeMetricFamily("fedhar_last_macro_f1", "Macro-F1 of the latest round that measured it", labels=["measure"])
        acc = GaugeMetricFamily("fedhar_last_accuracy", "Accuracy of the latest round that measured it", labels=["measure"])
        for measure in EXPORTED_MEASURES:
            if (v := t.last.get((measure, "macro_f1"))) is not None:
                f1.add_metric([measure], v)
            if (v := t.last.get((measure, "accuracy"))) is not None:
                acc.add_metric([measure], v)
        yield f1
        yield acc
        if self._link is not None and (up := self._link()) is not None:
            yield GaugeMetricFamily("fedhar_broker_link_up", "1 while the status page's session with the broker is up", value=int(up))
        if self._since is not None and (since := self._since()) is not None:
            yield GaugeMetricFamily("fedhar_seconds_since_last_round", "Seconds since the newest completed round was recorded",
                                    value=since)  # fmt: skip
        if self._certs is not None and (left := self._certs()):
            cert = GaugeMetricFamily("fedhar_certificate_expiry_seconds", "Seconds until the broker's certificate expires "
                                     "(negative: expired), by which: server, ca", labels=["which"])  # fmt: skip
            for which, secs in sorted(left.items()):
                cert.add_metric([which], secs)
            yield cert
        if self._devices is not None:
            counts = self._devices()
            dev = GaugeMetricFamily("fedhar_devices", "Devices by state", labels=["state"])
            for state in DEVICE_STATES:
                dev.add_metric([state], counts.get(state, 0))
            yield dev
        if self._malformed is not None:
            bad = CounterMetricFamily("fedhar_monitor_malformed_messages", "Messages the monitor ignored as malformed, by kind",
                                      labels=["kind"])  # fmt: skip
            for kind, n in sorted(self._malformed().items()):
                bad.add_metric([kind], n)
            yield bad
        build = GaugeMetricFamily("fedhar_build_info", "The release of fedhar serving this federation", labels=["version"])
        build.add_metric([self._release], 1)
        yield build
        if self._harm is not None:
            yield from _harm_families(self._harm())
        if self._disk is not None and (disk := self._disk()) is not None:
            yield GaugeMetricFamily("fedhar_disk_free_bytes", "Free bytes on the data folder's filesystem", value=disk[0])
            yield GaugeMetricFamily("fedhar_disk_next_round_bytes", "Bytes the next round writes before anything is deleted",
                                    value=disk[1])  # fmt: skip


def _harm_families(harm: Mapping[str, Any]) -> Iterator[Metric]:
    """Per-device clipped updates, rejected messages and quarantine (:class:`coordinator.server.harm.DeviceHarm`)."""
    clipped = CounterMetricFamily("fedhar_device_updates_clipped", "A device's updates the quality guard clipped", labels=["device"])
    rejected = CounterMetricFamily("fedhar_device_messages_rejected", "A device's messages the coordinator rejected", labels=["device"])
    held = GaugeMetricFamily("fedhar_device_quarantined", "1 while the device is quarantined (left out of aggregation)",
                             labels=["device"])  # fmt: skip
    for name, h in sorted(harm.items()):
        clipped.add_metric([name], h.clipped)
        rejected.add_metric([name], h.rejected_total)
        held.add_metric([name], int(h.quarantine is not None))
    yield from (clipped, rejected, held)


def make_registry(
    totals: Callable[[], RoundTotals | Sequence[RoundRecord]],
    devices: Callable[[], dict[str, int]] | None = None,
    malformed: Callable[[], dict[str, int]] | None = None,
    broker_link: Callable[[], bool | None] | None = None,
    since_last_round: Callable[[], float | None] | None = None,
    certificates: Callable[[], dict[str, float]] | None = None,
    **more: Any,
) -> CollectorRegistry:
    """A new CollectorRegistry holding one :class:`FederationCollector` (arguments as there; ``more``: its keyword-only ones)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FederationCollector(totals, devices, malformed, broker_link, since_last_round, certificates, **more))
    return reg


def scrape(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format (what ``/metrics`` answers)."""
    return generate_latest(registry)
