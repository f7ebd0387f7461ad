"""REALWORLD loader: the real sample recording, synthetic archives with every anomaly, the cache.

Synthetic archives follow the official layout exactly (``proband{k}/data/{acc,gyr}_{act}_csv.zip``
holding ``acc_{act}_{pos}.csv`` / ``Gyroscope_{act}_{pos}.csv`` and a ``readMe``), both as the
outer ``realworld2016_dataset.zip`` and as its extracted folder. Every recording is sampled at
exactly 20 ms from a start that is a multiple of 20 ms, so its grid has one point per row and
the window count of n rows is ``(n - 128) // 64 + 1``.
"""

from __future__ import annotations

import io
import logging
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from har_models.data.labels import REALWORLD_LABELS
from har_models.data.pipeline import windows_from_recording
from har_models.data.realworld import (
    ACTIVITIES,
    POSITIONS,
    Anomaly,
    RealWorldConfig,
    load_realworld_subject,
    parse_realworld_csv,
    read_realworld_subject,
    realworld_subject_ids,
    realworld_subject_windows,
    recording_from_csv_files,
)
from har_models.data.resample import Resampler

SAMPLE = Path(__file__).resolve().parents[1] / "datasets" / "realworld" / "sample" / "proband1"
ACC_CSV = SAMPLE / "acc_walking_shin.csv"
GYRO_CSV = SAMPLE / "Gyroscope_walking_shin.csv"

T0 = 1_435_993_159_400  # ms, a multiple of 20 ms
SMALL = ("chest", "shin")
CONFIG = RealWorldConfig(positions=SMALL)
N = 200  # rows per synthetic CSV: 200 grid points -> 2 windows
README = b"acc_walking_chest.csv\nfrequency: 50.0 Hz\n"
PREFIX = {"acc": "acc", "gyro": "Gyroscope"}
ST = {"acc": "acc", "gyro": "gyr"}


def n_windows(n: int) -> int:
    return (n - 128) // 64 + 1 if n >= 128 else 0


# ---------------------------------------------------------------------------------------
# Builders of synthetic archives


def start_ms(activity: str, position: str, part: int = 1) -> int:
    return T0 + 600_000 * (8 * ACTIVITIES.index(activity) + POSITIONS.index(position)) + 120_000 * (part - 1)


def values(sensor: str, t_ms: np.ndarray) -> np.ndarray:
    s = (np.asarray(t_ms, np.int64) - T0) / 1000.0
    if sensor == "acc":
        return np.stack([np.sin(s), np.full_like(s, 9.81), np.cos(s)], axis=1)
    return np.stack([0.01 * (s % 100.0), np.full_like(s, -0.02), np.full_like(s, 0.03)], axis=1)


def csv_lines(sensor: str, t_ms, xyz=None) -> list[str]:
    t_ms = np.asarray(t_ms, np.int64)
    xyz = values(sensor, t_ms) if xyz is None else np.asarray(xyz, float)
    return [f"{i + 1},{t},{x!r},{y!r},{z!r}" for i, (t, (x, y, z)) in enumerate(zip(t_ms.tolist(), xyz.tolist(), strict=True))]


def csv_bytes(sensor: str, t_ms, xyz=None, header: bool = True) -> bytes:
    lines = (["id,attr_time,attr_x,attr_y,attr_z"] if header else []) + csv_lines(sensor, t_ms, xyz)
    return ("\n".join(lines) + "\n").encode()


def clean_times(start: int, n: int = N, period: int = 20) -> np.ndarray:
    return start + period * np.arange(n, dtype=np.int64)


def zip_bytes(members: dict[str, bytes], stored: bool = False) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def sensor_members(sensor: str, activity: str, positions=SMALL, n: int = N, infix: str = "", part: int = 1) -> dict[str, bytes]:
    members = {
        f"{PREFIX[sensor]}_{activity}{infix}_{pos}.csv": csv_bytes(sensor, clean_times(start_ms(activity, pos, part), n))
        for pos in positions
    }
    members["readMe"] = README
    return members


def standard_archives(positions=SMALL, n: int = N) -> dict[str, bytes]:
    return {
        f"{ST[s]}_{act}_csv.zip": zip_bytes(sensor_members(s, act, positions, n)) for act in ACTIVITIES for s in ("acc", "gyro")
    }


def write_dataset(tmp_path: Path, subjects: dict[int, dict[str, bytes]], zipped: bool) -> Path:
    """The official layout under ``realworld2016_dataset/``; the outer zip or the folder."""
    top = "realworld2016_dataset"
    if zipped:
        tmp_path.mkdir(parents=True, exist_ok=True)
        path = tmp_path / "realworld2016_dataset.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr(f"{top}/", b"")
            for k, archives in subjects.items():
                zf.writestr(f"{top}/proband{k}/", b"")
                zf.writestr(f"{top}/proband{k}/data/", b"")
                for name, data in archives.items():
                    zf.writestr(f"{top}/proband{k}/data/{name}", data)
        return path
    for k, archives in subjects.items():
        data_dir = tmp_path / top / f"proband{k}" / "data"
        data_dir.mkdir(parents=True)
        for name, data in archives.items():
            (data_dir / name).write_bytes(data)
    return tmp_path / top


def kinds(anomalies) -> list[tuple[str, str, str]]:
    return [(a.kind, a.where, a.file) for a in anomalies]


def sessions(subject) -> list[str]:
    return [r.session for r in subject.recordings]


# ---------------------------------------------------------------------------------------
# The real recording (proband1, walking, shin)


@pytest.fixture(scope="module")
def real():
    rec, anomalies = recording_from_csv_files(ACC_CSV, GYRO_CSV, 1, "walking", "shin")
    return rec, anomalies


