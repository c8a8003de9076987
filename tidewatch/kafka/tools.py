"""``tidewatch kafka TOOL …``: Apache Kafka's own command-line tools against Tidewatch's Kafka.

The tools are ``org.apache.kafka:kafka-tools`` of the broker's version (``settings.kafka_version``),
resolved from Maven Central into ``<cache_dir>/kafka/<version>/tools`` on first use
(:func:`tidewatch.jars.ensure_kafka_tools`).  :func:`command` builds the ``java`` command line of a
tool (:data:`TOOLS`: the short name -> its main class) with

* ``--bootstrap-server settings.kafka_bootstrap`` unless the arguments name one;
* the client settings of a principal (:func:`java_properties`: security protocol, SCRAM
  credentials, TLS trust store) in a properties file passed with the tool's own option
  (:data:`CONFIG_OPTION`); the file holds a password in the SCRAM modes, so it is private (0600)
  and deleted when the tool ends.  The principal is ``admin`` (the broker's super user) for the
  administrative tools and ``dashboard`` for the console consumer (it may read the streams, alerts
  and results); ``--principal`` picks another.

The console consumer gets defaults that make Tidewatch's topics readable (:func:`consumer_defaults`,
each left out when the arguments set it): ``read_committed`` (only what the transactions committed,
as every Tidewatch reader), one line per record with timestamp, partition, offset and key, and the
value through Kafka's ``BytesDeserializer``, which prints printable ASCII as itself and every other
byte as ``\\xNN``.  The values are framed Avro (:mod:`tidewatch.wire.avro`), so strings of the record
(subscription ids, keys, symbols) are readable in place; ``tidewatch alerts tail`` prints them
decoded, and :func:`unescape` turns a printed value back into the record's bytes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tidewatch.errors import TidewatchError

if TYPE_CHECKING:
    from tidewatch.settings import Settings

#: short name -> main class in kafka-tools (checked against the 4.1 jar with ``unzip -l``)
TOOLS = {
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
}
#: the option each tool reads a client properties file from
CONFIG_OPTION = {
    "console-consumer": "--consumer.config",
    "console-producer": "--producer.config",
    "topics": "--command-config",
    "consumer-groups": "--command-config",
    "get-offsets": "--command-config",
}
#: the principal a tool connects as unless ``--principal`` says otherwise
DEFAULT_PRINCIPAL = {"console-consumer": "dashboard"}
#: log4j2 configuration of a tool: warnings and errors to stderr, so stdout holds only the output
#: (log4j2's default configuration logs errors to stdout, e.g. the console consumer's time-out)
LOG4J2_PROPERTIES = """status = error
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = STDERR
"""
#: Kafka's deserializer that prints bytes as ASCII with ``\\xNN`` escapes (``Bytes.toString``)
BYTES_DESERIALIZER = "org.apache.kafka.common.serialization.BytesDeserializer"


class KafkaToolError(TidewatchError, RuntimeError):
    """A Kafka tool cannot be run (unknown tool, no java, the jars cannot be resolved)."""


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_properties(settings: Settings, principal: str) -> dict[str, str]:
    """The Java client's settings to connect as ``principal`` (``admin`` or one of
    :data:`tidewatch.kafka.client.PRINCIPALS`): :func:`tidewatch.kafka.client.client_config`
    (librdkafka's names) in the Java client's terms, as :func:`~tidewatch.kafka.client.spark_options`
    gives them to Spark.  Empty in the plaintext mode."""
    from tidewatch.kafka.client import client_config

    conf = client_config(settings, principal)
    if not conf:
        return {}
    props = {"security.protocol": conf["security.protocol"]}
    if "sasl.mechanism" in conf:
        props["sasl.mechanism"] = conf["sasl.mechanism"]
        props["sasl.jaas.config"] = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f"username={_jaas_quote(conf['sasl.username'])} password={_jaas_quote(conf['sasl.password'])};"
        )
    if "ssl.endpoint.identification.algorithm" in conf:
        verify = conf["ssl.endpoint.identification.algorithm"] == "https"
        props["ssl.endpoint.identification.algorithm"] = "https" if verify else ""
        if "ssl.ca.location" in conf:  # else the JVM's trust store
            props["ssl.truststore.type"] = "PEM"
            props["ssl.truststore.location"] = conf["ssl.ca.location"]
        if "ssl.certificate.location" in conf:  # a PEM keystore file would need an encrypted key
            props["ssl.keystore.type"] = "PEM"
            props["ssl.keystore.certificate.chain"] = Path(conf["ssl.certificate.location"]).read_text()
            props["ssl.keystore.key"] = Path(conf["ssl.key.location"]).read_text()
            if "ssl.key.password" in conf:
                props["ssl.key.password"] = conf["ssl.key.password"]
    return props


def _escape_property(text: str, key: bool = False) -> str:
    """``text`` as written in a ``java.util.Properties`` file (``\\n``, ``\\\\``, ``=``, ...)."""
    out = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch in "\n\r\t\f":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"}[ch])
        elif ch in "=:#!" or (ch == " " and (key or i == 0)):
            out.append("\\" + ch)
        elif ord(ch) > 0x7E:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else ch)
        else:
            out.append(ch)
    return "".join(out)


def properties_text(props: dict[str, str]) -> str:
    """``props`` as the text of a Java properties file."""
    return "".join(f"{_escape_property(k, key=True)}={_escape_property(v)}\n" for k, v in props.items())


def _has(args: Sequence[str], *options: str) -> bool:
    return any(a == o or a.startswith(o + "=") for a in args for o in options)


def _formatter_props(args: Sequence[str]) -> set[str]:
    """The formatter properties (``--property k=v`` / ``--formatter-property``) the arguments set."""
    names = set()
    for i, a in enumerate(args[:-1]):
        if a in ("--property", "--formatter-property"):
            names.add(args[i + 1].split("=", 1)[0])
    return names


def consumer_defaults(args: Sequence[str], principal: str) -> list[str]:
    """The console consumer's arguments added for Tidewatch's topics (module docstring), each only
    where ``args`` do not set it; a non-admin principal also gets a consumer group of its own
    prefix (the ACLs allow only those) unless ``--group`` or ``--partition`` is given."""
    from tidewatch.kafka.client import ADMIN, ID_PREFIX

    out: list[str] = []
    if not _has(args, "--isolation-level"):
        out += ["--isolation-level", "read_committed"]
    if not _has(args, "--formatter", "--value-deserializer") and "value.deserializer" not in _formatter_props(
        args
    ):
        out += ["--value-deserializer", BYTES_DESERIALIZER]
    if not _has(args, "--formatter"):
        given = _formatter_props(args)
        for prop in ("print.timestamp", "print.partition", "print.offset", "print.key"):
            if prop not in given:
                out += ["--property", f"{prop}=true"]
    if principal != ADMIN and not _has(args, "--group", "--partition"):
        out += ["--group", f"{ID_PREFIX[principal]}-console-{uuid.uuid4().hex[:12]}"]
    return out


def command(
    settings: Settings,
    tool: str,
    args: Sequence[str],
    *,
    classpath: Path,
    config_file: Path | None,
    principal: str | None = None,
    log_config: Path | None = None,
) -> list[str]:
    """The ``java`` command line of ``tool`` with ``args`` (see the module docstring);
    ``config_file`` is the client properties file of ``principal`` (None: the plaintext mode needs
    none; ``principal`` None: the tool's default, :func:`principal_of`; ``log_config``: a log4j2
    configuration file, e.g. :data:`LOG4J2_PROPERTIES`)."""
    if tool not in TOOLS:
        raise KafkaToolError(f"unknown Kafka tool {tool!r}; one of: {', '.join(TOOLS)}")
    java = shutil.which("java")
    if java is None:
        raise KafkaToolError("java not found: run scripts/setup.sh (it installs a JDK)")
    cmd = [java, *([f"-Dlog4j2.configurationFile={log_config}"] if log_config else [])]
    cmd += ["-cp", str(classpath / "*"), TOOLS[tool]]
    if not _has(args, "--bootstrap-server"):
        cmd += ["--bootstrap-server", settings.kafka_bootstrap]
    if config_file is not None and not _has(args, CONFIG_OPTION[tool]):
        cmd += [CONFIG_OPTION[tool], str(config_file)]
    if tool == "console-consumer":
        cmd += consumer_defaults(args, principal_of(tool, principal))
    return cmd + list(args)


def principal_of(tool: str, principal: str | None) -> str:
    """``principal``, or the tool's default (:data:`DEFAULT_PRINCIPAL`, else ``admin``)."""
    from tidewatch.kafka.client import ADMIN

    return principal or DEFAULT_PRINCIPAL.get(tool, ADMIN)


def run(
    settings: Settings,
    tool: str,
    args: Sequence[str],
    *,
    principal: str | None = None,
    capture: bool = False,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``tool`` (resolving kafka-tools first) and wait for it.  ``capture``: its stdout and
    stderr are returned as text (else they are this process's)."""
    from tidewatch.jars import ensure_kafka_tools

    who = principal_of(tool, principal)
    try:
        classpath = ensure_kafka_tools(settings)
    except RuntimeError as exc:
        raise KafkaToolError(str(exc)) from exc
    props = java_properties(settings, who)
    with tempfile.TemporaryDirectory(prefix="tidewatch-kafka-tool-") as tmp:
        config: Path | None = None
        if props:
            config = Path(tmp) / "client.properties"
            fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(properties_text(props))
        log_config = Path(tmp) / "log4j2.properties"
        log_config.write_text(LOG4J2_PROPERTIES)
        cmd = command(
            settings,
            tool,
            args,
            classpath=classpath,
            config_file=config,
            principal=who,
            log_config=log_config,
        )
        return subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout, check=False)


_ESCAPE = re.compile(rb"\\x([0-9A-Fa-f]{2})")


def unescape(printed: str) -> bytes:
    """The bytes behind Kafka's ``Bytes.toString`` (``BytesDeserializer``'s printed value): printable
    ASCII other than ``\\`` as itself, every other byte as ``\\xNN``."""
    return _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), printed.encode("ascii"))


