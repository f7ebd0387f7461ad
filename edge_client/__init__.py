"""The device program: sensors to labelled windows, local training, the MQTT agent, the app.

* :mod:`edge_client.sensors`: Android, MPU-6050 and replayed sensors behind one interface,
  and :mod:`edge_client.sensors.factory` that names them;
* :mod:`~edge_client.recorder`, :mod:`~edge_client.window_log`, :mod:`~edge_client.store`:
  labelled windows and the client's state folder;
* :mod:`~edge_client.sources`: where a client's training windows come from;
* the client round: :mod:`~edge_client.trainer` over :mod:`edge_client.backends`
  (PyTorch, numpy reference, ExecuTorch), with FedALA in :mod:`~edge_client.ala`, and
  :mod:`~edge_client.pte_fetch` (the ExecuTorch ``.pte`` files asked of the coordinator);
* :mod:`~edge_client.agent` (follows the federation over MQTT) and :mod:`~edge_client.cli`
  (``fedhar-client``, ``fedhar-record`` in :mod:`~edge_client.record_cli`);
* :mod:`~edge_client.cert_enrol`: the device's side of enrolment by certificate
  (``fedhar-client request-certificate``);
* :mod:`edge_client.app`: the Kivy app.
"""
