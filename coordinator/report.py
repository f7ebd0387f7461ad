"""Run reports: ``report.json``, ``report.md`` (a table per round) and ``metrics.png``, rewritten after every round."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from coordinator.record import MEASURES, RoundRecord, records
from har_models.files import atomic_write, atomic_write_bytes

MODEL_NOTES = {
    "global": "global model after this round's aggregation (and growth) on the union of all clients' test sets "
    "(under FedDWA and FedPer: the shadow FedAvg average of the clients' trained models, "
    "which no client uses)",
    "personalisation": "each client's model after this round's local training, on its own test split; "
    "unweighted mean over clients",
    "generalisation": "each client's model after this round's local training, on the union test set; "
    "unweighted mean over clients",
    "received_union": "the model each client received this round (before FedALA/FedPer initialisation and training), "
    "on the union of the clients' test sets (sum of their confusion matrices); "
    "for FedAvg this is the previous round's global model",
}

START_NOTE = (
    "each client's model as it starts local training (after FedALA's or FedPer's initialisation; "
    "FedDWA's personalised model and FedAvg's global model as received), on its own test split; "
    "unweighted mean over clients"
)
"""What the "start" measure is (FedALA's protocol), noted in reports whose rounds recorded it."""


def model_notes(rounds: Sequence[RoundRecord]) -> dict[str, str]:
    """:data:`MODEL_NOTES`, plus "start" (:data:`START_NOTE`) when a round recorded that measure."""
    if any(r.evaluation.start is not None for r in rounds):
        return {**MODEL_NOTES, "start": START_NOTE}
    return dict(MODEL_NOTES)


def _fmt(x: Any, pct: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100 * x:.1f}" if pct else f"{x}"


def _mb(n: Any) -> str:
    return "n/a" if n is None else f"{n / 1e6:.1f}"


def _memory(m: Any) -> str | None:
    if not isinstance(m, dict):
        return None
    return f"{m.get('peak_pss_mb', 0):,} MB PSS ({m.get('peak_rss_mb', 0):,} MB summed RSS)"


def best_and_final(rounds: Sequence[RoundRecord]) -> dict[str, Any]:
    """Final-round and best-round accuracy / macro-F1 of each measure (a round without it does not count; NaN never wins)."""
    out: dict[str, Any] = {"final": {}, "best": {}}
    for m in MEASURES:
        rows = [(r.round, got) for r in rounds if (got := r.measure(m)) is not None]
        if not rows:
            continue
        last = rows[-1][1]
        out["final"][m] = {"round": rows[-1][0], "accuracy": last.accuracy, "macro_f1": last.macro_f1}
        for k in ("accuracy", "macro_f1"):
            rnd, v = max(rows, key=lambda rv: getattr(rv[1], k) if not math.isnan(getattr(rv[1], k)) else -1.0)
            out["best"].setdefault(m, {})[k] = {"round": rnd, "value": getattr(v, k)}
    return out


def write_report(
    folder: Path, header: Mapping[str, Any], rounds: Sequence[RoundRecord | Mapping[str, Any]], plot: bool = True
) -> dict[str, Any]:
    """Write the three report files into ``folder``; return the JSON document.

    ``header`` holds run-level facts (run id, dataset, strategy, seed, wall time, peak memory); ``rounds``
    are records or their JSON objects (a baseline's rows are written as given). Raises RecordError if a
    row cannot be read as a round record.
    """
    folder = Path(folder)
    rows = [r.to_json() if isinstance(r, RoundRecord) else dict(r) for r in rounds]
    recs = records(rounds)
    doc = {**header, "models_evaluated": model_notes(recs), "rounds": rows, **best_and_final(recs)}
    _write(folder / "report.json", json.dumps(doc, indent=2, sort_keys=False, default=str))
    _write(folder / "report.md", _markdown(doc, recs))
    if plot and recs:
        _plot(folder / "metrics.png", recs, str(header.get("title", "")))
    return doc


def _write(path: Path, text: str) -> None:
    atomic_write_bytes(path, text)


def _markdown(doc: Mapping[str, Any], recs: Sequence[RoundRecord]) -> str:
    lines = [f"# fedhar run {doc.get('run_id', '')}", ""]
    facts = [
        ("dataset", doc.get("dataset")),
        ("clients", doc.get("clients")),
        ("strategy", doc.get("strategy")),
        ("seed", doc.get("seed")),
        ("rounds completed", len(doc["rounds"])),
        ("wall time (s)", doc.get("wall_seconds")),
        ("peak memory, all processes", _memory(doc.get("peak_memory"))),
        ("command", doc.get("command")),
    ]
    lines += [f"- **{k}**: {v}" for k, v in facts if v is not None]
    lines += ["", "Accuracy and macro-F1 in %. Which model each number is from:", ""]
    lines += [f"- **{k}**: {v}" for k, v in model_notes(recs).items()]
    start = any(r.evaluation.start is not None for r in recs)  # its two columns only where a round recorded it
    lines += [
        "",
        "| round | updates | rejected | arch (F, H) | up MB | down MB | s "
        "| global acc | global F1 | pers. acc | pers. F1 | gen. acc | gen. F1 |" + (" start acc | start F1 |" if start else ""),
        "|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if start else ""),
    ]
    for r in recs:
        g, p, n, s0 = (r.measure(m) for m in MEASURES)
        part, arch, t = r.participation, r.arch, r.traffic
        lines.append(
            f"| {r.round} | {part.updates}/{part.selected} | {part.rejected} | "
            f"v{arch.version} ({arch.conv_filters}, {arch.dense_units}) | {_mb(t and t.bytes_up)} | "
            f"{_mb(t and t.bytes_down)} | {r.seconds:.1f} | {_fmt(g and g.accuracy)} | {_fmt(g and g.macro_f1)} | "
            f"{_fmt(p and p.accuracy)} | {_fmt(p and p.macro_f1)} | {_fmt(n and n.accuracy)} | {_fmt(n and n.macro_f1)} |"
            + (f" {_fmt(s0 and s0.accuracy)} | {_fmt(s0 and s0.macro_f1)} |" if start else "")
        )
    lines += _device_table(recs)
    if doc.get("final"):
        lines += [
            "",
            "## Final and best",
            "",
            "| measure | final acc | final F1 | best acc (round) | best F1 (round) |",
            "|---|---:|---:|---:|---:|",
        ]
        for m, f in doc["final"].items():
            b = doc["best"][m]
            lines.append(
                f"| {m} | {_fmt(f['accuracy'])} | {_fmt(f['macro_f1'])} | {_fmt(b['accuracy']['value'])} ({b['accuracy']['round']}) | "
                f"{_fmt(b['macro_f1']['value'])} ({b['macro_f1']['round']}) |"
            )
    return "\n".join(lines) + "\n"


def device_rows(recs: Sequence[RoundRecord]) -> list[dict[str, Any]]:
    """Each device's participation and own accuracy over the rounds, sorted by client id.

    Keys: ``client``, ``took_part``, ``missed`` (reason -> rounds), ``last_round``, ``last_accuracy``,
    ``last_macro_f1``, ``best_accuracy`` (NaN never wins), ``best_round``.
    """
    out: dict[str, dict[str, Any]] = {}

    def row(cid: str) -> dict[str, Any]:
        return out.setdefault(cid, {"client": cid, "took_part": 0, "missed": {}, "last_round": None, "last_accuracy": None,
                                    "last_macro_f1": None, "best_accuracy": None, "best_round": None})  # fmt: skip

    for r in recs:
        for cid, m in r.evaluation.personalisation_clients.items():
            d = row(cid)
            d["took_part"] += 1
            d["last_round"], d["last_accuracy"], d["last_macro_f1"] = r.round, m.accuracy, m.macro_f1
            if not math.isnan(m.accuracy) and (d["best_accuracy"] is None or m.accuracy > d["best_accuracy"]):
                d["best_accuracy"], d["best_round"] = m.accuracy, r.round
        for cid in r.participation.missing:
            why = r.participation.failures.get(cid, "missed")
            missed = row(cid)["missed"]
            missed[why] = missed.get(why, 0) + 1
    return [out[c] for c in sorted(out)]


def _device_table(recs: Sequence[RoundRecord]) -> list[str]:
    rows = device_rows(recs)
    if not rows:
        return []
    lines = [
        "",
        "## Devices",
        "",
        "Participation over the run's rounds, and each device's own model on its own test split (in %).",
        "",
        "| device | took part | missed (why) | last round | last acc | last F1 | best acc (round) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for d in rows:
        missed = ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in sorted(d["missed"].items())) or "0"
        best = f"{_fmt(d['best_accuracy'])} ({d['best_round']})" if d["best_accuracy"] is not None else "n/a"
        lines.append(
            f"| {d['client']} | {d['took_part']}/{len(recs)} | {missed} | {_fmt(d['last_round'], pct=False)} | "
            f"{_fmt(d['last_accuracy'])} | {_fmt(d['last_macro_f1'])} | {best} |"
        )
    return lines


def _plot(path: Path, rounds: Sequence[RoundRecord], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, key, label in ((axes[0], "accuracy", "accuracy"), (axes[1], "macro_f1", "macro-F1")):
        for m in MEASURES:
            pts = [(r.round, getattr(got, key)) for r in rounds if (got := r.measure(m)) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=m)
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle(title or "fedhar run")
    fig.tight_layout()
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    finally:
        plt.close(fig)
