"""The HAR CNN and what is computed with it.

* :mod:`~har_models.nn.arch`: the architecture as data (widths, version), no PyTorch needed;
* :mod:`~har_models.nn.model`: the FedDist paper's CNN in PyTorch;
* :mod:`~har_models.nn.growth`: padding to a grown architecture and FedDist unit appending;
* :mod:`~har_models.nn.training`: local epochs and evaluation (PyTorch);
* :mod:`~har_models.nn.metrics`: accuracy and macro-F1 from confusion matrices;
* :mod:`~har_models.nn.export`: ExecuTorch training and inference programs per architecture version.
"""
