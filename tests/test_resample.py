"""Streaming resampler: known answers, the rules for late, duplicated and gapped samples, and
the claim that any chunking of the input gives bit-identical output."""

from __future__ import annotations

import time

import numpy as np
import pytest

from har_models.data.labels import REALWORLD_LABELS
from har_models.data.pipeline import SensorPipeline, windows_from_recording
from har_models.data.recording import LabelTrack, Recording, SensorStream
from har_models.data.resample import Resampler, ResampleStats

MS = 1_000_000
P = 20 * MS


def run_all(acc_t, acc_v, gyr_t, gyr_v, **kw):
    r = Resampler(**kw)
    out = [r.push("acc", acc_t, acc_v), r.push("gyro", gyr_t, gyr_v), r.close()]
    return np.concatenate([o[0] for o in out]), np.concatenate([o[1] for o in out]), r.stats


def ramp(t_ns, scale=1.0):
    """Values linear in time: interpolation reproduces them exactly (up to rounding)."""
    s = np.asarray(t_ns, np.float64) / 1e9
    return np.stack([scale * s, 2 * scale * s, -scale * s], axis=1)


# ---------------------------------------------------------------------------------------
# Known answers


def test_exact_50hz_input_passes_through_unchanged():
    t = 1_000 * P + P * np.arange(300)
    acc, gyr = np.random.default_rng(0).normal(size=(2, 300, 3))
    gt, gv, stats = run_all(t, acc, t, gyr)
    assert np.array_equal(gt, t)
    assert np.array_equal(gv, np.hstack([acc, gyr]))
    assert stats == ResampleStats(accepted=600, grid_points=300)


def test_linear_interpolation_by_hand():
    # acc at 0, 30, 50 ms with x = 0, 3, 5; gyro at 10, 45 ms with x = 1, 8
    acc_t = np.array([0, 30, 50]) * MS
    acc_v = np.array([[0.0, 0, 0], [3, 0, 0], [5, 0, 0]])
    gyr_t = np.array([10, 45]) * MS
    gyr_v = np.array([[1.0, 0, 0], [8, 0, 0]])
    t, v, _ = run_all(acc_t, acc_v, gyr_t, gyr_v)
    assert t.tolist() == [20 * MS, 40 * MS]  # multiples of 20 ms covered by both (10..45 ms)
    assert v[:, 0].tolist() == [2.0, 4.0]  # acc: 0 + 3 * 20/30; 3 + 2 * 10/20
    assert v[:, 3].tolist() == [3.0, 7.0]  # gyro: 1 + 7 * 10/35; 1 + 7 * 30/35


def test_grid_is_absolute_not_relative_to_the_first_sample():
    t = 7 * MS + P * np.arange(100)
    gt, _, _ = run_all(t, ramp(t), t, ramp(t))
    assert gt[0] == 20 * MS and np.all(gt % P == 0) and np.all(np.diff(gt) == P)
    assert gt[-1] == 1980 * MS  # last multiple of 20 ms before the last sample at 1987 ms


def test_duplicates_first_arrival_wins():
    t = P * np.arange(10)
    acc = ramp(t)
    acc_t = np.insert(t, 5, t[4])  # a second sample stamped 80 ms, arriving later
    acc_v = np.insert(acc, 5, [99.0, 99.0, 99.0], axis=0)
    gt, gv, stats = run_all(acc_t, acc_v, t, ramp(t))
    assert np.array_equal(gt, t) and np.array_equal(gv[:, :3], acc)
    assert stats.duplicates_dropped == 1 and stats.accepted == 20


def test_out_of_order_within_horizon_is_sorted_and_beyond_is_dropped():
    t = P * np.arange(50)
    acc_t = t.copy()
    acc_t[[10, 11]] = acc_t[[11, 10]]  # 20 ms out of order: re-sorted
    acc_v = ramp(acc_t)
    acc_t = np.insert(acc_t, 30, t[29] - 250 * MS)  # 250 ms behind the newest: late
    acc_v = np.insert(acc_v, 30, [-9.0, -9.0, -9.0], axis=0)
    gt, gv, stats = run_all(acc_t, acc_v, t, ramp(t))
    assert np.array_equal(gt, t) and np.allclose(gv[:, :3], ramp(t), rtol=0, atol=1e-12)
    assert stats.late_dropped == 1 and stats.duplicates_dropped == 0


