"""The policy webhooks as one part of the extender process: the certificate, the webhook
configurations and the TLS server on its own port.

Start-up order: the certificate first (the TLS server cannot start without its files; while the
API server cannot be reached it is retried every `RETRY_S`), then the server, then the webhook
configurations (so the API server never calls a port nobody listens on). Every `CHECK_S` the
certificate is checked for renewal and the configurations for new workload kinds.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog

from extender.kube import Kube
from extender.metrics import Metrics
from extender.policy import gpushare
from extender.policy.certs import WebhookCerts
from extender.policy.registration import Endpoint, Registration
from extender.policy.webhook import Admission
from extender.ri.model import GVK
from extender.ri.registry import Registry
from extender.server import Limits, Reply, Route, Server
from extender.tls import ServerTLS, TLSFiles

log = structlog.get_logger("phalanx.policy")

RETRY_S = 2.0
CHECK_S = 60.0


@dataclass(frozen=True, slots=True)
class WebhookOptions:
    host: str = "0.0.0.0"
    port: int = 9443
    cert_dir: Path = Path("/tmp/phalanx-webhook")
    endpoint: Endpoint = field(default_factory=Endpoint)
    dns_names: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()
    gpu_share: bool = False  # also give share pods their phalanx.io/gpu-share slot (gpushare.py)


class PolicyService:
    def __init__(
        self,
        kube: Kube,
        admission: Admission,
        *,
        options: WebhookOptions,
        namespace: str,
        metrics: Metrics,
        kinds: Callable[[], Iterable[tuple[GVK, str]]],
        namespaces: Callable[[], frozenset[str] | None] = lambda: None,
    ) -> None:
        self.kube = kube
        self.admission = admission
        self.options = options
        self.metrics = metrics
        self.kinds = kinds
        self.namespaces = namespaces
        self.certs = WebhookCerts(kube, namespace, options.cert_dir, dns_names=options.dns_names, ips=options.ips)
        self.registration = Registration(kube, options.endpoint, namespace, gpu_share=options.gpu_share)
        self.server: Server | None = None
        self.started = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="policy-webhook", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving; returns once no upkeep round can write anything any more."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server.close_connections()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                bundle = self.certs.ensure()
                self.certs.install(bundle)
                break
            except Exception as e:  # API server unreachable: retried, never fatal
                log.warning("webhook certificate not ready", error=str(e))
                self._stopping.wait(RETRY_S)
        else:
            return
        self.server = self._server()
        serving = threading.Thread(target=self.server.serve_forever, name="policy-webhook-http", daemon=True)
        serving.start()
        log.info("policy webhooks listening", url=self.server.url)
        last = time.monotonic()
        while not self._stopping.is_set():
            self.upkeep(due=time.monotonic() - last >= CHECK_S)
            if time.monotonic() - last >= CHECK_S:
                last = time.monotonic()
            self._stopping.wait(RETRY_S if not self.started.is_set() else 5.0)

    def upkeep(self, *, due: bool, now: dt.datetime | None = None) -> None:
        """One round: read the Secret (renewing the certificate when it is due, or taking another
        replica's renewal), make the webhook configurations trust its CAs, then serve it. The
        Secret is read every round, just before the configurations are written, so a replica
        never writes back a CA list older than the one another replica served from. `due`:
        also compare the configurations with what the API server holds (someone may have
        edited them)."""
        try:
            bundle = self.certs.ensure(now)
            covered = self.namespaces()
            if self.registration.sync(bundle.ca, self.kinds(), covered, force=due or not self.started.is_set()):
                self.certs.install(bundle)
                self.started.set()
        except Exception as e:
            log.warning("policy webhook upkeep failed; retrying", error=str(e))

    def _server(self) -> Server:
        post = frozenset({"POST"})
        limits = Limits()
        routes = [
            Route(post, "/mutate", _handler(self.admission.mutate), max_body=limits.verb_body),
            Route(post, "/validate", _handler(self.admission.validate), max_body=limits.verb_body),
        ]
        if self.options.gpu_share:
            routes.append(Route(post, gpushare.PATH, _handler(gpushare.review), max_body=limits.verb_body))
        tls = ServerTLS(TLSFiles(self.certs.cert_file, self.certs.key_file))
        return Server(
            (self.options.host, self.options.port),
            verbs={},
            metrics=self.metrics,
            ready=lambda: True,
            routes=routes,
            tls=tls,
            admin=False,  # AdmissionReviews only: /metrics stays where networkPolicy.metricsFrom admits
        )


def _handler(review: Callable[[bytes], tuple[int, Any]]) -> Callable[[str, str, bytes], Reply]:
    def handle(method: str, path: str, body: bytes) -> Reply:
        return Reply.json(*review(body))

    return handle


def plural_kinds(paths: Mapping[GVK, str], registry: Registry) -> list[tuple[GVK, str]]:
    """(kind, resource plural) of the workload kinds watched whose Resource Interface is theirs
    (a root kind: its objects hold the pod templates), from their resource paths."""
    return [(g, path.rsplit("/", 1)[-1]) for g, path in paths.items() if registry.lookup(g.group, g.version, g.kind)]


def webhook_options(
    host: str, port: int, service: str | None, url: str | None, cert_dir: Path, *, gpu_share: bool = False
) -> WebhookOptions:
    """The command line's webhook flags as options; ValueError names the flag that is wrong."""
    if bool(service) == bool(url):
        raise ValueError("--webhook-port needs exactly one of --webhook-service and --webhook-url")
    if service:
        where, _, port_text = service.partition(":")
        namespace, _, name = where.partition("/")
        if not namespace or not name or (port_text and not port_text.isdigit()):
            raise ValueError(f"--webhook-service {service!r}: expected NAMESPACE/NAME[:PORT]")
        endpoint = Endpoint(service_namespace=namespace, service_name=name, service_port=int(port_text or 443))
        names = (f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local")
        return WebhookOptions(host, port, cert_dir, endpoint, dns_names=names, gpu_share=gpu_share)
    parsed = urlsplit(str(url))
    if parsed.scheme != "https" or not parsed.hostname:
        raise ValueError(f"--webhook-url {url!r}: expected https://HOST:PORT")
    try:
        ips: tuple[str, ...] = (str(ipaddress.ip_address(parsed.hostname)),)
        dns: tuple[str, ...] = ()
    except ValueError:
        ips, dns = (), (parsed.hostname,)
    return WebhookOptions(host, port, cert_dir, Endpoint(url=str(url)), dns_names=dns, ips=ips, gpu_share=gpu_share)
