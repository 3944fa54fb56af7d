"""The official Kubernetes client under `client.Api`: four plain JSON requests.

The client's typed models are not used: c4 reads and writes a few fields of nodes and pods,
and a plain dict keeps a recreated pod exactly as the server gave it (no field the client's
models do not know is dropped). Authentication, TLS and the kubeconfig or in-cluster
service account are the client's.
"""

from __future__ import annotations

from typing import Any

import orjson
from kubernetes import client, config  # the only module that imports the client
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from actions.drivers.kubernetes.client import ApiStatus, KubeError

_JSON = "application/json"


class ClientApi:
    """Requests through the official client's ApiClient (its auth, TLS and pool)."""

    def __init__(self, kubeconfig: str | None, timeout_s: float) -> None:
        try:
            if kubeconfig is None:
                configuration = client.Configuration()
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                self._client = client.ApiClient(configuration)
            else:
                self._client = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        except (ConfigException, OSError, ValueError) as error:
            where = kubeconfig or "the pod's service account (in-cluster)"
            message = f"no Kubernetes client configuration from {where}: {error}"
            raise KubeError(message, retryable=False) from None
        self._timeout_s = timeout_s

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()  # type: ignore[no-untyped-call]

    def get(self, path: str) -> dict[str, Any]:
        return self._request("GET", path)

    def patch(self, path: str, body: Any, content_type: str) -> dict[str, Any]:
        return self._request("PATCH", path, body, content_type)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", path, body, _JSON)

    def delete(self, path: str, grace_period_s: int) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace_period_s}
        self._request("DELETE", path, body, _JSON)

    def _request(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> dict[str, Any]:
        headers = {"Accept": _JSON}
        if content_type is not None:
            headers["Content-Type"] = content_type
        try:
            serialized = self._client.param_serialize(
                method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
            )
            answer = self._client.call_api(
                serialized[0],
                serialized[1],
                serialized[2],
                serialized[3],
                _request_timeout=self._timeout_s,
            )
            status = int(answer.status)
            data = answer.read()  # type: ignore[no-untyped-call]
        except client.ApiException as error:
            status, data = int(error.status or 0), (error.body or b"")
        except (HTTPError, OSError) as error:
            message = f"{method} {path}: the API server did not answer ({error})"
            raise KubeError(message, retryable=True) from None
        if status >= 400 or status == 0:
            message = f"{method} {path}: {status} {_said(data)}"
            raise ApiStatus(message, status)
        if not data:
            return {}
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            message = f"{method} {path}: the API server's answer is not JSON"
            raise KubeError(message, retryable=True) from None
        return parsed if isinstance(parsed, dict) else {}


def _said(data: bytes | str) -> str:
    """The message of the API server's Status answer, or the start of its body."""
    try:
        status = orjson.loads(data)
    except orjson.JSONDecodeError:
        return str(data)[:200]
    if isinstance(status, dict) and "message" in status:
        return str(status["message"])[:300]
    return str(data)[:200]