def test_gaps_are_skipped_not_interpolated():
    t = P * np.arange(20)
    acc_t = np.r_[t[:8], t[8:] + 80 * MS]  # acc jumps by 100 ms (allowed) between 140 and 240 ms
    gyr_t = np.r_[t[:14], t[14:] + 120 * MS]  # gyro jumps by 140 ms (a gap) between 260 and 400 ms
    gt, _, stats = run_all(acc_t, ramp(acc_t), gyr_t, ramp(gyr_t))
    inside = (gt > 260 * MS) & (gt < 400 * MS)
    assert not inside.any()
    assert gt.tolist() == [k * P for k in range(14)] + [k * P for k in range(20, 24)]  # acc ends at 460 ms
    assert stats.gap_points_skipped == 6  # 280, 300, ..., 380 ms


def test_a_gap_of_days_costs_nothing():
    t = P * np.arange(100)
    far = t + 10 * 86_400 * 10**9  # the phone clock jumps by 10 days
    both = np.r_[t, far]
    start = time.perf_counter()
    gt, _, stats = run_all(both, ramp(both), both, ramp(both))
    assert time.perf_counter() - start < 1.0
    assert np.array_equal(gt, both)
    assert stats.gap_points_skipped == 10 * 86_400 * 50 - 100


def test_non_finite_samples_are_missing():
    t = P * np.arange(10)
    acc = ramp(t)
    acc[3] = np.nan
    gt, gv, stats = run_all(t, acc, t, ramp(t))
    assert np.array_equal(gt, t) and np.all(np.isfinite(gv))
    assert gv[3, 0] == pytest.approx((acc[2, 0] + acc[4, 0]) / 2)
    assert stats.nonfinite_dropped == 1


def test_input_validation():
    r = Resampler()
    with pytest.raises(ValueError, match="unknown sensor 'mag'"):
        r.push("mag", [0], [[0, 0, 0]])
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        r.push("acc", [0, 1], [[0, 0, 0]])
    with pytest.raises(ValueError, match="integer nanoseconds"):
        r.push("acc", np.array([0.5, 1.0]), np.zeros((2, 3)))
    r.push("acc", np.array([0.0, 20e6]), np.zeros((2, 3)))  # whole-number floats are fine
    r.close()
    with pytest.raises(ValueError, match=r"push\(\) after close\(\)"):
        r.push("acc", [0], [[0, 0, 0]])
    with pytest.raises(ValueError, match="must be > 0"):
        Resampler(period_ns=0)


# ---------------------------------------------------------------------------------------
# Streaming equals offline, bit for bit


def messy_stream(rng, n, start_ns):
    """Irregular stamps as phones produce them: jitter, 1 ms bursts, gaps, reordering, repeats, NaN."""
    steps = [1, 9, 10, 15, 19, 20, 21, 25, 40, 150, 700]
    weights = [0.03, 0.05, 0.1, 0.05, 0.1, 0.45, 0.1, 0.05, 0.05, 0.018, 0.002]
    dt = rng.choice(steps, size=n, p=weights).astype(np.int64) * MS
    t = start_ns + np.cumsum(dt) + rng.integers(-2, 3, size=n) * MS
    for i in rng.integers(1, n, size=6):  # out of order: some within the 200 ms horizon, some beyond
        t[i] = t[i - 1] - int(rng.choice([5, 30, 150, 199, 200, 260, 900])) * MS
    for i in rng.integers(1, n, size=6):  # exact repeats of the previous stamp
        t[i] = t[i - 1]
    v = rng.normal(size=(n, 3))
    v[rng.integers(0, n, size=2)] = np.nan
    return t, v


def arrival_order(acc_t, gyr_t, rng=None):
    """Interleave the two streams (each keeps its own order): by arrival, or at random."""
    tags = np.r_[np.zeros(acc_t.size, int), np.ones(gyr_t.size, int)]
    if rng is None:
        key = np.r_[np.maximum.accumulate(acc_t), np.maximum.accumulate(gyr_t)]
        return tags[np.argsort(key, kind="stable")]
    return rng.permutation(tags)


