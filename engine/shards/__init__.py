"""Sharded evaluation (issue #23): the collective indexes held in Spark's executors, by key.

* :mod:`engine.shards.route` -- the first stage, in Spark's tasks: records routed to the shards
  owning their keys (CRC-32 of the key mod N), rule changes to every shard, the batch's span;
* :mod:`engine.shards.panes` -- on pane rows (the default): the routing tasks' pre-aggregation
  split by shard, the batch's parameters handed from shard 0 through the driver, a shard's batch
  on pane rows (or on its batch read again from Kafka);
* :mod:`engine.shards.step` -- one shard's micro-batch (an :class:`engine.core.EngineCore` over
  its keys, the whole batch's clock) and the merge of the shards' outputs;
* :mod:`engine.shards.processor` -- a shard as Spark state (``transformWithStateInPandas``,
  RocksDB): its snapshot and batch log, the live core cached in the worker and validated
  against the state store's batch;
* :mod:`engine.shards.produce` -- a shard's Kafka output produced by its own task, in a
  transaction of the shard's own, exactly once (``engine_shard_delivery = "tasks"``, the default);
* :mod:`engine.shards.engine` -- the driver: the query, and ``foreachBatch`` delivering the
  merged output exactly once with the engine's sinks (PostgreSQL; Kafka too when the driver
  produces);
* :mod:`engine.shards.capped` -- the alert cap over the merged output, in the one core's order;
* :mod:`engine.shards.strides` -- the overload policy's strides, decided by the driver and read
  by every shard from the checkpoint;
* :mod:`engine.shards.charts` -- the key page's chart requests, answered by the shard owning
  the key;
* :mod:`engine.shards.ticks` -- a batch run on purpose (a file of the query's second source) when
  chart requests wait on an idle stream;
* :mod:`engine.shards.json_file` -- how those two checkpoint files are read (absent: nothing
  yet; unreadable or of another shape: refused).

Nothing is imported here (``import engine.shards`` stays light in a Python worker).
"""

__all__ = [
    "capped",
    "charts",
    "engine",
    "json_file",
    "panes",
    "processor",
    "produce",
    "route",
    "step",
    "strides",
    "ticks",
]
