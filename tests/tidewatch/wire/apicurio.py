"""A real Confluent-compatible Schema Registry for the tests: Apicurio Registry, built from Maven
Central with ``mvn`` and run as a subprocess on 127.0.0.1.

Maven Central has ``io.apicurio:apicurio-registry-app`` only as a plain jar (a Quarkus application
before its Quarkus build), so :func:`build` writes a small Maven reactor under
``.cache/apicurio/build-<version>/`` (git-ignored) and builds a Quarkus fast-jar from it:

* ``app``: depends on the ``apicurio-registry-app`` POM (its dependencies, not its jar), unpacks
  the jar into ``target/classes`` (so Quarkus builds it as the application, with its
  ``application.properties``) and runs ``quarkus-maven-plugin:build``;
* ``config-index-deployment``: the build step of the ``apicurio-common-app-components-config-index``
  Quarkus extension, which the app uses but whose deployment artifact is not on Maven Central;
  a build step of our own with the coordinates Quarkus looks for (it makes the
  ``DynamicConfigPropertyList`` bean of the ``@Dynamic`` config properties, as the original).

Version 2.4.2.Final: the newest whose parent POM and ``apicurio-registry-schema-util-provider``
are both on Maven Central (3.3.3 lacks the latter, 3.0.9 and 3.3.2 their parent POM, 2.5/2.6 the
provider).  Its ``org.everit.json.schema`` (published on JitPack only) is swapped for the same
library's Central build, ``com.github.erosb:everit-json-schema``.  Every repository is mirrored to
Maven Central (``settings.xml``).  In-memory storage (H2), no authentication; Confluent's API at
``/apis/ccompat/v6`` (and ``/apis/ccompat/v7``).

Needs ``mvn`` and a Java 11+ ``java``.  The build runs when ``quarkus-run.jar`` is absent or the
generated files changed: about 1.5 minutes with an empty ``~/.m2`` (some 240 MB downloaded), 35-50
seconds with the downloads cached.  :func:`running` then starts the registry (about 5-8 seconds,
JVM heap 512 MB) and stops it by PID.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.services import free_port
from tidewatch.settings import PROJECT_ROOT

APICURIO_VERSION = "2.4.2.Final"
QUARKUS_VERSION = "2.16.4.Final"  # the apicurio-registry parent POM's quarkus.version
CONFIG_INDEX_VERSION = "0.1.18.Final"  # apicurio-common-app-components of that parent
CACHE = PROJECT_ROOT / ".cache" / "apicurio"
BUILD_TIMEOUT_S = 1800
START_TIMEOUT_S = 180
# the first is set by the Quarkus platform BOM, which the parent POM imports and this build does
# not; the second overrides the app's legacy-jar
BUILD_PROPERTIES = ["-Dplatform.quarkus.native.builder-image=none", "-Dquarkus.package.type=fast-jar"]

SETTINGS_XML = """<settings>
  <mirrors>
    <mirror>
      <id>central-only</id>
      <mirrorOf>*</mirrorOf>
      <url>https://repo.maven.apache.org/maven2</url>
    </mirror>
  </mirrors>
</settings>
"""

REACTOR_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>tidewatch.test</groupId>
  <artifactId>apicurio-registry-build</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <properties>
    <maven.compiler.release>11</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <build>
    <pluginManagement>
      <plugins>
        <plugin>
          <groupId>org.apache.maven.plugins</groupId>
          <artifactId>maven-compiler-plugin</artifactId>
          <version>3.11.0</version>
        </plugin>
        <plugin>
          <groupId>org.apache.maven.plugins</groupId>
          <artifactId>maven-resources-plugin</artifactId>
          <version>3.3.1</version>
        </plugin>
        <plugin>
          <groupId>org.apache.maven.plugins</groupId>
          <artifactId>maven-jar-plugin</artifactId>
          <version>3.3.0</version>
        </plugin>
      </plugins>
    </pluginManagement>
  </build>
  <modules>
    <module>config-index-deployment</module>
    <module>app</module>
  </modules>
</project>
"""

DEPLOYMENT_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <parent>
    <groupId>tidewatch.test</groupId>
    <artifactId>apicurio-registry-build</artifactId>
    <version>1</version>
    <relativePath>../pom.xml</relativePath>
  </parent>
  <groupId>io.apicurio</groupId>
  <artifactId>apicurio-common-app-components-config-index-deployment</artifactId>
  <version>@CONFIG_INDEX@</version>
  <dependencies>
    <dependency>
      <groupId>io.apicurio</groupId>
      <artifactId>apicurio-common-app-components-config-index</artifactId>
      <version>@CONFIG_INDEX@</version>
    </dependency>
    <dependency>
      <groupId>io.apicurio</groupId>
      <artifactId>apicurio-common-app-components-config-definitions</artifactId>
      <version>@CONFIG_INDEX@</version>
    </dependency>
    <dependency>
      <groupId>io.quarkus</groupId>
      <artifactId>quarkus-arc-deployment</artifactId>
      <version>@QUARKUS@</version>
    </dependency>
  </dependencies>
