"""Prometheus metrics of the home server, folded from the round records.

Counters must only grow and survive a restart; the run's round records are both, so the figures are
folded from them (:class:`RoundTotals`, once at start, then one record per completed round) and a
scrape costs the same at round 10 as at round 100,000. Device gauges come from the server database
and the monitor. The collector has its own CollectorRegistry (never the global one).

Exported (prefix ``fedhar_``)::

    rounds_completed_total                       counter
    round_duration_seconds                       summary (count, sum) over completed rounds
    last_round_duration_seconds                  gauge
    last_round                                   gauge: index of the last completed round (-1: none)
    updates_accepted_total                       counter: valid updates (main exchanges)
    round_attempts                               summary (count, sum): exchanges per completed round
    rounds_without_quorum_total                  counter: exchanges closed without quorum, as each closes
    rollbacks_total                              counter: quality-guard rollbacks
    updates_rejected_total{reason}               counter: rejected messages by reason code
    bytes_in_total{encoding}                     counter: update envelopes received, by encoding
    bytes_out_total{encoding}                    counter: model envelopes sent (float32)
    devices{state}                               gauge: enrolled, online, revoked, forgotten
    last_macro_f1{measure}, last_accuracy{measure}   gauge: global, personalisation, start (latest round with it)
    device_updates_clipped_total{device}         counter: a device's updates the quality guard clipped
    device_bad_object_reports_total{device}      counter: damaged stored objects a device reported
    store_object_damaged_reports_total{object}   counter: devices' reports that a stored object (SHA-256) was damaged
    device_messages_rejected_total{device}       counter: a device's messages the coordinator rejected
    device_quarantined{device}                   gauge: 1 while the device is quarantined
    build_info{version}                          gauge: 1, labelled with the release
    disk_free_bytes, disk_next_round_bytes       gauge: free space of the data folder, what the next round writes
    monitor_malformed_messages_total{kind}       counter: messages the monitor ignored
    broker_link_up                               gauge: 1 while the page's own broker session is up
    seconds_since_last_round                     gauge: since the newest completed round was recorded
    certificate_expiry_seconds{which}            gauge: until the broker's server certificate / CA expires
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from coordinator.record import DEFAULT_ENCODING, MEASURES, GuardNote, RoundRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Content type of the text exposition format."""

UNKNOWN_REASON = "unspecified"
"""Reason label of rejected messages a record counts without saying why (older records)."""

DEVICE_STATES = ("enrolled", "online", "revoked", "forgotten")

EXPORTED_MEASURES = (*MEASURES[:2], "start")
"""The measures whose latest accuracy and macro-F1 ``/metrics`` exports."""


