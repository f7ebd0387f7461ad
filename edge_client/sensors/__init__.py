"""Sensor sources behind one interface: Android, MPU-6050 over I2C, replay."""

from edge_client.sensors.base import SENSORS, ReplaySensor, SensorSource

__all__ = ["SENSORS", "ReplaySensor", "SensorSource"]
