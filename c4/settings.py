"""One settings object for every process: env vars ``C4_*``, explicit arguments win."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from c4.deployment import (
    DEPLOYMENT_MAX_LENGTH,
    DEPLOYMENT_PATTERN,
    REDIS_KEY_PREFIX,
    DeploymentNames,
    checked_deployment,
)

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]


def _default_stack_dir() -> Path:
    return Path.home() / ".cache" / "c4"


class Settings(BaseSettings):
    """Connection and local-stack settings; env var ``C4_<FIELD>`` sets ``field``."""

    model_config = SettingsConfigDict(env_prefix="C4_", extra="forbid", frozen=True)

    # The deployment (e.g. "staging"): every name it owns derives from it (c4/deployment.py).
    deployment: str = Field(
        default="", pattern=DEPLOYMENT_PATTERN, max_length=DEPLOYMENT_MAX_LENGTH
    )

    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_security_protocol: SecurityProtocol = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: Path | None = None

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_password: SecretStr | None = None
    # Put before every Redis key of the cluster state (tests use a unique one); unless set,
    # the deployment's ("c4", or "<deployment>.c4").
    redis_key_prefix: str = Field(
        default=REDIS_KEY_PREFIX, pattern=r"^[A-Za-z0-9._:{}-]+$", max_length=100
    )

    # Put before every topic name, e.g. "staging." (tests use a unique one); unless set, the
    # deployment's ("", or "<deployment>.").
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

    @field_validator("deployment")
    @classmethod
    def _deployment_not_reserved(cls, deployment: str) -> str:
        return checked_deployment(deployment)

    @model_validator(mode="after")
    def _derive_owned_prefixes(self) -> Settings:
        """The prefixes not set (not even empty): the deployment's."""
        names = self.names
        # Set once, while the frozen object is being built: nothing has seen it yet.
        if "topic_prefix" not in self.model_fields_set:
            object.__setattr__(self, "topic_prefix", names.topic_prefix)
        if "redis_key_prefix" not in self.model_fields_set:
            object.__setattr__(self, "redis_key_prefix", names.redis_key_prefix)
        return self

    @property
    def names(self) -> DeploymentNames:
        """The names the deployment owns: app id, consumer groups (see c4/deployment.py)."""
        return DeploymentNames(self.deployment)

    @property
    def deployment_dir(self) -> Path:
        """The deployment's folder under ``stack_dir`` (Faust state, agent spool)."""
        return self.names.data_dir(self.stack_dir)

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
