"""The pure core both programs import: formats and math, no network, no command line, no UI.

* :mod:`har_models.wire`: what crosses MQTT (topics, control messages, the model codec,
  chunked transfers, upload encodings, a numpy safetensors reader);
* :mod:`har_models.data`: sensor data to labelled windows (recordings, the 50 Hz resampler,
  the windower and pipeline, label sets, splits, dataset subjects, HAPT and REALWORLD readers,
  the per-subject cache);
* :mod:`har_models.nn`: the HAR CNN (architecture as data, the model, FedDist growth), its
  PyTorch training, metrics from confusion matrices, and ExecuTorch export;
* :mod:`har_models.settings` (typed settings shared by both programs) and
  :mod:`har_models.files` (the one crash-safe file writer).
"""
