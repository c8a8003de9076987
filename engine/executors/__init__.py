"""Per-event work in Spark's executors: decode, validation, dead letters, (key, pane) pre-aggregation.

* :mod:`engine.executors.preagg` -- what runs in the Python workers of ``mapInArrow`` over the
  Kafka DataFrame: :class:`~engine.executors.preagg.Preaggregator` (picklable) maps Kafka
  records to rows of one schema (:data:`~engine.executors.preagg.OUTPUT_SCHEMA`): partial pane
  rows, dead letters, per-partition event-time maxima, raw events when asked, and the records
  of topics that are not event streams (the subscriptions);
* :mod:`engine.executors.collect` -- the engine's read of a micro-batch through them:
  :func:`~engine.executors.collect.collect_preaggregated` (one ``mapInArrow`` function per
  Spark context, the batch's parameters as a task-local property, checked by a token);
* :mod:`engine.executors.merge` -- the driver's side: the exact merge of the partial pane rows of
  several tasks and batches (:class:`~engine.executors.merge.PanePartial`) into the
  :class:`engine.evaluation.panes.PaneRows` that ``Evaluator.apply_panes`` takes;
* :mod:`engine.executors.output` -- a batch's whole executor output read by the driver
  (:func:`~engine.executors.output.merge_output`: the partials merged, dead letters, maxima,
  offsets, raw events, subscription records);
* :mod:`engine.executors.reference` -- today's driver path on the same records (decode +
  ``panes.aggregate`` in the driver), the oracle of the tests and the benchmark.

Nothing is imported here (``import engine.executors`` stays light in a Python worker).
"""
