"""Kafka's jars, resolved from Maven Central by mvn into ``<stack_dir>/kafka-<version>/lib``.

No Kafka tarball is downloaded: a pom whose runtime dependencies are the broker's classpath is
resolved once per version and its ``lib/`` is shared by every port's broker.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from c4.stack.supervise import Progress, StackError, locked, require, run_tool

if TYPE_CHECKING:
    from c4.settings import Settings

# Kafka 4.1 declares slf4j-api 1.7.36, which cannot see an slf4j 2 provider: without pinning the
# API to 2.x as well the broker logs nothing at all (NOP logger), and a failed start is mute.
SLF4J_VERSION = "2.0.17"
MAVEN_TIMEOUT_S = 900.0

JAVA_HINT = "java not found: install OpenJDK 17+ (apt-get install -y openjdk-17-jre-headless)"
_MVN_HINT = "mvn not found: install Maven 3.8+ (apt-get install -y maven)"


def kafka_home(settings: Settings) -> Path:
    """The folder holding the pom, the jars (``lib/``) and the mvn log of one Kafka version."""
    return settings.stack_dir / f"kafka-{settings.stack_kafka_version}"


def render_pom(kafka_version: str) -> str:
    """A pom whose runtime dependencies are exactly the broker's classpath."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>c4</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>{kafka_version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{kafka_version}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>{SLF4J_VERSION}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-simple</artifactId>
      <version>{SLF4J_VERSION}</version>
    </dependency>
  </dependencies>
</project>
"""


def ensure_kafka_jars(settings: Settings, progress: Progress | None = None) -> Path:
    """The broker's ``lib/`` folder, resolved from Maven Central by mvn the first time."""
    home = kafka_home(settings)
    lib = home / "lib"
    marker = home / "lib.complete"
    pom = render_pom(settings.stack_kafka_version)
    # The marker holds the pom's digest: a changed pom (another slf4j) resolves again.
    digest = hashlib.sha256(pom.encode()).hexdigest()

    def complete() -> bool:
        with contextlib.suppress(OSError):
            return marker.read_text(encoding="ascii").strip() == digest and lib.is_dir()
        return False

    if complete():
        return lib
    require("java", JAVA_HINT)
    mvn = require("mvn", _MVN_HINT)
    with locked(home / ".lock"):
        if complete():  # another process resolved it while we waited for the lock
            return lib
        if progress is not None:
            progress(f"kafka: resolving Kafka {settings.stack_kafka_version} jars with mvn")
        (home / "pom.xml").write_text(pom, encoding="utf-8")
        # Resolve into a scratch folder: a failed or interrupted run never leaves a lib/ that
        # looks complete, and a re-resolve never mixes old and new jars on one classpath.
        partial = home / "lib.partial"
        shutil.rmtree(partial, ignore_errors=True)
        run_tool(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(home / "pom.xml"),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={partial}",
                "-DincludeScope=runtime",
            ],
            home / "mvn.log",
            MAVEN_TIMEOUT_S,
            "mvn (check network access to Maven Central and the version C4_STACK_KAFKA_VERSION)",
        )
        broker_jar = partial / f"kafka_2.13-{settings.stack_kafka_version}.jar"
        if not broker_jar.is_file():
            message = f"mvn finished but {broker_jar.name} is missing: see {home / 'mvn.log'}"
            raise StackError(message)
        shutil.rmtree(lib, ignore_errors=True)
        partial.rename(lib)
        marker.write_text(digest + "\n", encoding="ascii")
    return lib
