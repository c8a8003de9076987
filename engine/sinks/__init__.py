"""Where the engine writes a batch's output: PostgreSQL and Kafka."""
