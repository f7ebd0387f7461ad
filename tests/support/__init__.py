"""Helpers the tests share (not tests themselves): import them as ``from support.<module> import ...``.

* :mod:`support.inmemory_grid`: the federation runner's grid without a broker.
* :mod:`support.server_step_support`: tensors, updates and a federation for the server-step tests.
* :mod:`support.mpu6050_emulator`: an emulated MPU-6050 on an I2C bus (register map, FIFO).
* :mod:`support.ala_golden`: FedALA's golden figures (``python tests/support/ala_golden.py`` rewrites them).

The process and broker helpers (``small_federation``, ``secured_broker``, ``mqtt_peer``,
``mqtt_watcher``, the app drivers and stand-ins, ``realworld_synth``) still sit at ``tests/``.
"""
