"""The engine process's runtime: state snapshots, garbage-collector and huge-page tuning, retries."""
