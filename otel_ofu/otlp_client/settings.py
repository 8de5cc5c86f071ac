"""Where and how an OTLP client sends: the options given, else the standard variables (one reading for the
producer's exporter and the collector's downstream alike).

Each setting is read as the OpenTelemetry Python SDK's OTLP metric exporters read it, an option first, then the
metrics-specific variable (``OTEL_EXPORTER_OTLP_METRICS_*``), then the generic one (``OTEL_EXPORTER_OTLP_*``);
an empty variable counts as unset. Endpoint: gRPC takes ``OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT`` as a URL or
``HOST:PORT`` (default ``http://localhost:4317``); OTLP/HTTP uses the metrics endpoint as is and appends
``/v1/metrics`` to the generic one (default ``http://localhost:4318/v1/metrics``). TLS: an ``https`` URL is
TLS and an ``http`` one plain text; gRPC to a ``HOST:PORT`` is TLS unless ``..._INSECURE=true`` (the OTLP
specification's rule). ``..._CERTIFICATE`` is the CA to trust, ``..._CLIENT_KEY`` and
``..._CLIENT_CERTIFICATE`` the client's for mutual TLS. ``..._HEADERS`` (``key=value,...``, URL-encoded),
``..._COMPRESSION`` (``gzip``, ``deflate`` or ``none``) and ``..._TIMEOUT`` (seconds per export, retries
included, as the Python SDK reads it; default 10). A value the client cannot honour is an
``ExporterConfigError`` saying which variable and why, raised when the settings are resolved, before anything
runs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from urllib.parse import urlparse

import attrs
from opentelemetry.util.re import parse_env_headers

GRPC = "grpc"
HTTP_PROTOBUF = "http/protobuf"
PROTOCOLS = (GRPC, HTTP_PROTOBUF)
# The producer's option that picks the protocol, named in the errors that suggest the other protocol (the
# collector names its own: ``OtlpSettings.protocol_option``).
PROTOCOL_OPTION = "--protocol"
PROTOCOL_VARIABLE = "OTEL_EXPORTER_OTLP_PROTOCOL"
HTTP_METRICS_PATH = "/v1/metrics"
# The OTLP signals a client sends: metrics (every output), logs (the collector's flag events).
METRICS = "metrics"
LOGS = "logs"
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318" + HTTP_METRICS_PATH
DEFAULT_TIMEOUT_S = 10.0
COMPRESSIONS = ("gzip", "deflate")


class ExporterConfigError(ValueError):
    """An OTLP client setting that cannot be honoured; the message says which and why."""


def _variable(environ: Mapping[str, str], name: str) -> tuple[str, str] | tuple[None, None]:
    """(variable, value) of ``OTEL_EXPORTER_OTLP_METRICS_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``."""
    for variable in (f"OTEL_EXPORTER_OTLP_METRICS_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = environ.get(variable, "").strip()
        if value:
            return variable, value
    return None, None


def resolve_protocol(
    explicit: str | None = None, environ: Mapping[str, str] | None = None, option: str = PROTOCOL_OPTION
) -> str:
    """The option (``--protocol``), else ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL``, else
    ``OTEL_EXPORTER_OTLP_PROTOCOL``, else grpc."""
    env = os.environ if environ is None else environ
    variable, value = _variable(env, "PROTOCOL")
    for candidate, source in ((explicit, option), (value, variable)):
        if candidate:
            chosen = candidate.strip().lower()
            if chosen not in PROTOCOLS:
                raise ExporterConfigError(
                    f"{source}={candidate!r} is not supported: use {' or '.join(PROTOCOLS)}"
                    " (otel-ofu sends OTLP protobuf, not http/json)"
                )
            return chosen
    return GRPC


def check_env_endpoint(environ: Mapping[str, str] | None = None) -> None:
    """ExporterConfigError when the endpoint variable the exporter would use is not a URL (or HOST:PORT),
    so a typo stops the command at once instead of failing every export in the background."""
    from argparse import ArgumentTypeError

    from otel_ofu.cli_support import url_or_host_port

    variable, value = _variable(os.environ if environ is None else environ, "ENDPOINT")
    if variable is None or value is None:
        return
    try:
        url_or_host_port(value)
    except ArgumentTypeError as error:
        raise ExporterConfigError(f"{variable}: {error}") from None


def configured_endpoint(endpoint: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """Where a downstream is configured, as given: ``endpoint`` (an option), else the standard
    ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT``; None when none is.

    For a collector, None means no downstream at all, never a guessed localhost (that would be itself);
    ``OtlpSettings.resolve`` turns a configured endpoint into the URL actually used.
    """
    if endpoint and endpoint.strip():
        return endpoint.strip()
    return _variable(os.environ if environ is None else environ, "ENDPOINT")[1]


def http_metrics_url(endpoint: str) -> str:
    """A base URL (like ``OTEL_EXPORTER_OTLP_ENDPOINT``) gets ``/v1/metrics``; a URL with a path is kept."""
    if "://" not in endpoint:
        endpoint = "http://" + endpoint  # HOST:PORT: plain HTTP, as for gRPC's http:// default
    parsed = urlparse(endpoint)
    if parsed.path in ("", "/"):
        return endpoint.rstrip("/") + HTTP_METRICS_PATH
    return endpoint


@attrs.frozen
class OtlpSettings:
    """One client's resolved settings (see the module docstring for where each comes from)."""

    protocol: str
    # gRPC: the URL or HOST:PORT as configured; OTLP/HTTP: the full metrics URL.
    endpoint: str
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    compression: str | None = None
    tls: bool = False
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None
    # The command's option that picks the protocol, named where a failure suggests the other protocol.
    protocol_option: str = PROTOCOL_OPTION
    signal: str = METRICS  # which OTLP service the requests are for (``endpoint`` is that signal's for HTTP)

    @property
    def grpc_target(self) -> str:
        """``HOST:PORT`` for the gRPC channel."""
        if "://" in self.endpoint:
            return urlparse(self.endpoint).netloc or self.endpoint.split("://", 1)[1].rstrip("/")
        return self.endpoint

    @classmethod
    def resolve(
        cls,
        *,
        protocol: str | None = None,
        endpoint: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        environ: Mapping[str, str] | None = None,
        protocol_option: str = PROTOCOL_OPTION,
    ) -> OtlpSettings:
        env = os.environ if environ is None else environ
        chosen = resolve_protocol(protocol, env, protocol_option)
        if endpoint is None:
            check_env_endpoint(env)
        url = _endpoint(chosen, endpoint, env)
        return cls(
            protocol=chosen,
            endpoint=url,
            headers=_headers(headers, env),
            timeout_s=_timeout(timeout_s, env),
            compression=_compression(env),
            tls=_tls(chosen, url, env),
            certificate=_variable(env, "CERTIFICATE")[1],
            client_key=_variable(env, "CLIENT_KEY")[1],
            client_certificate=_variable(env, "CLIENT_CERTIFICATE")[1],
            protocol_option=protocol_option,
        )


