"""The action worker's configuration file (YAML or JSON), validated once at start-up.

Policy (diagnosis class -> actions, thresholds, limits), retry, the restart launcher and the
alert receivers (signed webhooks, Alertmanagers) are data. Secrets are never in the file: a
receiver or launcher names the environment variable that holds its HMAC key (``secret_env``),
an Alertmanager's bearer token (``bearer_token_env``) or password (``password_env``), read at
load time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, Self

import orjson
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from actions import ActionsError
from schemas.messages import DiagnosisClass
from topology.ecmp import HASH_MODELS

NAME = r"^[A-Za-z0-9_.-]{1,64}$"
# A configuration file is a few KiB; these bound what a hostile one can make us read or walk.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_NODES = 100_000


class ConfigError(ActionsError):
    """The configuration file is unreadable or invalid; the message is one line."""

    def __init__(self, message: str) -> None:
        # Field names and values come from the file: a newline in a key stays escaped.
        super().__init__("".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message))


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RateLimit(_Frozen):
    """At most ``actions`` state-changing actions per ``window_s`` seconds."""

    actions: int = Field(ge=1)
    window_s: float = Field(gt=0)


class Backoff(_Frozen):
    """Tries and exponential backoff: ``backoff_s`` doubled each time, capped."""

    tries: int = Field(default=5, ge=1, le=100)
    backoff_s: float = Field(default=0.5, ge=0)
    max_backoff_s: float = Field(default=30.0, ge=0)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))


def _default_classes() -> dict[DiagnosisClass, tuple[str, ...]]:
    hard = ("isolate", "restart", "alert")
    classes: dict[DiagnosisClass, tuple[str, ...]] = {
        "noncomm_hang": hard,
        "node_down": hard,
        "gpu_fault": hard,
        "comm_hang": ("alert",),
        "noncomm_slow": ("alert",),
        "comm_slow": ("alert",),
        "link_down": ("reroute", "alert"),
        "link_degraded": ("reroute", "alert"),
        # A rank that never joined may be a script's fault as well as a node's: tell people.
        "ranks_missing": ("alert",),
        # A cable on another leaf than the topology says: people move it back (or fix the
        # topology); no reroute or isolation acts on a fabric map c4 knows is wrong.
        "miscabled": ("alert",),
    }
    return classes


class Policy(_Frozen):
    """Which actions a diagnosis class gets, and the limits that keep actions safe."""

    classes: dict[DiagnosisClass, tuple[str, ...]] = Field(default_factory=_default_classes)
    min_score: float = Field(default=0.5, ge=0, le=1)
    # Blast radius: more than this many suspect nodes of one job at once -> isolate nothing.
    blast_radius: int = Field(default=4, ge=1)
    suspect_window_s: float = Field(default=300.0, gt=0)
    job_rate: RateLimit = RateLimit(actions=4, window_s=3600)
    cluster_rate: RateLimit = RateLimit(actions=20, window_s=3600)
    max_restarts: int = Field(default=3, ge=0)

    @field_validator("classes")
    @classmethod
    def _unique_actions(
        cls, value: dict[DiagnosisClass, tuple[str, ...]]
    ) -> dict[DiagnosisClass, tuple[str, ...]]:
        for name, actions in value.items():
            if len(set(actions)) != len(actions):
                message = f"{name}: an action is listed twice"
                raise ValueError(message)
        return value


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Fields that only an Alertmanager receiver takes (a webhook is signed with secret_env instead).
_ALERTMANAGER_ONLY = ("resend_s", "bearer_token_env", "basic_auth")


class BasicAuth(_Frozen):
    """HTTP basic authentication; the password comes from an environment variable."""

    username: str = Field(min_length=1, pattern=r"^[^:\s]+$")
    password_env: str = Field(pattern=ENV_NAME)
    # Filled from password_env by load_config, never from the file.
    password: SecretStr | None = Field(default=None, exclude=True)


class Receiver(_Frozen):
    """Where alerts go, and the diagnoses it wants (empty filter lists match everything).

    ``kind: webhook`` (the default): the Alertmanager webhook payload, POSTed to ``url`` and
    signed with the key in ``secret_env``. ``kind: alertmanager``: ``url`` is the base URL of
    an Alertmanager; its alerts are POSTed to ``<url>/api/v2/alerts``, a firing one again every
    ``resend_s`` until its diagnosis resolves (see `actions.drivers.alertmanager.client`), with
    a bearer token (``bearer_token_env``) or basic authentication when configured.
    """

    name: str = Field(pattern=NAME)
    kind: Literal["webhook", "alertmanager"] = "webhook"
    url: str = Field(pattern=r"^https?://\S+$")
    secret_env: str | None = Field(default=None, pattern=ENV_NAME)
    classes: tuple[DiagnosisClass, ...] = ()
    jobs: tuple[str, ...] = Field(default=(), description="regular expressions, full match")
    states: tuple[Literal["firing", "resolved"], ...] = ("firing", "resolved")
    min_score: float = Field(default=0.0, ge=0, le=1)
    timeout_s: float = Field(default=5.0, gt=0)
    retry: Backoff = Backoff(tries=4)
    # Alertmanager only: re-post firing alerts this often (their endsAt is 4 periods ahead).
    resend_s: float = Field(default=60.0, ge=1, le=3600)
    bearer_token_env: str | None = Field(default=None, pattern=ENV_NAME)
    basic_auth: BasicAuth | None = None
    # Filled from secret_env (bearer_token_env) by load_config, never from the file.
    secret: SecretStr | None = Field(default=None, exclude=True)
    token: SecretStr | None = Field(default=None, exclude=True)

    @field_validator("jobs")
    @classmethod
    def _patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as error:
                message = f"bad regular expression {pattern!r}: {error}"
                raise ValueError(message) from None
        return value

    @model_validator(mode="after")
    def _kind_fields(self) -> Self:
        if self.kind == "webhook":
            extra = [name for name in _ALERTMANAGER_ONLY if name in self.model_fields_set]
            if extra:
                message = f"{extra[0]} is for kind alertmanager only"
                raise ValueError(message)
            return self
        if self.secret_env is not None:
            message = (
                "secret_env signs webhooks; an Alertmanager takes bearer_token_env or basic_auth"
            )
            raise ValueError(message)
        if self.bearer_token_env is not None and self.basic_auth is not None:
            message = "bearer_token_env and basic_auth exclude each other"
            raise ValueError(message)
        if "resolved" not in self.states:
            message = (
                "an alertmanager receiver needs state resolved:"
                " it ends the alerts that Alertmanager is sent again until then"
            )
            raise ValueError(message)
        return self

    def wants(self, cls_: str, job: str | None, state: str, score: float) -> bool:
        """Whether this receiver's filter matches a diagnosis.

        An Alertmanager takes every resolution of its classes and jobs whatever the score:
        the firing alert it was sent lives until it is told that it ended.
        """
        if self.classes and cls_ not in self.classes:
            return False
        if self.jobs and not any(re.fullmatch(p, job or "") for p in self.jobs):
            return False
        if self.kind == "alertmanager" and state == "resolved":
            return True
        return state in self.states and score >= self.min_score

    def secrets(self) -> list[SecretStr]:
        """The secrets resolved from the environment (to redact them from logs)."""
        password = self.basic_auth.password if self.basic_auth else None
        return [s for s in (self.secret, self.token, password) if s is not None]


class WebhookLauncher(_Frozen):
    """The job launcher's restart endpoint: POST of the new placement."""

    url: str = Field(pattern=r"^https?://\S+$")
    secret_env: str | None = Field(default=None, pattern=ENV_NAME)
    timeout_s: float = Field(default=10.0, gt=0)
    secret: SecretStr | None = Field(default=None, exclude=True)


