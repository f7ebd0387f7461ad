"""Time columns in the wrong unit: converted when the unit is certain, rejected with its name otherwise, never overflowing."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from test_realworld import CONFIG, csv_bytes, csv_lines, sensor_members, standard_archives, start_ms, write_dataset, zip_bytes

from har_models.data.realworld import (
    guess_time_unit,
    parse_realworld_csv,
    read_realworld_subject,
    realworld_subject_windows,
    recording_from_csv_files,
)

T0_MS = 1_435_993_159_412  # Unix epoch ms of the committed sample's first acc row (2015-07-04)
MS = np.int64(1_000_000)


def stamps_ms(n: int = 400, period_ms: int = 20) -> np.ndarray:
    return T0_MS + period_ms * np.arange(n, dtype=np.int64)


def csv_text(t_fields: list[str], xyz: np.ndarray | None = None) -> bytes:
    xyz = np.tile([1.0, 9.81, 0.5], (len(t_fields), 1)) if xyz is None else xyz
    rows = ["id,attr_time,attr_x,attr_y,attr_z"]
    rows += [f"{i + 1},{t},{x!r},{y!r},{z!r}" for i, (t, (x, y, z)) in enumerate(zip(t_fields, xyz.tolist(), strict=True))]
    return ("\n".join(rows) + "\n").encode()


@pytest.mark.parametrize(
    ("t", "unit", "by_spacing", "by_epoch"),
    [
        (stamps_ms().astype(float), "ms", "ms", "ms"),
        ((stamps_ms() - T0_MS + 1000).astype(float), "ms", "ms", None),  # a clock that does not count from 1970
        (stamps_ms() / 1000.0, "s", "s", "s"),
        ((stamps_ms() * 1000).astype(float), "us", "us", "us"),
        ((stamps_ms() * 1_000_000).astype(float), "ns", "ns", "ns"),
        ((stamps_ms() // 1000).astype(float), None, None, "s"),  # whole seconds
        (np.arange(400) * 2e7 + 3.6e12, None, "ns", "ms"),  # 1 h of nanoseconds since boot reads as a 2084 epoch in ms
        ((T0_MS + 500 * np.arange(400)).astype(float), None, None, "ms"),  # 2 Hz in ms, 2 kHz in us: no plausible rate
    ],
)
def test_guess_time_unit_known_answers(t, unit, by_spacing, by_epoch):
    g = guess_time_unit(t)
    assert (g.unit, g.by_spacing, g.by_epoch) == (unit, by_spacing, by_epoch)
    assert (g.reason == "") == (unit is not None)
    if by_spacing is not None:
        assert g.rate_hz == pytest.approx(50.0)


def test_milliseconds_read_as_before():
    stream, problems = parse_realworld_csv(csv_text([str(t) for t in stamps_ms()]), "acc_walking_shin.csv")
    assert problems == []
    assert np.array_equal(stream.t_ns, stamps_ms() * MS)


@pytest.mark.parametrize(
    ("fields", "unit_name"),
    [
        ([f"{t / 1000:.3f}" for t in stamps_ms()], "seconds"),
        ([str(t * 1000) for t in stamps_ms()], "microseconds"),
        ([str(t * 1_000_000) for t in stamps_ms()], "nanoseconds"),
    ],
)
def test_other_units_are_converted_to_the_same_nanoseconds(fields, unit_name):
    stream, problems = parse_realworld_csv(csv_text(fields), "acc_walking_shin.csv")
    assert np.array_equal(stream.t_ns, stamps_ms() * MS)  # 1_435_993_159_412_000_000 ns first, exactly
    assert stream.t_ns[0] == 1_435_993_159_412_000_000
    assert problems == [
        (
            "time_unit",
            f"attr_time of acc_walking_shin.csv is in {unit_name} (50 Hz by its spacing, Unix epoch time by its magnitude), "
            "not milliseconds; converted to ns",
        )
    ]


def test_nanoseconds_beyond_float_precision_stay_exact():
    # 1.4e18 is beyond 2^53: as float64 these stamps would be rounded to multiples of 256 ns
    t = stamps_ms() * MS + np.arange(400, dtype=np.int64) % 7 * 37
    stream, _ = parse_realworld_csv(csv_text([str(v) for v in t]))
    assert np.array_equal(stream.t_ns, t)
    assert not np.array_equal(t.astype(np.float64).astype(np.int64), t)  # the trap the parser avoids


def test_whole_seconds_are_rejected_naming_the_file_and_the_unit():
    # 400 rows from 159.412 s to 167.392 s past the minute: 9 distinct seconds, 400 / 9 = 44 rows each
    stream, problems = parse_realworld_csv(csv_text([str(t // 1000) for t in stamps_ms()]), "acc_walking_shin.csv")
    assert len(stream) == 0
    assert problems == [
        (
            "bad_time_unit",
            "attr_time of acc_walking_shin.csv: stamps repeat (44 rows per distinct value, 1 apart), coarser than the sampling: "
            "this looks like whole seconds, and the sub-second timing the 50 Hz grid needs is lost; "
            "file skipped (expected Unix epoch milliseconds)",
        )
    ]


def test_uncertain_and_overflowing_stamps_are_rejected():
    boot_ns = [str(int(3.6e12) + 20_000_000 * i) for i in range(400)]
    stream, problems = parse_realworld_csv(csv_text(boot_ns), "g.csv")
    assert len(stream) == 0 and problems[0][0] == "bad_time_unit"
    assert problems[0][1] == (
        "attr_time of g.csv: the values look like Unix epoch milliseconds but their spacing like nanoseconds at 50 Hz; "
        "the unit is uncertain (suspected nanoseconds); file skipped (expected Unix epoch milliseconds)"
    )
    # 20 ms apart but 10^13 ms (year 2286) and more: as ns beyond int64, refused rather than wrapped around
    far = [str(10**13 + 20 * i) for i in range(400)]
    stream, problems = parse_realworld_csv(csv_text(far), "f.csv")
    assert len(stream) == 0
    assert problems == [
        (
            "bad_time_unit",
            "attr_time of f.csv: the largest stamp 1e+13 milliseconds is 1e+19 ns, beyond int64 (9.22e18 ns); "
            "file skipped (expected Unix epoch milliseconds)",
        )
    ]


def test_loose_csv_files_in_whole_seconds_raise_with_the_file(tmp_path):
    acc, gyro = tmp_path / "acc_walking_shin.csv", tmp_path / "Gyroscope_walking_shin.csv"
    acc.write_bytes(csv_text([str(t // 1000) for t in stamps_ms()]))
    gyro.write_bytes(csv_text([str(t) for t in stamps_ms()]))
    with pytest.raises(ValueError, match=r"attr_time of acc_walking_shin\.csv: .*whole seconds"):
        recording_from_csv_files(acc, gyro, 1, "walking", "shin")


def test_archive_with_microseconds_and_whole_seconds(tmp_path, caplog):
    archives = standard_archives()
    # walking: both sensors re-exported in microseconds; running/chest acc in whole seconds
    for sensor, st in (("acc", "acc"), ("gyro", "gyr")):
        members = sensor_members(sensor, "walking")
        for name in list(members):
            if name.endswith(".csv"):
                pos = name.rsplit("_", 1)[1].removesuffix(".csv")
                t = start_ms("walking", pos) + 20 * np.arange(200, dtype=np.int64)
                lines = csv_lines(sensor, t)
                members[name] = (
                    "id,attr_time,attr_x,attr_y,attr_z\n"
                    + "\n".join(",".join([f[0], str(int(f[1]) * 1000), *f[2:]]) for f in (line.split(",") for line in lines))
                    + "\n"
                ).encode()
        archives[f"{st}_walking_csv.zip"] = zip_bytes(members)
    running = sensor_members("acc", "running")
    t = start_ms("running", "chest") + 20 * np.arange(200, dtype=np.int64)
    running["acc_running_chest.csv"] = csv_bytes("acc", t // 1000)  # whole seconds
    archives["acc_running_csv.zip"] = zip_bytes(running)
    clean = realworld_subject_windows(
        read_realworld_subject(write_dataset(tmp_path / "c", {1: standard_archives()}, True), 1, CONFIG), CONFIG
    )
    with caplog.at_level(logging.INFO, logger="har_models.data.realworld"):
        subject = read_realworld_subject(write_dataset(tmp_path / "u", {1: archives}, True), 1, CONFIG)
    data = "proband1/data/"
    assert [(a.kind, a.where, a.file) for a in subject.anomalies] == [
        ("bad_time_unit", "proband1/running/chest", data + "acc_running_csv.zip!acc_running_chest.csv"),
        ("time_unit", "proband1/walking/chest", data + "acc_walking_csv.zip!acc_walking_chest.csv"),
        ("time_unit", "proband1/walking/chest", data + "gyr_walking_csv.zip!Gyroscope_walking_chest.csv"),
        ("time_unit", "proband1/walking/shin", data + "acc_walking_csv.zip!acc_walking_shin.csv"),
        ("time_unit", "proband1/walking/shin", data + "gyr_walking_csv.zip!Gyroscope_walking_shin.csv"),
    ]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "whole seconds" in warned[0].getMessage() and "acc_running_chest.csv" in warned[0].getMessage()
    assert "running/chest" not in [r.session for r in subject.recordings]
    ws = realworld_subject_windows(subject, CONFIG)
    # walking in microseconds gives the same windows as walking in milliseconds, bit for bit
    walking = 7
    assert np.array_equal(ws.x[ws.y == walking], clean.x[clean.y == walking])
    assert np.array_equal(ws.t_start_ns[ws.y == walking], clean.t_start_ns[clean.y == walking])
    assert len(ws) == len(clean) - 2  # running/chest (2 windows) skipped