def stream_in_chunks(acc, gyr, order, chunk_sizes, pipeline=None, **kw):
    """Feed events in the given sensor order, ``chunk_sizes`` consecutive same-sensor events per push at most."""
    r = pipeline if pipeline is not None else Resampler(**kw)
    pos = [0, 0]
    outs = []
    i = 0
    k = 0
    while i < order.size:
        s = order[i]
        size = int(chunk_sizes[k % len(chunk_sizes)])
        k += 1
        j = i
        while j < order.size and order[j] == s and j - i < size:
            j += 1
        t, v = (acc, gyr)[s]
        a, b = pos[s], pos[s] + (j - i)
        outs.append(r.push(("acc", "gyro")[s], t[a:b], v[a:b]))
        pos[s] = b
        i = j
    outs.append(r.close())
    return outs, r


@pytest.mark.parametrize("seed", range(4))
def test_any_chunking_gives_bit_identical_grid(seed):
    rng = np.random.default_rng(seed)
    acc = messy_stream(rng, 500, 10**18)
    gyr = messy_stream(rng, 600, 10**18 + 3 * MS)
    ref_t, ref_v, ref_stats = run_all(*acc, *gyr)
    assert ref_t.size > 200 and ref_stats.late_dropped > 0 and ref_stats.duplicates_dropped > 0
    assert ref_stats.gap_points_skipped > 0 and ref_stats.nonfinite_dropped > 0
    by_arrival = arrival_order(acc[0], gyr[0])
    cases = {
        "one by one": (by_arrival, [1]),
        "random chunks": (by_arrival, rng.integers(1, 40, size=50)),
        "random interleaving, random chunks": (arrival_order(acc[0], gyr[0], rng), rng.integers(1, 15, size=50)),
        "one sensor after the other, one by one": (np.r_[np.zeros(500, int), np.ones(600, int)], [1]),
    }
    for name, (order, sizes) in cases.items():
        outs, r = stream_in_chunks(acc, gyr, order, sizes)
        t = np.concatenate([o[0] for o in outs])
        v = np.concatenate([o[1] for o in outs])
        assert np.array_equal(t, ref_t), name
        assert np.array_equal(v, ref_v), name  # bit-identical, not merely close
        assert r.stats == ref_stats, name


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_any_chunking_gives_bit_identical_windows(seed):
    rng = np.random.default_rng(100 + seed)
    acc = messy_stream(rng, 1500, 10**18)
    gyr = messy_stream(rng, 1500, 10**18 + 1 * MS)
    # the activity changes twice; windows never straddle a change
    track = LabelTrack(np.array([0, 10**18 + 12 * 10**9, 10**18 + 18 * 10**9]), np.array([7, -1, 4]))
    rec = Recording("s", "messy", SensorStream(*acc), SensorStream(*gyr), track)
    ref = windows_from_recording(rec, REALWORLD_LABELS, max_gap_ns=200 * MS)
    assert len(ref) >= 5 and set(ref.y.tolist()) == {4, 7}
    by_arrival = arrival_order(acc[0], gyr[0])
    for order, sizes in [(by_arrival, [1]), (by_arrival, rng.integers(1, 60, size=40)), (by_arrival, [10**6])]:
        pipe = SensorPipeline(REALWORLD_LABELS, track, max_gap_ns=200 * MS)
        outs, _ = stream_in_chunks(acc, gyr, order, sizes, pipeline=pipe)
        x = np.concatenate([o.x for o in outs])
        y = np.concatenate([o.y for o in outs])
        t0 = np.concatenate([o.t_start_ns for o in outs])
        assert np.array_equal(x, ref.x) and np.array_equal(y, ref.y) and np.array_equal(t0, ref.t_start_ns)


# ---------------------------------------------------------------------------------------
# Anti-aliasing of streams faster than the grid


