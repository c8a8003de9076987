"""Resolve Apache Kafka and the Spark connectors from Maven Central into the project cache.

Path contract (other parts, e.g. the Kafka Containerfile, copy from these):

* ``<cache_dir>/kafka/<kafka_version>/libs/*.jar`` -- ``org.apache.kafka:kafka_2.13:<version>``
  with its runtime dependencies and a log4j2 SLF4J binding: the classpath of a KRaft broker
  (``java -cp 'libs/*' kafka.Kafka server.properties``).
* ``<cache_dir>/kafka/<kafka_version>/tools/*.jar`` -- ``org.apache.kafka:kafka-tools:<version>``
  (the same version as the broker) with its runtime dependencies: the classpath of Kafka's
  command-line tools (``java -cp 'tools/*' org.apache.kafka.tools.consumer.ConsoleConsumer ...``;
  :mod:`tidewatch.kafka.tools` runs them as ``tidewatch kafka ...``).
* ``<cache_dir>/spark-jars/*.jar`` -- ``spark-sql-kafka-0-10_2.13`` and ``spark-avro_2.13``
  with their runtime dependencies, minus what the pyspark wheel already ships; pass them
  with ``spark.jars`` (see :func:`spark_jars`).

Maven Central (as reachable from our machines; docs/ARCHITECTURE.md, "Where we departed from the
design brief") has no Spark 4.3.0 connector jars:
``spark-sql-kafka-0-10_2.13`` stops at 4.2.0, and ``spark-token-provider-kafka-0-10_2.13`` and
``spark-avro_2.13`` are complete only at 4.0.0.  Tested: pyspark 4.3.0 reads Kafka with
spark-sql-kafka 4.2.0 + token-provider 4.0.0 + kafka-clients 3.9, and round-trips
``to_avro``/``from_avro`` with spark-avro 4.0.0.  The versions are settings
(``spark_kafka_connector_version``, ``spark_avro_version``).  Spark's parent pom also names
a mirror host that is unreachable here; the generated pom rebinds that repository id to
Maven Central.

Each folder holds a ``.complete`` stamp naming the coordinates it was resolved for, so a
second run is a no-op.  Resolution uses ``mvn dependency:copy-dependencies`` on a generated
pom, so Maven's own local repository (``~/.m2``) caches the downloads across clones.

Run as ``python -m tidewatch.jars [kafka|kafka-tools|spark|all][?] …``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tidewatch.settings import Settings, get_settings

LOG4J_VERSION = "2.24.3"
CENTRAL = "https://repo.maven.apache.org/maven2"
_TOKEN_PROVIDER = "org.apache.spark:spark-token-provider-kafka-0-10_2.13"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>tidewatch.cache</groupId><artifactId>{name}</artifactId><version>1</version>
  <packaging>pom</packaging>
  <repositories>
    <repository><id>gcs-maven-central-mirror</id><url>{central}</url></repository>
  </repositories>
  <dependencies>
{deps}
  </dependencies>
</project>
"""


def _dep(coord: str) -> str:
    """``group:artifact:version[!exclgroup:exclartifact,...]`` as a pom ``<dependency>``."""
    coord, _, excl = coord.partition("!")
    group, artifact, version = coord.split(":")
    exclusions = ""
    if excl:
        items = []
        for e in excl.split(","):
            eg, ea = e.split(":")
            items.append(f"<exclusion><groupId>{eg}</groupId><artifactId>{ea}</artifactId></exclusion>")
        exclusions = "<exclusions>" + "".join(items) + "</exclusions>"
    return (
        f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version>{exclusions}</dependency>"
    )


def kafka_coordinates(settings: Settings) -> list[str]:
    return [
        f"org.apache.kafka:kafka_2.13:{settings.kafka_version}",
        # Kafka 4 logs through SLF4J 1.x into log4j2; its distribution ships this binding too.
        f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
    ]


def kafka_tools_coordinates(settings: Settings) -> list[str]:
    """Kafka's command-line tools (console consumer and producer, ``kafka-topics``,
    ``kafka-consumer-groups`` ...) of the broker's version, with the same log4j2 binding."""
    return [
        f"org.apache.kafka:kafka-tools:{settings.kafka_version}",
        f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
    ]


def spark_coordinates(settings: Settings) -> list[str]:
    k, a = settings.spark_kafka_connector_version, settings.spark_avro_version
    return [
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{k}!{_TOKEN_PROVIDER}",
        f"{_TOKEN_PROVIDER}:{a}",
        f"org.apache.spark:spark-avro_2.13:{a}",
    ]


