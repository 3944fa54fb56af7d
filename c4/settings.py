"""One settings object for every process: env vars ``C4_*``, explicit arguments win."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]


def _default_stack_dir() -> Path:
    return Path.home() / ".cache" / "c4"


class Settings(BaseSettings):
    """Connection and local-stack settings; env var ``C4_<FIELD>`` sets ``field``."""

    model_config = SettingsConfigDict(env_prefix="C4_", extra="forbid", frozen=True)

    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_security_protocol: SecurityProtocol = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: Path | None = None

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_password: SecretStr | None = None
    # Put before every Redis key of the cluster state (tests use a unique one).
    redis_key_prefix: str = Field(default="c4", pattern=r"^[A-Za-z0-9._:{}-]+$", max_length=100)

    # Put before every topic name, e.g. "staging." (tests use a unique one); empty in production.
    topic_prefix: str = Field(default="", pattern=r"^[A-Za-z0-9._-]*$", max_length=100)
    topic_partitions: int = Field(default=8, ge=1, le=10_000)
    topic_retention_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=-1)

    # Where the workers serve /metrics: loopback unless told (0.0.0.0 or the pod's address
    # lets a Prometheus in another container scrape them).
    metrics_address: str = Field(default="127.0.0.1", pattern=r"^[A-Za-z0-9.:_-]+$", max_length=255)

    stack_dir: Path = Field(default_factory=_default_stack_dir)
    stack_kafka_version: str = "4.1.1"
    stack_kafka_port: int = Field(default=9092, ge=1, le=65535)
    stack_controller_port: int = Field(default=9093, ge=1, le=65535)
    stack_redis_port: int = Field(default=6379, ge=1, le=65535)
    stack_kafka_heap_mb: int = Field(default=512, ge=128)
    # The local Slurm cluster (`c4 stack up --slurm`): slurmctld's port, then one per slurmd.
    stack_slurm_port: int = Field(default=16817, ge=1, le=65000)
    stack_slurm_nodes: int = Field(default=4, ge=1, le=64)
    # The local Kubernetes API server (`c4 stack up --kube`): its secure port, and etcd's
    # client port (its peer port is the next one).
    stack_kube_port: int = Field(default=6443, ge=1, le=65535)
    stack_etcd_port: int = Field(default=2379, ge=1, le=65534)
    # A local Prometheus (c4.stack.prometheus): its web port.
    stack_prometheus_port: int = Field(default=9090, ge=1, le=65535)
    # A local Alertmanager (c4.stack.alertmanager): its web port (9093 is Kafka's controller).
    stack_alertmanager_port: int = Field(default=19093, ge=1, le=65535)

    def kafka_client_config(self) -> dict[str, Any]:
        """librdkafka configuration shared by every producer, consumer and admin client."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.kafka_bootstrap,
            "security.protocol": self.kafka_security_protocol,
        }
        if self.kafka_sasl_mechanism is not None:
            config["sasl.mechanism"] = self.kafka_sasl_mechanism
        if self.kafka_sasl_username is not None:
            config["sasl.username"] = self.kafka_sasl_username
        if self.kafka_sasl_password is not None:
            config["sasl.password"] = self.kafka_sasl_password.get_secret_value()
        if self.kafka_ssl_ca_location is not None:
            config["ssl.ca.location"] = str(self.kafka_ssl_ca_location)
        return config


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with every non-None explicit argument winning."""
    return Settings(**{key: value for key, value in overrides.items() if value is not None})