def test_anti_alias_factor_known_answers():
    from har_models.data.anti_alias import anti_alias_factor

    ms = 1e6
    assert anti_alias_factor(20 * ms) == 1  # 50 Hz: passed through
    assert anti_alias_factor(16 * ms) == 1  # 62.5 Hz: within ANTI_ALIAS_RATIO
    assert anti_alias_factor(15 * ms) == 2  # 66.7 Hz
    assert anti_alias_factor(10 * ms) == 2  # 100 Hz
    assert anti_alias_factor(10.3 * ms) == 2  # 97 Hz (jitter)
    assert anti_alias_factor(20 / 3 * ms) == 4  # 150 Hz: 3 does not divide 20 ms, 4 does
    assert anti_alias_factor(5 * ms) == 4  # 200 Hz
    assert anti_alias_factor(2.5 * ms) == 8  # 400 Hz
    assert anti_alias_factor(0.1 * ms) == 32  # 10 kHz: capped at MAX_OVERSAMPLING
    assert anti_alias_factor(0.0) == 1


@pytest.mark.slow
def test_filter_response_by_scipy_freqz():
    from scipy import signal

    from har_models.data.anti_alias import anti_alias_taps

    for factor, n in ((2, 25), (4, 47)):
        b = anti_alias_taps(P, factor)
        assert b.size == n and np.allclose(b, b[::-1], rtol=0, atol=0)  # symmetric: linear phase
        assert abs(b.sum() - 1.0) < 1e-12  # DC gain 1
        _, h = signal.freqz(b, worN=[5.0, 14.0, 30.0, 40.0, 45.0], fs=50.0 * factor)
        db = 20 * np.log10(np.abs(h))
        assert np.all(np.abs(db[:2]) < 0.1)  # pass band
        assert np.all(db[2:] < -60.0)  # everything that would alias below 20 Hz


def _tone(freq_hz, rate_hz, seconds=10.0, start_ns=10**18):
    t = start_ns + np.round(np.arange(int(seconds * rate_hz)) * 1e9 / rate_hz).astype(np.int64)
    s = (t - start_ns) / 1e9
    return t, np.stack([np.sin(2 * np.pi * freq_hz * s), np.zeros_like(s), np.ones_like(s)], axis=1)


def test_40hz_at_100hz_does_not_alias_to_10hz():
    t, v = _tone(40.0, 100.0)
    # independent reference: plain decimation (every other sample) aliases the tone to 10 Hz at full amplitude
    naive = v[::2, 0]
    assert np.sqrt(np.mean(naive**2)) == pytest.approx(0.70, abs=0.02)
    gt, gv, _ = run_all(t, v, t, v)
    assert np.array_equal(gt, t[::2])  # the grid is unchanged: every 20 ms over the common span
    rms = np.sqrt(np.mean(gv[:, 0] ** 2))
    assert rms < 0.1
    assert rms < 0.01  # 60 dB stop band; the rest is the two ends of the recording
    assert np.abs(gv[10:-10, 0]).max() < 1e-3  # away from the ends: -60 dB
    assert np.abs(gv[:, 2] - 1.0).max() < 1e-12  # a constant passes (DC gain 1, up to rounding)


def test_slow_motion_passes_with_its_timing():
    """A 1 Hz and a 5 Hz movement sampled at 200 Hz equal the same movement sampled at 50 Hz."""
    for freq in (1.0, 5.0):
        fast_t, fast_v = _tone(freq, 200.0)
        slow_t, slow_v = _tone(freq, 50.0)
        r = Resampler()
        out = [r.push("acc", fast_t, fast_v), r.push("gyro", slow_t, slow_v), r.close()]
        assert r.factors == {"acc": 4, "gyro": 1}
        gt = np.concatenate([o[0] for o in out])
        gv = np.concatenate([o[1] for o in out])
        assert np.array_equal(gt, slow_t)
        assert np.array_equal(gv[:, 3:], slow_v)  # the 50 Hz stream is untouched
        # the filtered stream keeps amplitude and phase (delay compensated): within 1 % of the 50 Hz samples
        inner = slice(10, -10)
        assert np.abs(gv[inner, 0] - slow_v[inner, 0]).max() < 0.01


