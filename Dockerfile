FROM python:3.11-slim
WORKDIR /opt/c4
COPY pyproject.toml README.md MANIFEST.in c4_autoinstrument.py ./
COPY build_backend build_backend
COPY c4 c4
COPY schemas schemas
COPY producers producers
COPY streams streams
COPY planner planner
COPY actions actions
COPY topology topology
COPY simulator simulator
RUN pip install --no-cache-dir . && mkdir -p /var/lib/c4 && chown nobody /var/lib/c4
# Faust keeps its tables' data folder in the working directory: a writable one.
WORKDIR /var/lib/c4
USER nobody
ENTRYPOINT []
CMD ["c4", "--help"]