</project>
"""

PROCESSOR_PACKAGE = "tidewatch/test/apicurio"
PROCESSOR_CLASS = "tidewatch.test.apicurio.DynamicConfigIndexStep"
PROCESSOR_JAVA = """package tidewatch.test.apicurio;

import java.util.ArrayList;
import java.util.List;

import org.eclipse.microprofile.config.inject.ConfigProperty;
import org.jboss.jandex.AnnotationInstance;
import org.jboss.jandex.AnnotationValue;
import org.jboss.jandex.DotName;

import apicurio.common.app.components.config.index.DynamicPropertiesInfoRecorder;
import io.apicurio.common.apps.config.Dynamic;
import io.apicurio.common.apps.config.DynamicConfigPropertyDef;
import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import io.quarkus.arc.deployment.BeanDiscoveryFinishedBuildItem;
import io.quarkus.arc.deployment.SyntheticBeanBuildItem;
import io.quarkus.arc.processor.InjectionPointInfo;
import io.quarkus.deployment.annotations.BuildProducer;
import io.quarkus.deployment.annotations.BuildStep;
import io.quarkus.deployment.annotations.ExecutionTime;
import io.quarkus.deployment.annotations.Record;

/** The DynamicConfigPropertyList bean: every field injection of a @Dynamic @ConfigProperty. */
public class DynamicConfigIndexStep {

    private static final DotName CONFIG_PROPERTY = DotName.createSimple(ConfigProperty.class.getName());
    private static final DotName DYNAMIC = DotName.createSimple(Dynamic.class.getName());

    @BuildStep
    @Record(ExecutionTime.RUNTIME_INIT)
    void dynamicProperties(DynamicPropertiesInfoRecorder recorder, BeanDiscoveryFinishedBuildItem beans,
            BuildProducer<SyntheticBeanBuildItem> out) throws ClassNotFoundException {
        List<DynamicConfigPropertyDef> defs = new ArrayList<>();
        for (InjectionPointInfo ip : beans.getInjectionPoints()) {
            AnnotationInstance property = ip.getRequiredQualifier(CONFIG_PROPERTY);
            if (property == null || !ip.isField() || ip.getTarget().asField().annotation(DYNAMIC) == null) {
                continue;
            }
            AnnotationInstance dynamic = ip.getRequiredQualifier(DYNAMIC);
            String name = property.value("name").asString();
            AnnotationValue dflt = property.value("defaultValue");
            if (dflt == null) {
                throw new IllegalStateException("dynamic config property " + name + " has no default value");
            }
            // the injected type is Supplier<T>: T is the property's type
            String type = ip.getRequiredType().asParameterizedType().arguments().get(0).name().toString();
            DynamicConfigPropertyDef def = new DynamicConfigPropertyDef(name, Class.forName(type), dflt.asString());
            if (dynamic != null) {
                if (dynamic.value("label") != null) {
                    def.setLabel(dynamic.value("label").asString());
                }
                if (dynamic.value("description") != null) {
                    def.setDescription(dynamic.value("description").asString());
                }
                if (dynamic.value("requires") != null) {
                    def.setRequires(dynamic.value("requires").asStringArray());
                }
            }
            defs.add(def);
        }
        out.produce(SyntheticBeanBuildItem.configure(DynamicConfigPropertyList.class)
                .runtimeValue(recorder.initializePropertiesInfo(defs))
                .unremovable()
                .setRuntimeInit()
                .done());
    }
}
"""

APP_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <parent>
    <groupId>tidewatch.test</groupId>
    <artifactId>apicurio-registry-build</artifactId>
    <version>1</version>
    <relativePath>../pom.xml</relativePath>
  </parent>
  <artifactId>apicurio-registry-runner</artifactId>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <!-- the versions the app was built with (its parent's, with the Quarkus BOM) -->
        <groupId>io.apicurio</groupId>
        <artifactId>apicurio-registry</artifactId>
        <version>@APICURIO@</version>
        <type>pom</type>
        <scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>io.apicurio</groupId>
      <artifactId>apicurio-registry-app</artifactId>
      <version>@APICURIO@</version>
      <type>pom</type>
      <exclusions>
        <exclusion>
          <groupId>com.github.everit-org.json-schema</groupId>
          <artifactId>org.everit.json.schema</artifactId>
        </exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <groupId>com.github.erosb</groupId>
      <artifactId>everit-json-schema</artifactId>
      <version>1.14.2</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>3.6.1</version>
        <executions>
          <execution>
            <id>unpack-app</id>
            <phase>process-classes</phase>
            <goals><goal>unpack</goal></goals>
            <configuration>
              <artifactItems>
                <artifactItem>
                  <groupId>io.apicurio</groupId>
                  <artifactId>apicurio-registry-app</artifactId>
                  <version>@APICURIO@</version>
                  <type>jar</type>
                  <outputDirectory>${project.build.outputDirectory}</outputDirectory>
                </artifactItem>
              </artifactItems>
            </configuration>
          </execution>
        </executions>
      </plugin>
      <plugin>
        <groupId>io.quarkus</groupId>
        <artifactId>quarkus-maven-plugin</artifactId>
        <version>@QUARKUS@</version>
        <executions>
          <execution>
            <goals><goal>build</goal></goals>
          </execution>
        </executions>
      </plugin>
    </plugins>
  </build>
</project>
"""