def _inside_gaps(grid: np.ndarray, t: np.ndarray, max_gap: int) -> np.ndarray:
    """Brute force, independent of the resampler: grid points strictly inside a gap of stream t."""
    t = np.unique(t)
    d = np.diff(t)
    bad = np.zeros(grid.shape, bool)
    for a, b in zip(t[:-1][d > max_gap], t[1:][d > max_gap], strict=True):
        bad |= (grid > a) & (grid < b)
    return bad


def test_sample_files_are_the_published_bytes():
    import hashlib

    assert hashlib.sha256(ACC_CSV.read_bytes()).hexdigest() == "35e25241ac17e4665e7445814215b8e5543f443461ad671893fc9102d2453e88"
    assert hashlib.sha256(GYRO_CSV.read_bytes()).hexdigest() == "53067f787d428d494b6ef2e205e847348ec7fc431c0ada13cdc3e6b336f4bbaa"


def test_real_recording_parses_with_units(real):
    rec, anomalies = real
    assert (rec.subject, rec.session) == ("proband1", "walking/shin")
    assert (len(rec.acc), len(rec.gyro)) == (31_947, 31_946)
    assert rec.acc.t_ns[0] == 1_435_993_159_412 * 1_000_000  # attr_time ms -> ns
    assert np.all(rec.labels.at(rec.acc.t_ns) == REALWORLD_LABELS.index("walking"))
    # m/s^2 with gravity: the mean acceleration vector is gravity (the mean of |a| is larger while walking)
    assert abs(np.linalg.norm(rec.acc.xyz.mean(axis=0)) - 9.8) < 0.1
    assert 9.0 < np.median(np.linalg.norm(rec.acc.xyz, axis=1)) < 12.0
    # rad/s, not deg/s: a shin swings at a few rad/s
    assert 1.0 < np.linalg.norm(rec.gyro.xyz, axis=1).mean() < 5.0
    # the only anomaly of this file: gaps (48 in acc, 47 in gyro, up to 1.53 s)
    assert [(a.kind, a.where) for a in anomalies] == [("gaps", "proband1/walking/shin")] * 2
    assert anomalies[0].action.startswith("acc: 48 gaps longer than 100 ms (longest 1.53 s,")
    assert anomalies[1].action.startswith("gyro: 47 gaps longer than 100 ms (longest 1.52 s,")


