FROM python:3.11-slim
WORKDIR /opt/c4
COPY pyproject.toml README.md ./
COPY c4 c4
COPY schemas schemas
COPY producers producers
COPY streams streams
COPY actions actions
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT []
CMD ["c4", "--help"]