def register(app: typer.Typer) -> None:
    """Add ``tidewatch kafka TOOL ARGS…`` to the root CLI."""
    kafka = typer.Typer(
        help="Apache Kafka's own command-line tools (kafka-tools from Maven Central), connected to "
        "Tidewatch's Kafka with its security settings.",
        no_args_is_help=True,
    )
    helps = {
        "console-consumer": "Kafka's console consumer: one line per record (timestamp, partition, offset, "
        "key, value bytes with \\xNN escapes), committed records only. Decoded values: tidewatch alerts tail.",
        "console-producer": "Kafka's console producer.",
        "topics": "kafka-topics (--list, --describe --topic T, ...).",
        "consumer-groups": "kafka-consumer-groups (--list, --describe --group G, ...).",
        "get-offsets": "kafka-get-offsets (the end offsets of --topic T).",
    }

    def make(tool: str) -> None:
        @kafka.command(
            tool,
            help=helps[tool] + " Arguments after the command go to the tool unchanged.",
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        )
        def _tool(
            ctx: typer.Context,
            principal: Annotated[
                str | None,
                typer.Option(
                    help="the Kafka principal to connect as (admin, feed, engine, dashboard, relay)"
                ),
            ] = None,
        ) -> None:
            from tidewatch.settings import get_settings

            try:
                proc = _run_cli(get_settings(), tool, list(ctx.args), principal)
            except KafkaToolError as exc:
                typer.echo(f"tidewatch kafka {tool}: {exc}", err=True)
                raise typer.Exit(1) from None
            raise typer.Exit(proc)

    for name in TOOLS:
        make(name)
    app.add_typer(kafka, name="kafka")


def _run_cli(settings: Settings, tool: str, args: list[str], principal: str | None) -> int:
    try:
        return run(settings, tool, args, principal=principal).returncode
    except KeyboardInterrupt:
        return 130
