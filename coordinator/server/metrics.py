"""Prometheus metrics of the home server, computed from the round records at every scrape.

A Prometheus counter must only grow and must survive a restart of the exporter; the round
records in the run's database are both (a completed round is never removed). So the figures
are not counted in the serve loop as rounds go by: :class:`FederationCollector` sums the
records (:class:`coordinator.record.RoundRecord`) each time ``/metrics`` is scraped, and the
device gauges come from the server database and the monitor at that moment. The collector lives
in its own :class:`prometheus_client.CollectorRegistry` (never the global one), so two servers
in one process, or a test, do not see each other's figures.

Exported (prefix ``fedhar_``)::

    rounds_completed_total                       counter
    round_duration_seconds                       summary (count, sum) over completed rounds
    last_round_duration_seconds                  gauge
    last_round                                   gauge: index of the last completed round (-1: none)
    updates_accepted_total                       counter: valid updates (main exchanges)
    updates_rejected_total{reason}               counter: rejected messages by reason code
    bytes_in_total{encoding}                     counter: update envelopes received, by encoding
    bytes_out_total{encoding}                    counter: model envelopes sent (float32)
    devices{state}                               gauge: enrolled, online, revoked, forgotten
    last_macro_f1{measure}                       gauge: global, personalisation (latest round that has it)
    last_accuracy{measure}                       gauge
    monitor_malformed_messages_total{kind}       counter: messages the monitor ignored
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from coordinator.record import DEFAULT_ENCODING, RoundRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Content type of the text exposition format."""

UNKNOWN_REASON = "unspecified"
"""Reason label of rejected messages a record counts without saying why (``rejected`` above the
sum of its ``rejections``, as in records written before reasons were kept)."""

DEVICE_STATES = ("enrolled", "online", "revoked", "forgotten")


def rejected_by_reason(recs: Sequence[RoundRecord]) -> Counter[str]:
    """Rejected messages over ``recs`` by reason code; the uncounted rest under :data:`UNKNOWN_REASON`."""
    out: Counter[str] = Counter()
    for r in recs:
        p = r.participation
        for rej in p.rejections:
            out[rej.reason] += rej.count
        rest = p.rejected - sum(rej.count for rej in p.rejections)
        if rest > 0:
            out[UNKNOWN_REASON] += rest
    return out


def bytes_by_encoding(recs: Sequence[RoundRecord]) -> tuple[Counter[str], Counter[str]]:
    """``(bytes in by update encoding, bytes out by encoding)`` over ``recs``.

    Models go out as float32 envelopes, so bytes out are all under ``"float32"``.
    """
    up: Counter[str] = Counter()
    down: Counter[str] = Counter()
    for r in recs:
        t = r.traffic
        if t is None:
            continue
        if t.up_by_encoding:
            for enc, n in t.up_by_encoding.items():
                up[enc] += n
        elif t.bytes_up:
            up[DEFAULT_ENCODING] += t.bytes_up
        down[DEFAULT_ENCODING] += t.bytes_down
    return up, down


def _last(recs: Sequence[RoundRecord], measure: str, key: str) -> float | None:
    for r in reversed(recs):
        m = r.measure(measure)
        if m is not None:
            v = float(getattr(m, key))
            if not math.isnan(v):
                return v
    return None


class FederationCollector(Collector):
    """A prometheus-client collector over the federation's records and devices (see the module docstring).

    Parameters
    ----------
    records : callable returning a sequence of RoundRecord
        The completed rounds, in order (e.g. ``ServerView.records``); read at each scrape.
    devices : callable returning dict state -> int, optional
        Device counts by state (:data:`DEVICE_STATES`); a missing state is exported as 0.
    malformed : callable returning dict kind -> int, optional
        The monitor's counts of ignored messages.
    """

    def __init__(
        self,
        records: Callable[[], Sequence[RoundRecord]],
        devices: Callable[[], dict[str, int]] | None = None,
        malformed: Callable[[], dict[str, int]] | None = None,
    ):
        self._records = records
        self._devices = devices
        self._malformed = malformed

    def collect(self) -> Iterator[Metric]:
        """The metric families as of now (called by the registry at every scrape)."""
        recs = list(self._records())
        yield CounterMetricFamily("fedhar_rounds_completed", "Rounds completed", value=len(recs))
        yield SummaryMetricFamily("fedhar_round_duration_seconds", "Wall time of completed rounds, from selection to the stored record",
                                  count_value=len(recs), sum_value=float(sum(r.seconds for r in recs)))  # fmt: skip
        last = GaugeMetricFamily("fedhar_last_round_duration_seconds", "Wall time of the last completed round")
        if recs:
            last.add_metric([], float(recs[-1].seconds))
        yield last
        yield GaugeMetricFamily("fedhar_last_round", "Index of the last completed round (-1: none)", value=recs[-1].round if recs else -1)
        yield CounterMetricFamily("fedhar_updates_accepted", "Valid updates received in the rounds' main exchanges",
                                  value=sum(r.participation.updates for r in recs))  # fmt: skip
        rej = CounterMetricFamily("fedhar_updates_rejected", "Rejected update messages by reason", labels=["reason"])
        for reason, n in sorted(rejected_by_reason(recs).items()):
            rej.add_metric([reason], n)
        yield rej
        up, down = bytes_by_encoding(recs)
        bin_ = CounterMetricFamily("fedhar_bytes_in", "Bytes of valid update envelopes received, by encoding", labels=["encoding"])
        for enc, n in sorted(up.items()):
            bin_.add_metric([enc], n)
        yield bin_
        bout = CounterMetricFamily("fedhar_bytes_out", "Bytes of model envelopes sent, by encoding", labels=["encoding"])
        for enc, n in sorted(down.items()):
            bout.add_metric([enc], n)
        yield bout
        f1 = GaugeMetricFamily("fedhar_last_macro_f1", "Macro-F1 of the latest round that measured it", labels=["measure"])
        acc = GaugeMetricFamily("fedhar_last_accuracy", "Accuracy of the latest round that measured it", labels=["measure"])
        for measure in ("global", "personalisation"):
            if (v := _last(recs, measure, "macro_f1")) is not None:
                f1.add_metric([measure], v)
            if (v := _last(recs, measure, "accuracy")) is not None:
                acc.add_metric([measure], v)
        yield f1
        yield acc
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


def make_registry(
    records: Callable[[], Sequence[RoundRecord]],
    devices: Callable[[], dict[str, int]] | None = None,
    malformed: Callable[[], dict[str, int]] | None = None,
) -> CollectorRegistry:
    """A new CollectorRegistry holding one :class:`FederationCollector` (arguments as there)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FederationCollector(records, devices, malformed))
    return reg


def scrape(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format (what ``/metrics`` answers)."""
    return generate_latest(registry)
