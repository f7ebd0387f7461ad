"""Helpers the tests share (not tests themselves): import them as ``from support.<module> import ...``.

* :mod:`support.inmemory_grid`: the federation runner's grid without a broker.
* :mod:`support.hapt_devices`: HAPT devices that train with the client's own code, for that grid.
* :mod:`support.server_step_support`: tensors, updates and a federation for the server-step tests.
* :mod:`support.mpu6050_emulator`: an emulated MPU-6050 on an I2C bus (register map, FIFO).
* :mod:`support.ala_golden`: FedALA's golden figures (``python tests/support/ala_golden.py`` rewrites them).
* :mod:`support.mqtt_peer`, :mod:`support.mqtt_watcher`: an MQTT client a test drives, and one that records a federation's topics.
* :mod:`support.android_standin`, :mod:`support.java_executorch_standin`: pyjnius's Android sensors and
  ExecuTorch's Java classes, without a device.
* :mod:`support.realworld_synth`: a synthetic REALWORLD archive.

* :mod:`support.small_federation`: the small federation's command lines and runner (``conftest.py``'s ``small_simulation``).
* :mod:`support.secured_broker`: a Mosquitto with TLS, ACL and one account per client.

The app drivers (``app_driver.py``, ``app_enrol_driver.py``) stay at ``tests/``: they are programs,
run by path in a subprocess under Xvfb, not imported.
"""