def kafka_libs_dir(settings: Settings) -> Path:
    return settings.cache_dir / "kafka" / settings.kafka_version / "libs"


def kafka_tools_dir(settings: Settings) -> Path:
    return settings.cache_dir / "kafka" / settings.kafka_version / "tools"


def spark_jars_dir(settings: Settings) -> Path:
    return settings.cache_dir / "spark-jars"


def _artifact_of(jar_name: str) -> str:
    """``scala-library-2.13.16.jar`` -> ``scala-library``."""
    m = re.match(r"^(.*)-\d+\.\d+[\w.\-]*\.jar$", jar_name)
    return m.group(1) if m else jar_name


def _stamp_ok(dest: Path, coords: list[str]) -> bool:
    stamp = dest / ".complete"
    return stamp.is_file() and stamp.read_text().split() == coords and any(dest.glob("*.jar"))


def resolve(
    coords: list[str], dest: Path, *, name: str, exclude: frozenset[str] = frozenset(), quiet: bool = True
) -> Path:
    """Copy ``coords`` and their runtime dependencies into ``dest`` (idempotent).

    ``exclude`` names artifacts (without version) to leave out, e.g. what pyspark ships.
    """
    if _stamp_ok(dest, coords):
        return dest
    if shutil.which("mvn") is None:
        raise RuntimeError("mvn not found: run scripts/setup.sh (it installs maven)")
    staging = Path(tempfile.mkdtemp(prefix=f"tidewatch-{name}-"))
    try:
        pom = _POM.format(name=name, central=CENTRAL, deps="\n".join(_dep(c) for c in coords))
        (staging / "pom.xml").write_text(pom)
        out = staging / "libs"
        cmd = [
            "mvn",
            "-B",
            *(["-q"] if quiet else []),
            "-f",
            str(staging / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out}",
            "-DincludeScope=runtime",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise RuntimeError(f"maven could not resolve {' '.join(coords)}:\n{tail}")
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for jar in sorted(out.glob("*.jar")):
            if _artifact_of(jar.name) not in exclude:
                shutil.copy2(jar, dest / jar.name)
        (dest / ".complete").write_text("\n".join(coords) + "\n")
        return dest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_kafka(settings: Settings) -> Path:
    """The Kafka broker classpath folder, resolved if missing."""
    return resolve(kafka_coordinates(settings), kafka_libs_dir(settings), name="kafka")


def ensure_kafka_tools(settings: Settings) -> Path:
    """The classpath folder of Kafka's command-line tools, resolved if missing."""
    return resolve(kafka_tools_coordinates(settings), kafka_tools_dir(settings), name="kafka-tools")


def _pyspark_artifacts() -> frozenset[str]:
    try:
        import pyspark
    except ImportError:
        return frozenset()
    jars = Path(pyspark.__file__).parent / "jars"
    return frozenset(_artifact_of(p.name) for p in jars.glob("*.jar"))


def ensure_spark_jars(settings: Settings) -> Path:
    """The Spark connector jars folder, resolved if missing."""
    return resolve(
        spark_coordinates(settings), spark_jars_dir(settings), name="spark-jars", exclude=_pyspark_artifacts()
    )


def spark_jars(settings: Settings) -> list[str]:
    """The cached connector jars, for ``spark.jars`` (empty if not fetched)."""
    d = spark_jars_dir(settings)
    return [str(p) for p in sorted(d.glob("*.jar"))] if (d / ".complete").is_file() else []


def main(argv: list[str] | None = None) -> int:
    """``kafka``, ``kafka-tools``, ``spark``, ``all``; a trailing ``?`` (``spark?``) only warns on
    failure."""
    what = (argv if argv is not None else sys.argv[1:]) or ["all"]
    settings = get_settings()
    rc = 0
    for w in what:
        optional = w.endswith("?")
        w = w.rstrip("?")
        try:
            if w in ("kafka", "all"):
                print(f"kafka jars: {ensure_kafka(settings)}")
            if w in ("kafka-tools", "all"):
                print(f"kafka tools: {ensure_kafka_tools(settings)}")
            if w in ("spark", "all"):
                print(f"spark jars: {ensure_spark_jars(settings)}")
        except RuntimeError as exc:
            print(f"{'warning' if optional else 'error'}: {exc}", file=sys.stderr)
            rc = rc if optional else 1
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
