"""The research harness: starts the two programs, never imported by them.

* :mod:`~simulation.simulate`: ``fedhar-simulate``, the main job (a broker, a coordinator and N clients);
* :mod:`~simulation.fleet` and :mod:`~simulation.worker`: the engines (one process per client,
  virtual clients in workers, Ray actors) and the worker that hosts virtual clients;
* :mod:`~simulation.broker`: the embedded amqtt broker and the loopback Mosquitto;
* :mod:`~simulation.study`, :mod:`~simulation.study_cells` and :mod:`~simulation.study_report`:
  the strategy grid (running, resuming), its cells and shared settings, and its report
  (tables over seeds, figures);
* :mod:`~simulation.probe`, :mod:`~simulation.baselines`, :mod:`~simulation.compare`: the
  in-process tuning probe, centralised and local-only baselines, and the comparison table;
* :mod:`~simulation.stability`: the server-step stability table (final, worst round, falls
  from the best round) from probe curves.
* :mod:`~simulation.step_candidates`: the probe with candidate server steps for federations
  of fewer than 15 clients (tuning only; none is the coordinator's default).
"""
