"""Maven coordinates and cache layout of tidewatch.jars (no network)."""

from __future__ import annotations

import pytest

from tidewatch import jars as kafka_dist
from tidewatch.settings import Settings


def test_artifact_names_drop_versions():
    assert kafka_dist._artifact_of("scala-library-2.13.16.jar") == "scala-library"
    assert kafka_dist._artifact_of("kafka_2.13-4.1.1.jar") == "kafka_2.13"
    assert kafka_dist._artifact_of("zstd-jni-1.5.6-10.jar") == "zstd-jni"
    assert kafka_dist._artifact_of("spark-sql-kafka-0-10_2.13-4.2.0.jar") == "spark-sql-kafka-0-10_2.13"


def test_dependency_with_exclusion():
    xml = kafka_dist._dep("g:a:1!x:y,z:w")
    assert "<groupId>g</groupId><artifactId>a</artifactId><version>1</version>" in xml
    assert xml.count("<exclusion>") == 2 and "<artifactId>y</artifactId>" in xml


def test_paths_follow_the_contract(tmp_path):
    s = Settings(cache_dir=tmp_path, kafka_version="4.1.1")
    assert kafka_dist.kafka_libs_dir(s) == tmp_path / "kafka" / "4.1.1" / "libs"
    assert kafka_dist.spark_jars_dir(s) == tmp_path / "spark-jars"
    assert kafka_dist.kafka_coordinates(s)[0] == "org.apache.kafka:kafka_2.13:4.1.1"
    # the token provider comes at the avro version, excluded from the connector's own deps
    coords = kafka_dist.spark_coordinates(s)
    assert coords[0].endswith("!org.apache.spark:spark-token-provider-kafka-0-10_2.13")


def test_resolve_is_a_no_op_when_stamped(tmp_path, monkeypatch):
    dest = tmp_path / "libs"
    dest.mkdir()
    (dest / "a-1.0.jar").write_bytes(b"x")
    (dest / ".complete").write_text("g:a:1.0\n")
    monkeypatch.setattr(kafka_dist.shutil, "which", lambda _: None)  # mvn would be needed otherwise
    assert kafka_dist.resolve(["g:a:1.0"], dest, name="t") == dest
    # other coordinates: needs Maven, which is "missing" here
    with pytest.raises(RuntimeError, match="mvn not found"):
        kafka_dist.resolve(["g:a:2.0"], dest, name="t")
