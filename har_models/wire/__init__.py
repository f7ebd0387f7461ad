"""The wire format (DESIGN.md section 3): what a client and the coordinator exchange over MQTT.

* :mod:`~har_models.wire.topics`: topic names of a federation and the id rules;
* :mod:`~har_models.wire.messages`: JSON control messages (announcements, plans, status, receipts, round progress), validated;
* :mod:`~har_models.wire.pace`: pace steering, the check-in window a round announcement gives every device;
* :mod:`~har_models.wire.codec`: named tensors <-> safetensors bytes in a versioned envelope;
* :mod:`~har_models.wire.chunking`: envelopes larger than the broker's limit, in checked chunks;
* :mod:`~har_models.wire.update_encoding`: float32, float16 or 8-bit delta uploads;
* :mod:`~har_models.wire.safetensors_np`: a numpy reader/writer for devices without the Rust wheel;
* :mod:`~har_models.wire.pte_delivery`: ExecuTorch ``.pte`` files for devices that cannot export
  them (the request, the envelope, storage and the checks before a runtime loads them).
"""