class Launcher(_Frozen):
    """How a restart is handed to the job launcher: a webhook, a command, or both."""

    webhook: WebhookLauncher | None = None
    # argv; "{job}" and "{diagnosis}" are replaced; the placement (v1 job JSON) is on stdin.
    command: tuple[str, ...] | None = Field(default=None, min_length=1)
    command_timeout_s: float = Field(default=60.0, gt=0)


class RerouteSettings(_Frozen):
    """How the reroute action replans (see `planner.choice`)."""

    # incremental: only the flows that crossed the failed link move; best: a few more may
    # move when that lowers max_util.
    mode: Literal["incremental", "best"] = "incremental"
    # The switches' ECMP hash: each planned path then carries the UDP source port (``sport``)
    # that makes the hash choose its spine. None: paths name the spine only.
    hash: str | None = None
    seed: int = Field(default=0, ge=0)

    @field_validator("hash")
    @classmethod
    def _known_hash(cls, value: str | None) -> str | None:
        if value is not None and value not in HASH_MODELS:
            message = f"unknown hash model {value!r} (known: {', '.join(HASH_MODELS)})"
            raise ValueError(message)
        return value


# A Kubernetes qualified name (label key, taint key, condition type), with its optional prefix.
QUALIFIED = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


class Scheduler(_Frozen):
    """The scheduler the isolate and restart actions drive (none: the Redis state only).

    With ``slurm``: isolate drains the node (of a GPU or port too) with a reason starting
    ``c4:<diagnosis>``, restart requeues the job (keeping it off the failed nodes when
    ``exclude_failed_nodes``), release resumes only what c4 drained, and the spare pool
    mirrors Slurm's idle nodes every ``mirror_spares_s``.

    With ``kubernetes``: isolate cordons the node, taints it ``<taint_key>=<class>`` and sets
    the node condition ``condition_type`` False; restart deletes the job's pods (those with
    ``<job_label>=<job>``) on the failed nodes, so their controller places them again, and
    recreates a plain pod (no controller) off those nodes; release removes only c4's marks.
    """

    kind: Literal["none", "slurm", "kubernetes"] = "none"
    slurm_conf: str | None = Field(default=None, description="SLURM_CONF for scontrol and sinfo")
    exclude_failed_nodes: bool = True
    command_timeout_s: float = Field(default=30.0, gt=0)
    retry: Backoff = Backoff(tries=5)
    mirror_spares_s: float = Field(default=30.0, gt=0)
    # Kubernetes: the client's kubeconfig file (None: the pod's service account, in-cluster).
    kubeconfig: str | None = None
    # The namespace of the training pods (None: every namespace).
    namespace: str | None = Field(default=None, min_length=1, max_length=63)
    job_label: str = "c4.io/job"
    grace_period_s: int = Field(default=30, ge=0, le=3600)
    taint_key: str = "c4.io/fault"
    taint_effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    # Diagnosis classes whose taint evicts what runs on the node (NoExecute) at once.
    no_execute_classes: tuple[DiagnosisClass, ...] = ()
    condition_type: str = "C4Healthy"

    @field_validator("job_label", "taint_key", "condition_type")
    @classmethod
    def _qualified(cls, value: str) -> str:
        if not QUALIFIED.match(value) or len(value) > 316:
            message = f"{value!r} is not a Kubernetes qualified name (prefix/name)"
            raise ValueError(message)
        return value

    def effect_for(self, diagnosis_class: str) -> str:
        """The taint's effect for a diagnosis class."""
        return "NoExecute" if diagnosis_class in self.no_execute_classes else self.taint_effect


