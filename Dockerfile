# QMQ's container image: `twistd -n qmq` as an unprivileged user, its data
# in the volume /var/lib/qmq (docs/running.rst, "Container").
#
#   docker build -t qmq .
#   printf '%s\n' 's3cret' | docker run --rm -i --entrypoint qmq-passwd qmq   # a hash
#   docker run -d --name qmq -p 61613:61613 -p 15674:15674 -p 5672:5672 \
#       -v qmq-data:/var/lib/qmq -e QMQ_ADMIN_PASSWORD_HASH='$scrypt$...' qmq
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The user the broker runs as; it owns the data directory and nothing else.
RUN groupadd --system --gid 10001 qmq \
    && useradd --system --uid 10001 --gid qmq --home-dir /var/lib/qmq --no-create-home \
        --shell /usr/sbin/nologin qmq \
    && mkdir -p /var/lib/qmq /etc/qmq \
    && chown qmq:qmq /var/lib/qmq

WORKDIR /src
COPY setup.py pyproject.toml README.rst ./
COPY qmq ./qmq
COPY twisted ./twisted
RUN pip install . \
    && cd / && rm -rf /src

COPY docker/qmq.toml /etc/qmq/qmq.toml

USER qmq
WORKDIR /var/lib/qmq
VOLUME ["/var/lib/qmq"]
# STOMP, HTTP (WebSocket, SockJS, API, console, metrics), AMQP 0-9-1.
EXPOSE 61613 15674 5672

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:15674/api/v1/health/live', timeout=4)"]

# The entry point adds the administrator the environment names, checks the
# configuration and becomes `twistd -n --pidfile= qmq --config ...` (PID 1,
# so SIGTERM from `docker stop` is a graceful shutdown).  Arguments after
# the image name go to twistd qmq (--listen, ...).
ENTRYPOINT ["python", "-m", "qmq.container"]
CMD []
STOPSIGNAL SIGTERM
