"""Kafka helpers shared by every area (topic administration)."""