class WorkerConfig(_Frozen):
    """Everything ``c4 actions worker`` reads from its configuration file."""

    policy: Policy = Policy()
    retry: Backoff = Backoff()
    launcher: Launcher = Launcher()
    scheduler: Scheduler = Scheduler()
    receivers: tuple[Receiver, ...] = ()
    reroute: RerouteSettings = RerouteSettings()
    # A worker that stops renewing its claim on a diagnosis loses it after this long.
    claim_lease_s: float = Field(default=30.0, gt=0)
    # How long a handled diagnosis id is remembered for deduplication.
    dedup_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    external_url: str = ""

    @model_validator(mode="after")
    def _unique_receivers(self) -> Self:
        names = [receiver.name for receiver in self.receivers]
        for name in names:
            if names.count(name) > 1:
                message = f"receiver name {name!r} is used twice"
                raise ValueError(message)
        return self

    def check_actions(self, known: Iterable[str]) -> None:
        """Every action of the policy has an executor, or a `ConfigError` naming it."""
        names = sorted(set(known))
        for cls_, actions in self.policy.classes.items():
            for action in actions:
                if action not in names:
                    message = (
                        f"policy.classes.{cls_}: unknown action {action!r}"
                        f" (known: {', '.join(names)})"
                    )
                    raise ConfigError(message)


