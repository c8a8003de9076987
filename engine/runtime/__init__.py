"""The engine process's runtime: state snapshots, garbage-collector and huge-page tuning, retries, a thread's kernel time and page faults, the driver's CPU between batches, a polling thread."""
