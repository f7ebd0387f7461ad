"""Sensor data to labelled windows: one pipeline for live sensors, replays and dataset readers.

* :mod:`~har_models.data.recording`: raw two-stream recordings (acc m/s^2, gyro rad/s, stamps);
* :mod:`~har_models.data.resample`: streaming resampling onto an exact 50 Hz grid, low-passed by
  :mod:`~har_models.data.anti_alias` (filter design, shipped taps, FIR), with the clock rules of
  :mod:`~har_models.data.clock` (outliers, forward steps, backward steps re-based as segments);
* :mod:`~har_models.data.windowing` and :mod:`~har_models.data.pipeline`: float32 ``(N, 6, 128)``
  windows, step 64, and the stream-to-windows pipeline;
* :mod:`~har_models.data.labels`: label sets naming the int64 classes;
* :mod:`~har_models.data.splits`: per-client train/test splits (leak-free blocks, the paper's);
* :mod:`~har_models.data.subjects`, :mod:`~har_models.data.hapt`, :mod:`~har_models.data.realworld`:
  dataset subjects as clients, and their readers;
* :mod:`~har_models.data.dataset_cache`: prepared per-subject arrays cached on disk.
"""