def test_filtered_stream_keeps_gaps():
    t, v = _tone(3.0, 200.0, seconds=6.0)
    keep = (t - t[0] < 2 * 10**9) | (t - t[0] > 3 * 10**9)  # a 1 s gap from 2 s to 3 s
    t, v = t[keep], v[keep]
    slow_t, slow_v = _tone(3.0, 50.0, seconds=6.0)
    r = Resampler()
    out = [r.push("acc", t, v), r.push("gyro", slow_t, slow_v), r.close()]
    gt = np.concatenate([o[0] for o in out])
    inside = (gt > t[0] + 2 * 10**9) & (gt < t[0] + 3 * 10**9)
    assert not inside.any()
    assert gt.size == slow_t.size - 51  # grid points 2.00 .. 3.00 s lie between the samples at 1.995 and 3.005 s
    assert r.stats.gap_points_skipped == 51


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_any_chunking_gives_bit_identical_grid_with_anti_aliasing(seed):
    rng = np.random.default_rng(200 + seed)
    n = 2400
    # acc at ~200 Hz with jitter, bursts, repeats, reordering and gaps; gyro at ~50 Hz (messy)
    dt = rng.choice([1, 4, 5, 6, 10, 150, 400], size=n, p=[0.03, 0.2, 0.6, 0.12, 0.03, 0.015, 0.005]).astype(np.int64) * MS
    acc_t = 10**18 + np.cumsum(dt)
    for i in rng.integers(1, n, size=8):
        acc_t[i] = acc_t[i - 1] - int(rng.choice([0, 2, 30, 199, 260])) * MS
    acc = (acc_t, rng.normal(size=(n, 3)))
    gyr = messy_stream(rng, 700, 10**18 + 2 * MS)
    ref = Resampler()
    ref_out = [ref.push("acc", *acc), ref.push("gyro", *gyr), ref.close()]
    ref_t = np.concatenate([o[0] for o in ref_out])
    ref_v = np.concatenate([o[1] for o in ref_out])
    assert ref.factors == {"acc": 4, "gyro": 1}
    assert ref_t.size > 300 and ref.stats.gap_points_skipped > 0 and ref.stats.late_dropped > 0
    by_arrival = arrival_order(acc[0], gyr[0])
    for sizes in ([1], rng.integers(1, 40, size=50), [10**6]):
        outs, r = stream_in_chunks(acc, gyr, by_arrival, sizes)
        t = np.concatenate([o[0] for o in outs])
        v = np.concatenate([o[1] for o in outs])
        assert np.array_equal(t, ref_t) and np.array_equal(v, ref_v)  # bit for bit
        assert r.stats == ref.stats and r.factors == ref.factors


