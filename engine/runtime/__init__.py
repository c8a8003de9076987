"""The engine process's runtime: state snapshots, garbage-collector tuning, retries."""
