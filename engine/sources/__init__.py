"""Where the engine reads its micro-batches from."""