def release_version() -> str:
    """The installed fedhar's release; "unknown" without package metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedhar")
    except PackageNotFoundError:
        return "unknown"


@dataclass
class RoundTotals:
    """The sums and latest values ``/metrics`` exports, folded one round record at a time (O(1) per record).

    ``rejected`` counts by reason (the unexplained part under :data:`UNKNOWN_REASON`); ``bytes_in``/
    ``bytes_out`` by encoding; ``without_quorum`` sums attempts - 1 (``ServerView.totals`` raises it to
    the run's ``round_failed`` events); ``last_rollback`` is (round, GuardNote); ``last`` maps
    (measure, "accuracy"/"macro_f1") to the newest finite value.
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


@dataclass(eq=False)  # hashable: the registry keys its collectors
class FederationCollector(Collector):
    """A prometheus-client collector over the federation's round totals and devices, read at each scrape.

    ``totals`` returns the folded RoundTotals (or records, folded at each scrape: O(rounds)); every other
    source is optional, and a None from it leaves its families out. ``release`` defaults to :func:`release_version`.
    """

    totals: Callable[[], RoundTotals | Sequence[RoundRecord]]
    devices: Callable[[], dict[str, int]] | None = None
    malformed: Callable[[], dict[str, int]] | None = None
    broker_link: Callable[[], bool | None] | None = None
    since_last_round: Callable[[], float | None] | None = None
    certificates: Callable[[], dict[str, float]] | None = None
    _: KW_ONLY
    harm: Callable[[], Mapping[str, Any]] | None = None
    release: str | None = None
    disk: Callable[[], tuple[int, int] | None] | None = None
    damaged: Callable[[], Mapping[str, int]] | None = None

    def __post_init__(self) -> None:
        if self.release is None:
            self.release = release_version()

    def collect(self) -> Iterator[Metric]:
        """The metric families as of now (called by the registry at every scrape)."""
        got = self.totals()
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
        yield _family(CounterMetricFamily, "fedhar_updates_rejected", "Rejected update messages by reason", "reason",
                      sorted(t.rejected.items()))  # fmt: skip
        yield _family(CounterMetricFamily, "fedhar_bytes_in", "Bytes of valid update envelopes received, by encoding", "encoding",
                      sorted(t.bytes_in.items()))  # fmt: skip
        yield _family(CounterMetricFamily, "fedhar_bytes_out", "Bytes of model envelopes sent, by encoding", "encoding",
                      sorted(t.bytes_out.items()))  # fmt: skip
        for key, name, what in (("macro_f1", "fedhar_last_macro_f1", "Macro-F1"), ("accuracy", "fedhar_last_accuracy", "Accuracy")):
            yield _family(GaugeMetricFamily, name, f"{what} of the latest round that measured it", "measure",
                          [(m, v) for m in EXPORTED_MEASURES if (v := t.last.get((m, key))) is not None])  # fmt: skip
        if self.broker_link is not None and (up := self.broker_link()) is not None:
            yield GaugeMetricFamily("fedhar_broker_link_up", "1 while the status page's session with the broker is up", value=int(up))
        if self.since_last_round is not None and (since := self.since_last_round()) is not None:
            yield GaugeMetricFamily("fedhar_seconds_since_last_round", "Seconds since the newest completed round was recorded",
                                    value=since)  # fmt: skip
        if self.certificates is not None and (left := self.certificates()):
            yield _family(GaugeMetricFamily, "fedhar_certificate_expiry_seconds", "Seconds until the broker's certificate expires "
                          "(negative: expired), by which: server, ca", "which", sorted(left.items()))  # fmt: skip
        if self.devices is not None:
            counts = self.devices()
            yield _family(GaugeMetricFamily, "fedhar_devices", "Devices by state", "state", [(s, counts.get(s, 0)) for s in DEVICE_STATES])
        if self.malformed is not None:
            yield _family(CounterMetricFamily, "fedhar_monitor_malformed_messages", "Messages the monitor ignored as malformed, by kind",
                          "kind", sorted(self.malformed().items()))  # fmt: skip
        yield _family(GaugeMetricFamily, "fedhar_build_info", "The release of fedhar serving this federation", "version",
                      [(str(self.release), 1)])  # fmt: skip
        if self.harm is not None:
            yield from _harm_families(self.harm())
        if self.damaged is not None:
            yield _family(CounterMetricFamily, "fedhar_store_object_damaged_reports", "Devices' reports that a stored object "
                          "(by SHA-256) reached them damaged", "object", sorted(self.damaged().items()))  # fmt: skip
        if self.disk is not None and (disk := self.disk()) is not None:
            yield GaugeMetricFamily("fedhar_disk_free_bytes", "Free bytes on the data folder's filesystem", value=disk[0])
            yield GaugeMetricFamily("fedhar_disk_next_round_bytes", "Bytes the next round writes before anything is deleted",
                                    value=disk[1])  # fmt: skip


def _family(kind: Any, name: str, text: str, label: str, values: Iterable[tuple[str, float]]) -> Metric:
    """A metric family of ``kind`` with one sample per (label value, value)."""
    family = kind(name, text, labels=[label])
    for key, v in values:
        family.add_metric([key], v)
    return family


def _harm_families(harm: Mapping[str, Any]) -> Iterator[Metric]:
    """Per-device clipped updates, rejected messages and quarantine (:class:`coordinator.server.harm.DeviceHarm`)."""
    clipped = CounterMetricFamily("fedhar_device_updates_clipped", "A device's updates the quality guard clipped", labels=["device"])
    rejected = CounterMetricFamily("fedhar_device_messages_rejected", "A device's messages the coordinator rejected", labels=["device"])
    held = GaugeMetricFamily("fedhar_device_quarantined", "1 while the device is quarantined (left out of aggregation)",
                             labels=["device"])  # fmt: skip
    bad = CounterMetricFamily("fedhar_device_bad_object_reports", "Damaged stored objects a device reported", labels=["device"])
    for name, h in sorted(harm.items()):
        clipped.add_metric([name], h.clipped)
        rejected.add_metric([name], h.rejected_total)
        held.add_metric([name], int(h.quarantine is not None))
        bad.add_metric([name], h.bad_objects)
    yield from (clipped, rejected, held, bad)


def make_registry(totals: Callable[[], RoundTotals | Sequence[RoundRecord]], *args: Any, **more: Any) -> CollectorRegistry:
    """A new CollectorRegistry holding one :class:`FederationCollector` (arguments as there)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FederationCollector(totals, *args, **more))
    return reg


def scrape(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format (what ``/metrics`` answers)."""
    return generate_latest(registry)
