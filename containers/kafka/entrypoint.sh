#!/bin/bash
# Single-node KRaft Kafka.  Configuration comes from the environment:
#   KAFKA_ADVERTISED_LISTENERS  external listener as clients outside see it
#                               (default PLAINTEXT://localhost:9092)
#   KAFKA_ADVERTISED_FILE       if set, wait until this file exists and use its
#                               content instead (testcontainers writes it after the
#                               container started, once the host port is known)
#   KAFKA_INTERNAL_HOST         name other containers use (default: hostname)
#   KAFKA_CLUSTER_ID, KAFKA_NUM_PARTITIONS, KAFKA_AUTO_CREATE_TOPICS, KAFKA_HEAP
#   KAFKA_EXTRA_PROPERTIES      extra server.properties lines (newline separated)
#   KAFKA_SECURITY              plaintext (default) or scram: both client listeners speak
#                               SASL/SCRAM-SHA-512, ACLs are enforced (nothing allowed without
#                               one), super user "admin" with KAFKA_ADMIN_PASSWORD (required);
#                               the principals and ACLs are created by the stack's init
#                               (tidewatch.kafka.client.ensure_principals)
set -euo pipefail

KAFKA_HOME="${KAFKA_HOME:-/opt/kafka}"
DATA_DIR="${KAFKA_DATA_DIR:-/var/lib/kafka/data}"
CONF="$KAFKA_HOME/config/server.properties"

if [ -n "${KAFKA_ADVERTISED_FILE:-}" ]; then
    echo "tidewatch-kafka: waiting for $KAFKA_ADVERTISED_FILE"
    for _ in $(seq 1 1200); do [ -s "$KAFKA_ADVERTISED_FILE" ] && break; sleep 0.1; done
    [ -s "$KAFKA_ADVERTISED_FILE" ] || { echo "tidewatch-kafka: $KAFKA_ADVERTISED_FILE never appeared" >&2; exit 1; }
    ADVERTISED="$(tr -d '\n' <"$KAFKA_ADVERTISED_FILE")"
else
    ADVERTISED="${KAFKA_ADVERTISED_LISTENERS:-PLAINTEXT://localhost:9092}"
fi
INTERNAL_HOST="${KAFKA_INTERNAL_HOST:-$(hostname)}"

SECURITY_PROPS="listener.security.protocol.map=PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
SCRAM_FORMAT=()
case "${KAFKA_SECURITY:-plaintext}" in
    plaintext) ;;
    scram)
        if [ -z "${KAFKA_ADMIN_PASSWORD:-}" ]; then
            echo "tidewatch-kafka: KAFKA_SECURITY=scram needs KAFKA_ADMIN_PASSWORD (TIDEWATCH_KAFKA_ADMIN_PASSWORD in compose)" >&2
            exit 2
        fi
        PW="${KAFKA_ADMIN_PASSWORD//\\/\\\\}"
        PW="${PW//\"/\\\"}"
        SECURITY_PROPS="listener.security.protocol.map=PLAINTEXT:SASL_PLAINTEXT,INTERNAL:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.internal.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\"${PW}\";
listener.name.plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:ANONYMOUS
allow.everyone.if.no.acl.found=false"
        SCRAM_FORMAT=(--add-scram "SCRAM-SHA-512=[name=admin,password=${KAFKA_ADMIN_PASSWORD}]")
        ;;
    *) echo "tidewatch-kafka: KAFKA_SECURITY must be plaintext or scram" >&2; exit 2 ;;
esac

cat >"$CONF" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:9093
listeners=PLAINTEXT://0.0.0.0:9092,INTERNAL://0.0.0.0:29092,CONTROLLER://127.0.0.1:9093
advertised.listeners=${ADVERTISED},INTERNAL://${INTERNAL_HOST}:29092
${SECURITY_PROPS}
inter.broker.listener.name=INTERNAL
controller.listener.names=CONTROLLER
log.dirs=${DATA_DIR}
num.partitions=${KAFKA_NUM_PARTITIONS:-1}
auto.create.topics.enable=${KAFKA_AUTO_CREATE_TOPICS:-true}
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.cleaner.dedupe.buffer.size=16777216
${KAFKA_EXTRA_PROPERTIES:-}
PROPS

JAVA_OPTS=(-Xmx"${KAFKA_HEAP:-512m}" -Xms128m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$KAFKA_HOME/config/log4j2.properties" -cp "$KAFKA_HOME/libs/*")

mkdir -p "$DATA_DIR"
if [ ! -e "$DATA_DIR/meta.properties" ]; then
    java "${JAVA_OPTS[@]}" kafka.tools.StorageTool format --ignore-formatted \
        -t "${KAFKA_CLUSTER_ID:-MkU3OEVBNTcwNTJENDM2Qk}" -c "$CONF" "${SCRAM_FORMAT[@]}"
fi
echo "tidewatch-kafka: advertising ${ADVERTISED} and INTERNAL://${INTERNAL_HOST}:29092"
exec java "${JAVA_OPTS[@]}" kafka.Kafka "$CONF"