class ApicurioBuildError(RuntimeError):
    """The registry could not be built or started."""


def _files() -> dict[str, str]:
    """Relative path -> text of the generated Maven build."""

    def fill(text: str) -> str:
        return (
            text.replace("@APICURIO@", APICURIO_VERSION)
            .replace("@QUARKUS@", QUARKUS_VERSION)
            .replace("@CONFIG_INDEX@", CONFIG_INDEX_VERSION)
        )

    dep = "config-index-deployment"
    return {
        "settings.xml": SETTINGS_XML,
        "pom.xml": REACTOR_POM,
        f"{dep}/pom.xml": fill(DEPLOYMENT_POM),
        f"{dep}/src/main/java/{PROCESSOR_PACKAGE}/DynamicConfigIndexStep.java": PROCESSOR_JAVA,
        f"{dep}/src/main/resources/META-INF/quarkus-build-steps.list": PROCESSOR_CLASS + "\n",
        "app/pom.xml": fill(APP_POM),
    }


def build_dir() -> Path:
    return CACHE / f"build-{APICURIO_VERSION}"


def run_jar() -> Path:
    return build_dir() / "app" / "target" / "quarkus-app" / "quarkus-run.jar"


def build(force: bool = False) -> Path:
    """The registry's ``quarkus-run.jar``, built first when absent, stale or ``force``d.
    Raises :class:`ApicurioBuildError` (with the end of Maven's log) when the build fails."""
    files = _files()
    stamp = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()
    root = build_dir()
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time across processes
        stamp_file = root / "build.stamp"
        if not force and run_jar().is_file() and stamp_file.is_file() and stamp_file.read_text() == stamp:
            return run_jar()
        mvn = shutil.which("mvn")
        if mvn is None:
            raise ApicurioBuildError("mvn is not installed: cannot build Apicurio Registry")
        shutil.rmtree(root, ignore_errors=True)
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        log = root / "build.log"
        cmd = [mvn, "-B", "-s", str(root / "settings.xml"), "-DskipTests", *BUILD_PROPERTIES, "package"]
        with open(log, "w") as out:
            try:
                rc = subprocess.run(
                    cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S
                ).returncode
            except subprocess.TimeoutExpired:
                rc = -1
        if rc != 0 or not run_jar().is_file():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            raise ApicurioBuildError(
                f"building Apicurio Registry {APICURIO_VERSION} failed (rc={rc}; {' '.join(cmd)} in {root}; "
                f"log {log}):\n{tail}"
            )
        stamp_file.write_text(stamp)
        return run_jar()


@dataclass
class RunningRegistry:
    url: str  # base URL of Confluent's API (what schema_registry_url is set to)
    port: int
    pid: int
    log: Path
    started_in_s: float


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=2) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@contextmanager
def running(api: str = "v7") -> Iterator[RunningRegistry]:
    """Build if needed, start the registry on 127.0.0.1 on a free port, yield it once it answers
    Confluent's API (``/apis/ccompat/<api>``), and stop it by PID at the end."""
    jar = build()
    java = shutil.which("java")
    if java is None:
        raise ApicurioBuildError("java is not installed: cannot run Apicurio Registry")
    port = free_port()
    url = f"http://127.0.0.1:{port}/apis/ccompat/{api}"
    log = build_dir() / "registry.log"  # the last start's
    cmd = [
        java,
        "-Xmx512m",
        "-Dquarkus.http.host=127.0.0.1",
        f"-Dquarkus.http.port={port}",
        "-jar",
        str(jar),
    ]
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=jar.parent, stdout=out, stderr=subprocess.STDOUT)
    try:
        while not _ready(url):
            if proc.poll() is not None or time.monotonic() - t0 > START_TIMEOUT_S:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
                raise ApicurioBuildError(
                    f"Apicurio Registry did not start on port {port} (exit code {proc.poll()}; log {log}):\n{tail}"
                )
            time.sleep(0.25)
        yield RunningRegistry(
            url=url,
            port=port,
            pid=proc.pid,
            log=log,
            started_in_s=time.monotonic() - t0,
        )
    finally:
        _stop(proc)