def _endpoint(protocol: str, explicit: str | None, env: Mapping[str, str]) -> str:
    if explicit:
        return http_metrics_url(explicit) if protocol == HTTP_PROTOBUF else explicit.strip()
    metrics = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "").strip()
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if protocol == GRPC:
        return metrics or base or DEFAULT_GRPC_ENDPOINT
    if metrics:  # the signal's own endpoint is used as is, per the specification
        return metrics if "://" in metrics else "http://" + metrics
    if base:  # the base gets the signal's path, even when it has a path of its own
        return (base if "://" in base else "http://" + base).rstrip("/") + HTTP_METRICS_PATH
    return DEFAULT_HTTP_ENDPOINT


def _headers(explicit: Mapping[str, str] | None, env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    # gRPC metadata keys must be lower case; HTTP header names are case-insensitive.
    _, text = _variable(env, "HEADERS")
    merged = dict(parse_env_headers(text or "", liberal=True))
    merged.update({key.strip().lower(): value for key, value in (explicit or {}).items()})
    return tuple(merged.items())


def _timeout(explicit: float | None, env: Mapping[str, str]) -> float:
    if explicit is not None:
        value, source = float(explicit), "the export timeout"
    else:
        variable, text = _variable(env, "TIMEOUT")
        if variable is None or text is None:
            return DEFAULT_TIMEOUT_S
        try:
            value, source = float(text), variable
        except ValueError:
            raise ExporterConfigError(f"{variable}={text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ExporterConfigError(f"{source} must be a positive number of seconds, got {value!r}")
    return value


def _compression(env: Mapping[str, str]) -> str | None:
    variable, text = _variable(env, "COMPRESSION")
    if variable is None or text is None or text.lower() == "none":
        return None
    if text.lower() not in COMPRESSIONS:
        raise ExporterConfigError(f"{variable}={text!r} is not supported: use gzip, deflate or none")
    return text.lower()


def _tls(protocol: str, endpoint: str, env: Mapping[str, str]) -> bool:
    scheme = urlparse(endpoint).scheme.lower() if "://" in endpoint else ""
    if scheme in ("http", "https") or protocol == HTTP_PROTOBUF:
        return scheme == "https"
    # ..._INSECURE applies only to a gRPC endpoint without a scheme (the specification's rule).
    _, insecure = _variable(env, "INSECURE")
    return insecure is None or insecure.lower() != "true"