def test_real_recording_resamples_onto_the_50hz_grid(real):
    rec, _ = real
    r = Resampler()
    out = [r.push("acc", rec.acc.t_ns, rec.acc.xyz), r.push("gyro", rec.gyro.t_ns, rec.gyro.xyz), r.close()]
    t = np.concatenate([o[0] for o in out])
    v = np.concatenate([o[1] for o in out])
    p = 20_000_000
    assert np.all(t % p == 0)
    d = np.diff(t)
    assert np.all(d >= p)
    # grid points = multiples of 20 ms in the common span, minus those inside a gap of either stream
    lo = max(rec.acc.t_ns.min(), rec.gyro.t_ns.min())
    hi = min(rec.acc.t_ns.max(), rec.gyro.t_ns.max())
    full = np.arange(-(-lo // p) * p, hi + 1, p)
    skipped = _inside_gaps(full, rec.acc.t_ns, 100_000_000) | _inside_gaps(full, rec.gyro.t_ns, 100_000_000)
    assert np.array_equal(t, full[~skipped])
    assert full.size == 31_977  # 639.53 s of common span
    assert r.stats.grid_points == t.size == 31_048
    assert r.stats.gap_points_skipped == int(skipped.sum()) == 929
    # within runs the spacing is exactly 20 ms; a run ends at each stretch of skipped points
    stretches = int(np.sum(skipped[1:] & ~skipped[:-1]) + skipped[0])
    assert int(np.sum(d != p)) == stretches == 50
    assert abs(np.linalg.norm(v[:, :3].mean(axis=0)) - 9.8) < 0.1


def test_real_recording_windows_never_span_a_gap(real):
    rec, _ = real
    ws = windows_from_recording(rec, REALWORLD_LABELS)
    assert len(ws) == 417
    assert ws.x.shape == (417, 6, 128) and ws.x.dtype == np.float32
    assert np.all(ws.y == REALWORLD_LABELS.index("walking"))
    steps = ws.t_start_ns[:, None] + 20_000_000 * np.arange(128)[None, :]
    inside = _inside_gaps(steps.ravel(), rec.acc.t_ns, 100_000_000) | _inside_gaps(steps.ravel(), rec.gyro.t_ns, 100_000_000)
    assert not inside.any()
    assert np.all(ws.t_start_ns % 20_000_000 == 0)


def test_real_recording_through_the_official_layout(tmp_path, real):
    rec, _ = real
    archives = {
        "acc_walking_csv.zip": zip_bytes({"acc_walking_shin.csv": ACC_CSV.read_bytes(), "readMe": README}),
        "gyr_walking_csv.zip": zip_bytes({"Gyroscope_walking_shin.csv": GYRO_CSV.read_bytes(), "readMe": README}),
    }
    root = write_dataset(tmp_path, {1: archives}, zipped=True)
    config = RealWorldConfig(positions=("shin",))
    subject = read_realworld_subject(root, 1, config)
    assert sessions(subject) == ["walking/shin"]
    loaded = subject.recordings[0]
    assert np.array_equal(loaded.acc.t_ns, rec.acc.t_ns) and np.array_equal(loaded.gyro.xyz, rec.gyro.xyz)
    missing = [(a.kind, a.where) for a in subject.anomalies if a.kind == "missing_archive"]
    assert missing == [("missing_archive", f"proband1/{act}") for act in ACTIVITIES if act != "walking" for _ in (0, 1)]
    ws = realworld_subject_windows(subject, config)
    ref = windows_from_recording(rec, REALWORLD_LABELS)
    assert np.array_equal(ws.x, ref.x) and np.array_equal(ws.y, ref.y) and np.array_equal(ws.t_start_ns, ref.t_start_ns)


# ---------------------------------------------------------------------------------------
# Clean synthetic archives, zipped and extracted


@pytest.mark.parametrize("zipped", [True, False])
def test_clean_subject(tmp_path, zipped):
    root = write_dataset(tmp_path, {1: standard_archives()}, zipped)
    subject = read_realworld_subject(root, 1, CONFIG)
    assert subject.anomalies == ()
    assert sessions(subject) == [f"{act}/{pos}" for act in ACTIVITIES for pos in SMALL]
    rec = subject.recordings[0]
    assert rec.subject == "proband1" and rec.notes == ()
    assert rec.acc.t_ns[0] == start_ms("climbingdown", "chest") * 1_000_000
    ws = realworld_subject_windows(subject, CONFIG)
    assert len(ws) == 16 * n_windows(N) == 32
    assert np.array_equal(ws.class_counts(), [4] * 8)
    # grid points coincide with samples, so the windows hold the file's values exactly (as float32)
    t = start_ms("climbingdown", "chest") + 20 * np.arange(128)
    assert np.array_equal(ws.x[0, :3].T, values("acc", t).astype(np.float32))
    assert np.array_equal(ws.x[0, 3:].T, values("gyro", t).astype(np.float32))


def test_zipped_and_extracted_give_identical_results(tmp_path):
    archives = standard_archives()
    archives["acc_walking_csv.zip"] = zip_bytes(sensor_members("acc", "walking", infix="_2"))
    a = read_realworld_subject(write_dataset(tmp_path / "z", {1: archives}, True), 1, CONFIG)
    b = read_realworld_subject(write_dataset(tmp_path / "d", {1: archives}, False), 1, CONFIG)
    assert a.anomalies == b.anomalies and len(a.anomalies) == 2
    wa, wb = realworld_subject_windows(a, CONFIG), realworld_subject_windows(b, CONFIG)
    assert np.array_equal(wa.x, wb.x) and np.array_equal(wa.t_start_ns, wb.t_start_ns)


def test_subject_ids_and_errors(tmp_path):
    subjects = {k: {"acc_walking_csv.zip": zip_bytes(sensor_members("acc", "walking"))} for k in (12, 1, 3)}
    zipped = write_dataset(tmp_path / "z", subjects, True)
    folder = write_dataset(tmp_path / "d", subjects, False)
    assert realworld_subject_ids(zipped) == realworld_subject_ids(folder) == [1, 3, 12]
    # probands at the top of the given folder work too
    assert realworld_subject_ids(folder.parent) == [1, 3, 12]
    with pytest.raises(FileNotFoundError, match=r"proband2 has no data folder .*subjects present: 1, 3, 12"):
        read_realworld_subject(zipped, 2)
    with pytest.raises(FileNotFoundError, match=r"fetch_realworld\.py"):
        realworld_subject_ids(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no REALWORLD subject folders"):
        realworld_subject_ids(tmp_path / "empty")
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match=r"bad.zip is not a readable zip file"):
        realworld_subject_ids(bad)


def test_config_validation():
    assert RealWorldConfig().positions == POSITIONS  # all 7 pooled by default, as FedDist
    with pytest.raises(ValueError, match="positions must be distinct names"):
        RealWorldConfig(positions=("chest", "belly"))
    with pytest.raises(ValueError, match="positions must be distinct names"):
        RealWorldConfig(positions=("chest", "chest"))
    with pytest.raises(ValueError, match="window must be > 0"):
        RealWorldConfig(window=0)


# ---------------------------------------------------------------------------------------
# Anomalies


def multipart_archives(sensor: str, activity: str, lengths=(200, 300, 130), corrupt_part: int | None = None) -> bytes:
    """The official zip-in-zip naming: acc part 1 ``acc_{a}_1_csv.zip``, gyro part 1 ``gyr_{a}_csv.zip``."""
    inner = {}
    for part, n in enumerate(lengths, start=1):
        if part == 1:
            name = f"{ST[sensor]}_{activity}_1_csv.zip" if sensor == "acc" else f"{ST[sensor]}_{activity}_csv.zip"
            members = sensor_members(sensor, activity, n=n, part=1)
        else:
            name = f"{ST[sensor]}_{activity}_{part}_csv.zip"
            members = sensor_members(sensor, activity, n=n, infix=f"_{part}", part=part)
        inner[name] = b"garbage, not a zip" if part == corrupt_part else zip_bytes(members)
    return zip_bytes(inner)


@pytest.mark.parametrize("zipped", [True, False])
def test_multipart_zip_in_zip(tmp_path, zipped):
    archives = standard_archives()
    archives["acc_climbingup_csv.zip"] = multipart_archives("acc", "climbingup")
    archives["gyr_climbingup_csv.zip"] = multipart_archives("gyro", "climbingup")
    subject = read_realworld_subject(write_dataset(tmp_path, {4: archives}, zipped), 4, CONFIG)
    assert [s for s in sessions(subject) if s.startswith("climbingup")] == [
        f"climbingup/{pos}/part{i}" for pos in SMALL for i in (1, 2, 3)
    ]
    assert kinds(subject.anomalies) == [
        ("multipart", "proband4/climbingup", "proband4/data/acc_climbingup_csv.zip"),
        ("multipart", "proband4/climbingup", "proband4/data/gyr_climbingup_csv.zip"),
    ]
    assert subject.anomalies[0].action == (
        "acc archive holds 3 inner archives (zip-in-zip); read as parts 1, 2, 3, each a recording of its own"
    )
    # paired by part index although acc part 1 is acc_climbingup_1_csv.zip and gyro part 1 gyr_climbingup_csv.zip
    part2 = next(r for r in subject.recordings if r.session == "climbingup/shin/part2")
    assert part2.acc.t_ns[0] == part2.gyro.t_ns[0] == start_ms("climbingup", "shin", 2) * 1_000_000
    ws = realworld_subject_windows(subject, CONFIG)
    per_position = n_windows(200) + n_windows(300) + n_windows(130)
    assert per_position == 2 + 3 + 1
    assert ws.class_counts()[REALWORLD_LABELS.index("climbingup")] == 2 * per_position
    assert len(ws) == 14 * n_windows(N) + 2 * per_position


def test_odd_name_single_recording(tmp_path):
    archives = standard_archives()
    archives["acc_walking_csv.zip"] = zip_bytes(sensor_members("acc", "walking", infix="_2"))
    archives["gyr_walking_csv.zip"] = zip_bytes(sensor_members("gyro", "walking", infix="_2"))
    subject = read_realworld_subject(write_dataset(tmp_path, {4: archives}, True), 4, CONFIG)
    assert kinds(subject.anomalies) == [
        ("odd_name", "proband4/walking/chest", "proband4/data/acc_walking_csv.zip!acc_walking_2_chest.csv"),
        ("odd_name", "proband4/walking/shin", "proband4/data/acc_walking_csv.zip!acc_walking_2_shin.csv"),
        ("odd_name", "proband4/walking/chest", "proband4/data/gyr_walking_csv.zip!Gyroscope_walking_2_chest.csv"),
        ("odd_name", "proband4/walking/shin", "proband4/data/gyr_walking_csv.zip!Gyroscope_walking_2_shin.csv"),
    ]
    assert subject.anomalies[0].action == (
        "acc_walking_2_chest.csv carries a part infix in a single recording; read as walking/chest"
    )
    assert sessions(subject)[-2:] == ["walking/chest", "walking/shin"]
    assert len(realworld_subject_windows(subject, CONFIG)) == 32
    walking = subject.recordings[-1]
    assert walking.notes == (
        "odd_name: acc_walking_2_shin.csv carries a part infix in a single recording; read as walking/shin",
        "odd_name: Gyroscope_walking_2_shin.csv carries a part infix in a single recording; read as walking/shin",
    )


def test_ambiguous_and_unexpected_members(tmp_path):
    archives = standard_archives()
    members = sensor_members("acc", "walking")
    members["acc_walking_2_shin.csv"] = csv_bytes("acc", clean_times(T0, 300))
    members["notes.txt"] = b"hello"
    members[".DS_Store"] = b"\0"
    members["__MACOSX/._acc_walking_chest.csv"] = b"\0"
    archives["acc_walking_csv.zip"] = zip_bytes(members)
    subject = read_realworld_subject(write_dataset(tmp_path, {1: archives}, True), 1, CONFIG)
    assert kinds(subject.anomalies) == [
        ("unexpected_member", "proband1/walking", "proband1/data/acc_walking_csv.zip!notes.txt"),
        ("ambiguous_csv", "proband1/walking/shin", "proband1/data/acc_walking_csv.zip!acc_walking_shin.csv"),
    ]
    assert subject.anomalies[1].action == "2 acc CSVs for shin: used acc_walking_shin.csv, ignored acc_walking_2_shin.csv"
    assert len(realworld_subject_windows(subject, CONFIG)) == 32


def test_missing_archive_recording_and_sensor(tmp_path):
    config = RealWorldConfig(positions=("forearm", "thigh"))
    archives = standard_archives(positions=("forearm", "thigh"))
    # proband2 climbingup forearm: neither sensor; proband6-like jumping thigh: gyro only missing
    archives["acc_climbingup_csv.zip"] = zip_bytes(sensor_members("acc", "climbingup", positions=("thigh",)))
    archives["gyr_climbingup_csv.zip"] = zip_bytes(sensor_members("gyro", "climbingup", positions=("thigh",)))
    archives["gyr_jumping_csv.zip"] = zip_bytes(sensor_members("gyro", "jumping", positions=("forearm",)))
    del archives["gyr_lying_csv.zip"]
    subject = read_realworld_subject(write_dataset(tmp_path, {2: archives}, False), 2, config)
    assert kinds(subject.anomalies) == [
        (
            "missing_recording",
            "proband2/climbingup/forearm",
            "proband2/data/acc_climbingup_csv.zip + proband2/data/gyr_climbingup_csv.zip",
        ),
        ("missing_sensor", "proband2/jumping/thigh", "proband2/data/acc_jumping_csv.zip!acc_jumping_thigh.csv"),
        ("missing_archive", "proband2/lying", "proband2/data/gyr_lying_csv.zip"),
    ]
    assert subject.anomalies[1].action == "acc CSV present but no gyro CSV for jumping/thigh; recording skipped"
    assert (
        subject.anomalies[2].action == "no gyro archive gyr_lying_csv.zip for lying; the lying recordings of proband2 are skipped"
    )
    got = sessions(subject)
    assert "climbingup/forearm" not in got and "jumping/thigh" not in got and not any(s.startswith("lying") for s in got)
    assert len(got) == 16 - 1 - 1 - 2
    assert len(realworld_subject_windows(subject, config)) == 12 * n_windows(N)


def test_gyro_with_many_more_rows_is_resampled_not_dropped(tmp_path):
    archives = standard_archives()
    start = start_ms("running", "chest")
    t_gyro = clean_times(start, 797, period=5)  # 200 Hz over the same 3.98 s as 200 acc rows at 50 Hz
    gyro = sensor_members("gyro", "running")
    gyro["Gyroscope_running_chest.csv"] = csv_bytes("gyro", t_gyro)
    # running/shin: the gyro keeps recording three times as long as the acc, at the same rate
    gyro["Gyroscope_running_shin.csv"] = csv_bytes("gyro", clean_times(start_ms("running", "shin"), 3 * N))
    archives["gyr_running_csv.zip"] = zip_bytes(gyro)
    subject = read_realworld_subject(write_dataset(tmp_path, {8: archives}, True), 8, CONFIG)
    assert subject.anomalies == (
        Anomaly(
            "rate_mismatch",
            "proband8/running/chest",
            "proband8/data/acc_running_csv.zip!acc_running_chest.csv"
            " + proband8/data/gyr_running_csv.zip!Gyroscope_running_chest.csv",
            "acc 200 rows at 50.0 Hz vs gyro 797 rows at 200.0 Hz (median spacing); "
            "both resampled onto the 50 Hz grid over their common 4.0 s (FedDist drops such recordings)",
        ),
        Anomaly(
            "span_mismatch",
            "proband8/running/shin",
            "proband8/data/acc_running_csv.zip!acc_running_shin.csv"
            " + proband8/data/gyr_running_csv.zip!Gyroscope_running_shin.csv",
            "acc spans 4.0 s, gyro 12.0 s; only their common 4.0 s is windowed",
        ),
    )
    ws = realworld_subject_windows(subject, CONFIG)
    assert len(ws) == 32
    running = np.flatnonzero(ws.t_start_ns == start * 1_000_000)
    assert running.size == 1
    t = start + 20 * np.arange(128)
    # The 200 Hz gyro is low-passed before decimation (anti-aliasing): its slow ramp and constants
    # pass unchanged up to rounding, except within the filter's half length (0.12 s, 6 grid samples)
    # of the recording's start, where the held first value bends the ramp by less than 1e-4 rad/s.
    got, want = ws.x[running[0], 3:].T, values("gyro", t).astype(np.float32)
    np.testing.assert_allclose(got[6:], want[6:], rtol=0, atol=2e-6)
    np.testing.assert_allclose(got[:6], want[:6], rtol=0, atol=1e-4)
    assert not np.array_equal(got[:6], want[:6])


def test_duplicated_out_of_order_late_and_gapped_stamps(tmp_path, caplog):
    archives = standard_archives()
    # walking/chest: a 1.52 s gap in acc (rows 150..224 missing): runs of 150 and 175 grid points
    t_gap = np.delete(clean_times(start_ms("walking", "chest"), 400), np.arange(150, 225))
    acc = sensor_members("acc", "walking")
    acc["acc_walking_chest.csv"] = csv_bytes("acc", t_gap)
    gyro = sensor_members("gyro", "walking", n=400)
    # walking/shin: acc rows 80/81 swapped, a row stamped 1.01 s too early after row 120; gyro row 50 repeated
    t = clean_times(start_ms("walking", "shin"))
    t_acc = t.copy()
    t_acc[[80, 81]] = t_acc[[81, 80]]
    xyz_acc = values("acc", t_acc)
    t_acc = np.insert(t_acc, 121, t[120] - 1010)
    xyz_acc = np.insert(xyz_acc, 121, [-5.0, -5.0, -5.0], axis=0)
    acc["acc_walking_shin.csv"] = csv_bytes("acc", t_acc, xyz_acc)
    t_gyro = np.insert(t, 51, t[50])
    xyz_gyro = np.insert(values("gyro", t), 51, [99.0, 99.0, 99.0], axis=0)
    gyro["Gyroscope_walking_shin.csv"] = csv_bytes("gyro", t_gyro, xyz_gyro)
    archives["acc_walking_csv.zip"] = zip_bytes(acc)
    archives["gyr_walking_csv.zip"] = zip_bytes(gyro)
    root = write_dataset(tmp_path, {1: archives}, True)

    with caplog.at_level(logging.INFO, logger="har_models.data.realworld"):
        subject = read_realworld_subject(root, 1, CONFIG)
    data = "proband1/data/"
    assert [(a.kind, a.where, a.file, a.action) for a in subject.anomalies] == [
        (
            "gaps",
            "proband1/walking/chest",
            data + "acc_walking_csv.zip!acc_walking_chest.csv",
            "acc: 1 gap longer than 100 ms (longest 1.52 s, 1.5 s in all); not interpolated, no window spans them",
        ),
        (
            "out_of_order",
            "proband1/walking/shin",
            data + "acc_walking_csv.zip!acc_walking_shin.csv",
            "acc: 2 samples stamped before an earlier row; 1 re-sorted within the 200 ms reorder horizon, 1 dropped as late",
        ),
        (
            "duplicate_stamps",
            "proband1/walking/shin",
            data + "gyr_walking_csv.zip!Gyroscope_walking_shin.csv",
            "gyro: 1 sample with a timestamp seen before; the first to arrive is kept",
        ),
    ]
    # logged once each, at info level (nothing was lost that the file could give)
    messages = [r.getMessage() for r in caplog.records if r.name == "har_models.data.realworld"]
    assert messages == [str(a) for a in subject.anomalies]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "har_models.data.realworld")

    ws = realworld_subject_windows(subject, CONFIG)
    walking = REALWORLD_LABELS.index("walking")
    chest = ws.t_start_ns[(ws.y == walking)] // 1_000_000
    t_chest = start_ms("walking", "chest")
    # one window in each run: [0, 128) before the gap, [225, 353) after it
    assert chest[:1].tolist() == [t_chest] and chest[1] == t_chest + 20 * 225
    assert len(ws) == 32  # chest: 1 + 1 instead of 5 windows without the gap; shin: 2 as if clean
    # the shin windows equal those of the clean recording: swap re-sorted, late row and duplicate dropped
    clean = read_realworld_subject(write_dataset(tmp_path / "clean", {1: standard_archives()}, True), 1, CONFIG)
    cws = realworld_subject_windows(clean, CONFIG)
    shin = ws.t_start_ns >= start_ms("walking", "shin") * 1_000_000
    cshin = cws.t_start_ns >= start_ms("walking", "shin") * 1_000_000
    assert np.array_equal(ws.x[shin], cws.x[cshin])


def test_malformed_rows_headers_and_empty_files(tmp_path, caplog):
    archives = standard_archives()
    start = start_ms("walking", "chest")
    good = csv_lines("acc", clean_times(start, 192))
    lines = ["id,attr_time,attr_x,attr_y,attr_z", *good]
    lines.insert(51, "51,abc,1,2,3")  # non-numeric
    lines.insert(102, f"101,{start + 2010},0.1,0.2")  # a field short
    lines.insert(153, "")  # blank lines are not rows
    lines.insert(154, f"151,{start + 3010},nan,9.81,0.0")  # non-finite
    lines.append("193,14359931")  # truncated by a broken download
    acc = sensor_members("acc", "walking")
    acc["acc_walking_chest.csv"] = "\n".join(lines).encode()
    acc["acc_walking_shin.csv"] = b"time,x,y,z\n1,2,3,4\n"
    gyro = sensor_members("gyro", "walking")
    gyro["Gyroscope_walking_chest.csv"] = csv_bytes("gyro", clean_times(start, 192), header=False)
    archives["acc_walking_csv.zip"] = zip_bytes(acc)
    archives["gyr_walking_csv.zip"] = zip_bytes(gyro)
    standing = sensor_members("gyro", "standing")
    standing["Gyroscope_standing_chest.csv"] = b"id,attr_time,attr_x,attr_y,attr_z\n"
    standing["Gyroscope_standing_shin.csv"] = b""
    archives["gyr_standing_csv.zip"] = zip_bytes(standing)

    with caplog.at_level(logging.INFO, logger="har_models.data.realworld"):
        subject = read_realworld_subject(write_dataset(tmp_path, {1: archives}, True), 1, CONFIG)
    data = "proband1/data/"
    assert [(a.kind, a.where, a.file, a.action) for a in subject.anomalies] == [
        (
            "empty",
            "proband1/standing/chest",
            data + "gyr_standing_csv.zip!Gyroscope_standing_chest.csv",
            "Gyroscope_standing_chest.csv has no valid rows; recording skipped",
        ),
        (
            "empty",
            "proband1/standing/shin",
            data + "gyr_standing_csv.zip!Gyroscope_standing_shin.csv",
            "Gyroscope_standing_shin.csv has no rows; recording skipped",
        ),
        (
            "malformed_rows",
            "proband1/walking/chest",
            data + "acc_walking_csv.zip!acc_walking_chest.csv",
            "4 of 196 rows of acc_walking_chest.csv skipped (truncated, non-numeric, non-finite or implausible time) "
            "at line 52, 103, 155, 198",
        ),
        (
            "no_header",
            "proband1/walking/chest",
            data + "gyr_walking_csv.zip!Gyroscope_walking_chest.csv",
            "Gyroscope_walking_chest.csv has no header line; columns read as id,attr_time,attr_x,attr_y,attr_z",
        ),
        (
            "bad_header",
            "proband1/walking/shin",
            data + "acc_walking_csv.zip!acc_walking_shin.csv",
            "acc_walking_shin.csv header 'time,x,y,z' lacks attr_time, attr_x, attr_y, attr_z; file skipped",
        ),
    ]
    levels = {r.getMessage().split(" at ")[0]: r.levelno for r in caplog.records}
    assert levels["REALWORLD malformed_rows"] == logging.WARNING and levels["REALWORLD no_header"] == logging.INFO
    assert [s for s in sessions(subject) if s.startswith(("walking", "standing"))] == ["walking/chest"]
    walking_chest = subject.recordings[-1]
    assert len(walking_chest.acc) == len(walking_chest.gyro) == 192
    assert walking_chest.notes[0].startswith("malformed_rows: 4 of 196 rows")
    assert len(realworld_subject_windows(subject, CONFIG)) == 12 * n_windows(N) + n_windows(192)


def test_corrupt_archives_and_members_do_not_stop_the_load(tmp_path, caplog):
    archives = standard_archives()
    archives["gyr_running_csv.zip"] = b"PK\x03\x04 this is not really a zip"
    archives["acc_lying_csv.zip"] = archives["acc_lying_csv.zip"][:300]  # truncated download
    # a member whose bytes no longer match its CRC-32
    sitting = zip_bytes(sensor_members("acc", "sitting"), stored=True)
    cut = sitting.index(b"\n10,") + 3
    archives["acc_sitting_csv.zip"] = sitting[:cut] + (b"9" if sitting[cut : cut + 1] != b"9" else b"8") + sitting[cut + 1 :]
    # a multi-part recording whose second inner archive is damaged
    archives["acc_climbingup_csv.zip"] = multipart_archives("acc", "climbingup", (200, 200, 200), corrupt_part=2)
    archives["gyr_climbingup_csv.zip"] = multipart_archives("gyro", "climbingup", (200, 200, 200))

    with caplog.at_level(logging.INFO, logger="har_models.data.realworld"):
        subject = read_realworld_subject(write_dataset(tmp_path, {1: archives}, False), 1, CONFIG)
    data = "proband1/data/"
    assert kinds(subject.anomalies) == [
        ("corrupt_archive", "proband1/climbingup/part2", data + "acc_climbingup_csv.zip!acc_climbingup_2_csv.zip"),
        ("multipart", "proband1/climbingup", data + "acc_climbingup_csv.zip"),
        ("multipart", "proband1/climbingup", data + "gyr_climbingup_csv.zip"),
        ("corrupt_archive", "proband1/lying", data + "acc_lying_csv.zip"),
        ("corrupt_archive", "proband1/running", data + "gyr_running_csv.zip"),
        ("corrupt_member", "proband1/sitting/chest", data + "acc_sitting_csv.zip!acc_sitting_chest.csv"),
    ]
    by_kind = {(a.kind, a.where): a.action for a in subject.anomalies}
    assert by_kind[("corrupt_archive", "proband1/running")].startswith("not a readable zip archive (")
    assert by_kind[("corrupt_archive", "proband1/running")].endswith(
        "expected a zip of Gyroscope_running_<position>.csv files; "
        "the running recordings are skipped (download the dataset again)"
    )
    assert "Bad CRC-32" in by_kind[("corrupt_member", "proband1/sitting/chest")]
    got = sessions(subject)
    assert [s for s in got if s.startswith("climbingup")] == [f"climbingup/{p}/part{i}" for p in SMALL for i in (1, 3)]
    assert not any(s.startswith(("lying", "running")) for s in got) and "sitting/chest" not in got
    ws = realworld_subject_windows(subject, CONFIG)
    # climbingdown 4 + climbingup 2 positions x 2 parts x 2 + jumping 4 + sitting/shin 2 + standing 4 + walking 4
    assert len(ws) == 4 + 8 + 4 + 2 + 4 + 4
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 4 and all("REALWORLD corrupt_" in r.getMessage() for r in warned)


def test_parse_csv_directly():
    stream, problems = parse_realworld_csv(b"\xef\xbb\xbfid,attr_time,attr_x,attr_y,attr_z\r\n1,1000,1.5,2,3\r\n2,1020,4,5,6\r\n")
    assert problems == []
    assert stream.t_ns.tolist() == [1_000_000_000, 1_020_000_000]
    assert stream.xyz.tolist() == [[1.5, 2.0, 3.0], [4.0, 5.0, 6.0]]
    # columns are found by name; non-integer and implausible stamps are malformed
    text = b"attr_x,attr_y,attr_z,attr_time\n1,2,3,1000\n4,5,6,1020\n1,2,3,1040.5\n7,8,9,1060\n1,2,3,999999999999\n"
    stream, problems = parse_realworld_csv(text, "f.csv")
    assert stream.t_ns.tolist() == [1_000_000_000, 1_020_000_000, 1_060_000_000]
    assert stream.xyz.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
    assert problems == [
        ("malformed_rows", "2 of 5 rows of f.csv skipped (truncated, non-numeric, non-finite or implausible time) at line 4, 6")
    ]
    # a file whose only problem is a truncated last row takes the same path as a clean one
    clean, _ = parse_realworld_csv(text[: text.index(b"1,2,3,1040.5")])
    cut, problems = parse_realworld_csv(text[: text.index(b"1,2,3,1040.5")] + b"9,9")
    assert problems[0][1].startswith("1 of 3 rows of <csv> skipped")
    assert np.array_equal(clean.t_ns, cut.t_ns) and np.array_equal(clean.xyz, cut.xyz)


# ---------------------------------------------------------------------------------------
# Cache


def _same(a, b) -> None:
    assert np.array_equal(a.windows.x, b.windows.x) and a.windows.x.dtype == b.windows.x.dtype == np.float32
    assert np.array_equal(a.windows.y, b.windows.y) and np.array_equal(a.windows.t_start_ns, b.windows.t_start_ns)
    assert np.array_equal(a.session_index, b.session_index)
    assert a.sessions == b.sessions and a.anomalies == b.anomalies and a.windows.labels == b.windows.labels


@pytest.mark.parametrize("zipped", [True, False])
def test_cache_hit_equals_fresh_load(tmp_path, zipped):
    archives = standard_archives()
    archives["acc_climbingup_csv.zip"] = multipart_archives("acc", "climbingup")
    archives["gyr_climbingup_csv.zip"] = multipart_archives("gyro", "climbingup")
    root = write_dataset(tmp_path / "data", {4: archives}, zipped)
    cache = tmp_path / "cache"
    first = load_realworld_subject(root, 4, CONFIG, cache_dir=cache)
    second = load_realworld_subject(root, 4, CONFIG, cache_dir=cache)
    fresh = load_realworld_subject(root, 4, CONFIG, use_cache=False)
    assert (first.from_cache, second.from_cache, fresh.from_cache) == (False, True, False)
    _same(first, second)
    _same(second, fresh)
    assert len(second.anomalies) == 2 and second.sessions[2] == "climbingup/chest/part1"
    assert np.array_equal(np.bincount(second.session_index), [n_windows(N)] * 2 + [2, 3, 1, 2, 3, 1] + [n_windows(N)] * 12)
    files = sorted(p.name for p in cache.iterdir())
    assert len(files) == 1 and files[0].startswith("realworld-proband4-") and files[0].endswith(".npz")
    with np.load(cache / files[0], allow_pickle=False) as npz:  # readable without pickle
        assert npz["x"].shape == (len(second.windows), 6, 128)


def test_cache_invalidated_by_settings_and_source(tmp_path):
    root = write_dataset(tmp_path / "data", {1: standard_archives()}, False)
    cache = tmp_path / "cache"
    assert not load_realworld_subject(root, 1, CONFIG, cache_dir=cache).from_cache
    assert load_realworld_subject(root, 1, CONFIG, cache_dir=cache).from_cache
    # a different setting is a different entry
    other = RealWorldConfig(positions=SMALL, max_gap_ns=50_000_000)
    assert not load_realworld_subject(root, 1, other, cache_dir=cache).from_cache
    assert load_realworld_subject(root, 1, other, cache_dir=cache).from_cache
    shin = RealWorldConfig(positions=("shin",))
    assert len(load_realworld_subject(root, 1, shin, cache_dir=cache).windows) == 16
    # touching a source file invalidates (same bytes, new modification time)
    src = root / "proband1" / "data" / "gyr_sitting_csv.zip"
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert not load_realworld_subject(root, 1, CONFIG, cache_dir=cache).from_cache
    assert load_realworld_subject(root, 1, CONFIG, cache_dir=cache).from_cache
    # files the loader does not read (magnetometer) do not matter
    (root / "proband1" / "data" / "mag_sitting_csv.zip").write_bytes(b"whatever")
    assert load_realworld_subject(root, 1, CONFIG, cache_dir=cache).from_cache
    # a changed CSV changes the windows, and the cache follows
    (root / "proband1" / "data" / "acc_sitting_csv.zip").write_bytes(zip_bytes(sensor_members("acc", "sitting", n=130)))
    changed = load_realworld_subject(root, 1, CONFIG, cache_dir=cache)
    assert not changed.from_cache and len(changed.windows) == 32 - 2  # sitting: 1 window per position instead of 2
    assert not any(p.name.endswith(".tmp") for p in cache.iterdir())


def test_cache_follows_zip_member_content(tmp_path):
    archives = standard_archives()
    root = write_dataset(tmp_path / "v1", {1: archives}, True)
    cache = tmp_path / "cache"
    v1 = load_realworld_subject(root, 1, CONFIG, cache_dir=cache)
    archives["acc_walking_csv.zip"] = zip_bytes(sensor_members("acc", "walking", positions=("chest",)))
    root.unlink()
    root = write_dataset(tmp_path / "v1", {1: archives}, True)
    v2 = load_realworld_subject(root, 1, CONFIG, cache_dir=cache)
    assert not v2.from_cache and len(v2.windows) == len(v1.windows) - 2
    assert [(a.kind, a.where) for a in v2.anomalies] == [("missing_sensor", "proband1/walking/shin")]


def test_broken_or_unwritable_cache_is_not_fatal(tmp_path, caplog):
    root = write_dataset(tmp_path / "data", {1: standard_archives()}, True)
    cache = tmp_path / "cache"
    first = load_realworld_subject(root, 1, CONFIG, cache_dir=cache)
    (entry,) = cache.iterdir()
    entry.write_bytes(entry.read_bytes()[:100])
    with caplog.at_level(logging.WARNING):
        again = load_realworld_subject(root, 1, CONFIG, cache_dir=cache)
    assert not again.from_cache and "is unreadable" in caplog.text
    _same(first, again)
    assert load_realworld_subject(root, 1, CONFIG, cache_dir=cache).from_cache
    blocker = tmp_path / "a_file"
    blocker.write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        nowhere = load_realworld_subject(root, 1, CONFIG, cache_dir=blocker / "cache")
    assert len(nowhere.windows) == 32 and "could not write cache" in caplog.text


def test_sensor_archives_unpacked_into_folders(tmp_path):
    """Users often unzip the per-sensor archives too (``acc_walking_csv/acc_walking_shin.csv``)."""
    archives = standard_archives()
    archives["acc_climbingup_csv.zip"] = multipart_archives("acc", "climbingup")
    archives["gyr_climbingup_csv.zip"] = multipart_archives("gyro", "climbingup")
    zipped = read_realworld_subject(write_dataset(tmp_path / "z", {7: archives}, True), 7, CONFIG)
    root = write_dataset(tmp_path / "d", {7: archives}, False)
    data = root / "proband7" / "data"
    for name in ("acc_walking_csv.zip", "gyr_walking_csv.zip", "acc_climbingup_csv.zip"):
        with zipfile.ZipFile(data / name) as zf:
            zf.extractall(data / name.removesuffix(".zip"))
        (data / name).unlink()
    unpacked = read_realworld_subject(root, 7, CONFIG)
    assert sessions(unpacked) == sessions(zipped)
    assert kinds(unpacked.anomalies) == [
        ("multipart", "proband7/climbingup", "proband7/data/acc_climbingup_csv"),
        ("multipart", "proband7/climbingup", "proband7/data/gyr_climbingup_csv.zip"),
    ]
    a, b = realworld_subject_windows(zipped, CONFIG), realworld_subject_windows(unpacked, CONFIG)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.t_start_ns, b.t_start_ns)
    cache = tmp_path / "cache"
    assert not load_realworld_subject(root, 7, CONFIG, cache_dir=cache).from_cache
    os.utime(data / "acc_walking_csv" / "acc_walking_chest.csv", ns=(1, 1))
    assert not load_realworld_subject(root, 7, CONFIG, cache_dir=cache).from_cache
    assert load_realworld_subject(root, 7, CONFIG, cache_dir=cache).from_cache
