"""The detection app for Faust's own command line: ``faust -A c4.faust_app worker``.

Built by `c4.streams_wiring` exactly as ``c4 streams worker`` builds it: the ``C4_*``
settings (brokers, SASL/TLS credentials, topic prefix, partitions, state folder) and the
``C4_STREAMS_*`` options (app id, topology, parameters, clock rate, snapshot interval,
session timeout, metrics port; see `c4.streams_wiring.options_from_env`). A setting that
does not work (wrong credentials, a bad file) stops it with one line, as it stops the
``c4`` command.
"""

from __future__ import annotations

import os
import sys

from pydantic import ValidationError

from c4 import C4Error
from c4.cli import one_line, setting_problem
from c4.security import install_secret_redaction, settings_secrets
from c4.settings import load_settings
from c4.streams_wiring import build_streams_worker, options_from_env

try:
    _settings = load_settings()
    install_secret_redaction(settings_secrets(_settings))
    _options = options_from_env(os.environ)
    worker = build_streams_worker(_settings, _options)
except ValidationError as error:
    print(f"c4 faust app: {setting_problem(error)}", file=sys.stderr)
    raise SystemExit(2) from None
except (C4Error, OSError) as error:
    print(f"c4 faust app: {one_line(str(error))}", file=sys.stderr)
    raise SystemExit(int(getattr(error, "exit_code", 1))) from None
app = worker.app


async def _serve_metrics() -> None:
    """Prometheus /metrics on ``C4_METRICS_ADDRESS`` (127.0.0.1), once the worker runs (not
    on import)."""
    if _options.metrics_port:
        worker.metrics.serve(_options.metrics_port, _settings.metrics_address)


app.task(_serve_metrics)
