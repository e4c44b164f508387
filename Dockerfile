# The controller, the worker runner and the demo model in one image (used by compose.yaml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY service ./service
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --home-dir /app lifelong \
    && mkdir -p /data && chown lifelong /data

USER lifelong
EXPOSE 9100
ENTRYPOINT ["lifelong"]
CMD ["serve"]
