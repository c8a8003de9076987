"""The wire formats of Tidewatch's streams: Avro (Kafka records) and CSV (event files)."""