@pytest.mark.slow
@pytest.mark.parametrize("slow_first", [True, False])
def test_rate_decision_uses_the_first_spacings_whatever_the_chunking(slow_first):
    """A stream whose rate changes after its first second (a phone that starts near its 20 ms
    request, then bursts at 200 Hz, or the reverse) is judged on its first
    RATE_PROBE_INTERVALS spacings in every chunking. Judging on "every sample held when the
    probe fills" made one push of a whole recording see the 200 Hz part too (median 5 ms:
    filtered) while small pushes saw the first second only (median ~23 ms: not filtered)."""
    from har_models.data.anti_alias import anti_alias_factor
    from har_models.data.resample import RATE_PROBE_INTERVALS

    rng = np.random.default_rng(7)
    # the later part has the most samples, so a median over the whole stream sides with it
    if slow_first:  # 9 s at ~44 Hz (5-40 ms, median ~22.5 ms), then 7.5 s at 200 Hz
        dt_ms = np.r_[rng.uniform(5, 40, size=400), np.full(1500, 5.0)]
    else:  # 1 s at 200 Hz, then 22.5 s at ~44 Hz
        dt_ms = np.r_[np.full(200, 5.0), rng.uniform(5, 40, size=1000)]
    acc_t = 10**18 + np.round(np.cumsum(dt_ms) * MS).astype(np.int64)
    acc = (acc_t, np.sin(acc_t / 1e9)[:, None] * np.array([1.0, 2.0, -1.0]))
    gyr_t = 10**18 + np.arange(1, 1 + int(acc_t[-1] - 10**18) // P) * P
    gyr = (gyr_t, np.cos(gyr_t / 1e9)[:, None] * np.array([1.0, -1.0, 0.5]))

    # independent reference: the factor of the median of the first 50 spacings (the stream is clean and sorted)
    want = anti_alias_factor(float(np.median(np.diff(acc_t[: RATE_PROBE_INTERVALS + 1]))))
    assert want == (1 if slow_first else 4)
    whole_stream = anti_alias_factor(float(np.median(np.diff(acc_t))))
    assert whole_stream != want  # the stream really is one a whole-stream median would judge otherwise

    ref = Resampler()
    ref_out = [ref.push("acc", *acc), ref.push("gyro", *gyr), ref.close()]
    assert ref.factors == {"acc": want, "gyro": 1}
    ref_t = np.concatenate([o[0] for o in ref_out])
    ref_v = np.concatenate([o[1] for o in ref_out])
    assert ref_t.size > 800  # 16.5 or 23.5 s of 50 Hz grid
    by_arrival = arrival_order(acc[0], gyr[0])
    for sizes in ([1], rng.integers(1, 80, size=30), [RATE_PROBE_INTERVALS], [10**6]):
        outs, r = stream_in_chunks(acc, gyr, by_arrival, sizes)
        assert r.factors == ref.factors
        t = np.concatenate([o[0] for o in outs])
        v = np.concatenate([o[1] for o in outs])
        assert np.array_equal(t, ref_t) and np.array_equal(v, ref_v)  # bit for bit


# ---------------------------------------------------------------------------------------
# The filter without scipy: shipped taps and numpy filtering, bit for bit scipy's


def _scipy_taps(period_ns, factor):
    """The design as it was done with scipy.signal at run time (the reference)."""
    from scipy import signal

    f_out = 1e9 / period_ns
    fs = factor * f_out
    numtaps, beta = signal.kaiserord(60.0, 0.32 * f_out / (fs / 2))
    return signal.firwin(numtaps | 1, 0.44 * f_out, window=("kaiser", beta), fs=fs)


@pytest.mark.slow
def test_shipped_taps_are_scipys_design_bit_for_bit():
    from scipy import special

    from har_models.data import anti_alias_table
    from har_models.data.anti_alias import anti_alias_table_source, anti_alias_taps, design_anti_alias_taps

    factors = [m for m in range(2, 33) if P % m == 0]
    assert sorted(anti_alias_table.TAPS_20MS) == factors == [2, 4, 5, 8, 10, 16, 20, 25, 32]
    assert anti_alias_table.TAPS_PERIOD_NS == P
    for m in factors:
        want = _scipy_taps(P, m)
        assert np.array_equal(np.array(anti_alias_table.TAPS_20MS[m]), want), m
        assert np.array_equal(anti_alias_taps(P, m), want), m
    assert [len(anti_alias_table.TAPS_20MS[m]) for m in (2, 4)] == [25, 47]
    # other grids: the numpy design with scipy's I0 is scipy's design; numpy's I0 is within rounding
    for period in (10 * MS, 16 * MS, 40 * MS):
        for m in (2, 4, 8):
            want = _scipy_taps(period, m)
            assert np.array_equal(design_anti_alias_taps(period, m, special.i0), want), (period, m)
            np.testing.assert_allclose(design_anti_alias_taps(period, m, np.i0), want, rtol=0, atol=1e-15)
    # the data file is exactly what its generator writes today (no hand edits, no drift)
    from pathlib import Path

    assert Path(anti_alias_table.__file__).with_name("anti_alias_taps.json").read_text() == anti_alias_table_source()
    with pytest.raises(ValueError, match="factor >= 2"):
        design_anti_alias_taps(P, 1)


@pytest.mark.parametrize("n_taps", [25, 47, 365])
def test_numpy_fir_is_scipys_lfilter_bit_for_bit(n_taps):
    from scipy import signal

    from har_models.data.anti_alias import fir_filter, fir_steady_state

    rng = np.random.default_rng(n_taps)
    b = rng.normal(size=n_taps)
    b /= b.sum()
    a = np.zeros_like(b)
    a[0] = 1.0
    assert np.array_equal(fir_steady_state(b), signal.lfilter_zi(b, a))
    for n in (1, 3, n_taps - 2, n_taps, 700):
        x = rng.normal(size=(n, 3))
        z0 = rng.normal(size=(n_taps - 1, 3))
        want_y, want_z = signal.lfilter(b, a, x, axis=0, zi=z0)
        y, z = fir_filter(b, x, z0)
        assert np.array_equal(y, want_y) and np.array_equal(z, want_z), n
    with pytest.raises(ValueError, match="state of shape"):
        fir_filter(b, np.zeros((4, 3)), np.zeros((3, 3)))


RATES_HZ = (62.5, 100.0, 104.0, 200.0, 400.0)

_STREAMS_CODE = """
import numpy as np
from har_models.data.resample import Resampler

def streams(rate_hz, seed):
    rng = np.random.default_rng(seed)
    n = int(12 * rate_hz)
    jitter = rng.normal(0, 0.03, size=n) / rate_hz
    acc_t = 10**18 + np.round((np.arange(n) / rate_hz + jitter) * 1e9).astype(np.int64)
    acc_t[n // 2 :] += 400_000_000  # one gap of 0.4 s
    s = (acc_t - 10**18) / 1e9
    acc_v = np.stack([np.sin(2 * np.pi * 1.3 * s), np.sin(2 * np.pi * 0.4 * rate_hz * s), 9.81 + 0 * s], 1) + rng.normal(0, 0.1, (n, 3))
    gyr_t = 10**18 + 3_000_000 + np.arange(int(13 * 50)) * 20_000_000
    gyr_v = rng.normal(size=(gyr_t.size, 3))
    return (acc_t, acc_v), (gyr_t, gyr_v)

def run(rate_hz, seed, sizes):
    (acc_t, acc_v), (gyr_t, gyr_v) = streams(rate_hz, seed)
    r = Resampler()
    outs = [r.push("gyro", gyr_t, gyr_v)]
    i = k = 0
    while i < acc_t.size:
        j = min(acc_t.size, i + int(sizes[k % len(sizes)]))
        outs.append(r.push("acc", acc_t[i:j], acc_v[i:j]))
        i, k = j, k + 1
    outs.append(r.close())
    return np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs]), r.factors["acc"]
"""


@pytest.mark.slow
def test_fast_streams_without_scipy_equal_the_scipy_filter_bit_for_bit(tmp_path, monkeypatch):
    """62.5 .. 400 Hz input in a process where scipy cannot be imported, streamed in chunks and
    all at once, against the same streams filtered by scipy.signal (design and lfilter) here."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = "import sys\nsys.modules['scipy'] = None\n" + _STREAMS_CODE + textwrap.dedent(
        f"""
        out = {{}}
        for rate in {RATES_HZ!r}:
            t, v, f = run(rate, 3, [10**9])
            t1, v1, f1 = run(rate, 3, [1])
            t2, v2, f2 = run(rate, 3, [7, 1, 33, 2, 120])
            assert f == f1 == f2
            assert np.array_equal(t, t1) and np.array_equal(v, v1), rate  # streaming equals offline
            assert np.array_equal(t, t2) and np.array_equal(v, v2), rate
            out[f"t{{rate}}"], out[f"v{{rate}}"], out[f"f{{rate}}"] = t, v, np.array(f)
        np.savez({str(tmp_path / "noscipy.npz")!r}, **out)
        assert "scipy" in sys.modules and sys.modules["scipy"] is None
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    got = np.load(tmp_path / "noscipy.npz")

    from scipy import signal

    import har_models.data.anti_alias as rs

    def scipy_lfilter(taps, x, zi):
        a = np.zeros_like(taps)
        a[0] = 1.0
        return signal.lfilter(taps, a, x, axis=0, zi=zi)

    def scipy_zi(taps):
        a = np.zeros_like(taps)
        a[0] = 1.0
        return signal.lfilter_zi(taps, a)

    monkeypatch.setattr(rs, "fir_filter", scipy_lfilter)
    monkeypatch.setattr(rs, "fir_steady_state", scipy_zi)
    monkeypatch.setattr(rs, "anti_alias_taps", _scipy_taps)
    ns: dict = {}
    exec(_STREAMS_CODE, ns)
    seen = []
    for rate in RATES_HZ:
        t, v, f = ns["run"](rate, 3, [10**9])
        acc_t = ns["streams"](rate, 3)[0][0]
        assert f == rs.anti_alias_factor(float(np.median(np.diff(acc_t[:51])))) == int(got[f"f{rate}"]), rate
        seen.append(f)
        assert t.size > 500, rate
        assert np.array_equal(got[f"t{rate}"], t) and np.array_equal(got[f"v{rate}"], v), rate  # bit for bit
    assert seen[1:] == [2, 2, 4, 8]  # 62.5 Hz with jitter sits on the 1.25 threshold, either side
