# The controller, the worker runner, the demo model and the examples in one image (used by
# compose.yaml). /data and /output, the examples' dataset and output directories, belong to
# the image's user, so the examples run as they are (compose mounts volumes there).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY service ./service
COPY examples ./examples
# the install compiles the package's one C module (service/adapters/_lines.c); the
# compiler leaves with its layer
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir . \
    && apt-get purge -y --auto-remove gcc libc6-dev && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /app lifelong \
    && mkdir -p /data /output && chown lifelong /data /output

USER lifelong
EXPOSE 9100
ENTRYPOINT ["lifelong"]
CMD ["serve"]
