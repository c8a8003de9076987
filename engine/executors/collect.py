"""The engine's read of a micro-batch through the executors: one ``mapInArrow`` function per
Spark context, the batch's parameters as a task-local property.

:func:`collect_preaggregated` runs :class:`engine.executors.preagg.Preaggregator` over Spark's
Kafka DataFrame and collects its output (``toArrow``) -- what
:func:`engine.executors.output.merge_output` takes.  Its rows are those of
``spark_preaggregate(df, params).toArrow()``; only the way the parameters reach the tasks differs
(:data:`engine.executors.preagg.PARAMS_PROPERTY`), checked on every output by the token the tasks
write back (:data:`engine.executors.preagg.TOKEN_KEY`).
"""

from __future__ import annotations

import base64
import itertools
import os
import pickle
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import BatchParamsMismatch
from engine.executors.preagg import (
    KAFKA_COLUMNS,
    OUTPUT_DDL,
    PARAMS_PROPERTY,
    TOKEN_KEY,
    BatchParams,
    TaskParamsPreaggregator,
)

__all__ = ["collect_preaggregated"]

#: the Spark context's Java object and its ``mapInArrow`` function (a PySpark
#: ``UserDefinedFunction`` of :class:`TaskParamsPreaggregator`), made at the first call
_SHARED: list[tuple[Any, Any]] = []
_TOKENS = itertools.count(1)


def collect_preaggregated(df: Any, params: BatchParams) -> pa.Table:
    """``df`` (Spark's Kafka source) through the executors with ``params``, collected
    (``toArrow``): what :func:`engine.executors.output.merge_output` takes.

    The same rows as ``spark_preaggregate(df, params).toArrow()``, but the Python function is
    made and pickled once per Spark context, not per batch (cloudpickle and the Py4J calls that
    register it: ≈ 5 ms of the driver's CPU a call, ≈ 18 ms of the read's time in a profile of
    the live run; docs/measurements/engine.md).  The parameters travel as a task-local property
    (:data:`PARAMS_PROPERTY`; Spark sends the submitting thread's local properties with each
    task, and PySpark's workers read them through ``TaskContext.getLocalProperty``), set on the
    calling thread just before the job and removed after it.  Each call's parameters come with
    a fresh token that the tasks write into their payloads (every task writes ``partition``
    rows); output made with any other parameters (a stale property) is refused with
    :class:`engine.errors.BatchParamsMismatch`, never merged."""
    from pyspark.sql import DataFrame
    from pyspark.sql.pandas.functions import pandas_udf
    from pyspark.util import PythonEvalType

    spark = df.sparkSession
    sc = spark.sparkContext
    if not _SHARED or _SHARED[0][0] is not sc._jsc:
        fn = pandas_udf(
            TaskParamsPreaggregator(),
            returnType=OUTPUT_DDL,
            functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF,
        )  # type: ignore[call-overload]
        _SHARED[:] = [(sc._jsc, fn)]
    fn = _SHARED[0][1]
    sel = df.select(*KAFKA_COLUMNS)
    out = DataFrame(sel._jdf.mapInArrow(fn(*[sel[c] for c in sel.columns])._jc, False, None), spark)
    token = f"{os.getpid()}-{next(_TOKENS)}"
    sc.setLocalProperty(PARAMS_PROPERTY, f"{token}:{base64.b64encode(pickle.dumps(params)).decode('ascii')}")
    try:
        tbl: pa.Table = out.toArrow()
    finally:
        sc.setLocalProperty(PARAMS_PROPERTY, None)
    _check_token(tbl, token)
    return tbl


def _check_token(tbl: pa.Table, token: str) -> None:
    """Refuse output some of whose tasks ran with parameters other than this call's."""
    kind = tbl.column("kind")
    for payload in tbl.filter(pc.equal(kind, "partition")).column("payload").to_pylist():
        meta = pa.ipc.open_stream(payload).schema.metadata or {}
        got = meta.get(TOKEN_KEY, b"").decode()
        if got != token:
            raise BatchParamsMismatch(
                f"executor output made with the parameters of call {got or '(none)'}, not of this "
                f"call ({token}): a task read a stale {PARAMS_PROPERTY!r}; the batch is refused"
            )