def parse_config(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> WorkerConfig:
    """Validate a parsed configuration and resolve its secrets; `ConfigError` on the first fault."""
    environment = os.environ if env is None else env
    try:
        config = WorkerConfig.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "config"
        message = f"{where}: {first['msg'].removeprefix('Value error, ')}"
        raise ConfigError(message) from None
    receivers = tuple(
        _with_secrets(f"receivers[{i}]", receiver, environment)
        for i, receiver in enumerate(config.receivers)
    )
    launcher = config.launcher
    if launcher.webhook is not None:
        secret = _secret("launcher.webhook", launcher.webhook.secret_env, environment)
        webhook = launcher.webhook.model_copy(update={"secret": secret})
        launcher = launcher.model_copy(update={"webhook": webhook})
    return config.model_copy(update={"receivers": receivers, "launcher": launcher})


def _with_secrets(where: str, receiver: Receiver, env: Mapping[str, str]) -> Receiver:
    update: dict[str, Any] = {
        "secret": _secret(where, receiver.secret_env, env),
        "token": _secret(where, receiver.bearer_token_env, env, "bearer_token_env"),
    }
    if receiver.basic_auth is not None:
        auth = receiver.basic_auth
        password = _secret(f"{where}.basic_auth", auth.password_env, env, "password_env")
        update["basic_auth"] = auth.model_copy(update={"password": password})
    return receiver.model_copy(update=update)


def _secret(
    where: str, name: str | None, env: Mapping[str, str], field: str = "secret_env"
) -> SecretStr | None:
    if name is None:
        return None
    value = env.get(name)
    if not value:
        message = f"{where}.{field}: environment variable {name} is not set"
        raise ConfigError(message)
    return SecretStr(value)


def _oversized(data: object) -> bool:
    """Whether a parsed file nests past `MAX_CONFIG_DEPTH` or holds (aliases counted each
    time they are used) over `MAX_CONFIG_NODES` values; walked without recursion."""
    stack: list[tuple[object, int]] = [(data, 1)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_NODES or depth > MAX_CONFIG_DEPTH:
            return True
        if isinstance(value, dict):
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value)
    return False


def load_config(path: str | Path | None, env: Mapping[str, str] | None = None) -> WorkerConfig:
    """Read a YAML (``.yaml``/``.yml``) or JSON file; None gives the defaults."""
    if path is None:
        return parse_config({}, env)
    source = Path(path)
    try:
        with source.open("rb") as stream:
            text = stream.read(MAX_CONFIG_BYTES + 1)  # bounded: a device never ends
    except OSError as error:
        message = f"cannot read {source}: {error.strerror or error}"
        raise ConfigError(message) from None
    if len(text) > MAX_CONFIG_BYTES or b"\0" in text:
        problem = "binary data (a NUL byte)" if b"\0" in text else "too large"
        message = f"{source}: {problem}, not a configuration file"
        raise ConfigError(message)
    kind = "YAML" if source.suffix in {".yaml", ".yml"} else "JSON"
    try:
        data = yaml.safe_load(text) if kind == "YAML" else orjson.loads(text)
    except (yaml.YAMLError, orjson.JSONDecodeError) as error:
        detail = " ".join(str(error).split())
        message = f"{source}: not valid {kind}: {detail}"
        raise ConfigError(message) from None
    except RecursionError:
        message = f"{source}: nested deeper than a configuration file is"
        raise ConfigError(message) from None
    if data is None:
        data = {}
    if _oversized(data):
        # YAML aliases make a small file a huge tree: walked at most this far, never more.
        message = (
            f"{source}: nested deeper than {MAX_CONFIG_DEPTH} or over {MAX_CONFIG_NODES} values"
        )
        raise ConfigError(message)
    if not isinstance(data, dict):
        message = f"{source}: expected a mapping at the top level"
        raise ConfigError(message)
    try:
        return parse_config(data, env)
    except ConfigError as error:
        message = f"{source}: {error}"
        raise ConfigError(message) from None
