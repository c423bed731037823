"""The webhook's certificate: what it names, when it is renewed, the CAs a renewal keeps, and a
handshake against it (the real TLS stack, not a look at the fields)."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
from pathlib import Path

from extender.policy.certs import Bundle, from_secret_data, issue, to_secret_data

NOW = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)


def test_a_certificate_names_its_hosts_and_is_renewed_with_a_third_of_its_life_left() -> None:
    bundle = issue(["phalanx-webhook.phalanx-system.svc"], ["127.0.0.1"], now=NOW, validity=dt.timedelta(days=90))
    assert bundle.covers(["phalanx-webhook.phalanx-system.svc"], ["127.0.0.1"])
    assert not bundle.covers(["other.svc"], [])
    assert not bundle.due(NOW + dt.timedelta(days=59))
    assert bundle.due(NOW + dt.timedelta(days=61))
    assert bundle.due(NOW + dt.timedelta(days=365))


def test_a_renewal_keeps_the_previous_ca_while_its_certificate_is_valid() -> None:
    old = issue([], ["127.0.0.1"], now=NOW, validity=dt.timedelta(days=90))
    new = issue([], ["127.0.0.1"], now=NOW + dt.timedelta(days=61), validity=dt.timedelta(days=90), previous=old)
    assert new.ca.count(b"BEGIN CERTIFICATE") == 2 and old.ca in new.ca
    later = issue([], ["127.0.0.1"], now=NOW + dt.timedelta(days=120), validity=dt.timedelta(days=90), previous=new)
    assert later.ca.count(b"BEGIN CERTIFICATE") == 2  # its own CA and the second: the first one's is gone
    assert old.ca not in later.ca and new.ca.split(b"-----END CERTIFICATE-----")[0] in later.ca
    last = issue([], ["127.0.0.1"], now=NOW + dt.timedelta(days=200), validity=dt.timedelta(days=90), previous=new)
    assert last.ca.count(b"BEGIN CERTIFICATE") == 1  # the previous certificate expired: nothing to trust it for


def test_secret_data_round_trips_and_garbage_reads_as_none() -> None:
    bundle = issue(["a.svc"], [], now=NOW)
    assert from_secret_data(to_secret_data(bundle)) == bundle
    assert from_secret_data(None) is None
    assert from_secret_data({"ca.crt": "!!", "tls.crt": "", "tls.key": ""}) is None
    assert from_secret_data({**to_secret_data(bundle), "tls.key": to_secret_data(bundle)["ca.crt"]}) is None


def _handshake(bundle: Bundle, tmp_path: Path, trusted: bytes) -> str:
    (tmp_path / "tls.crt").write_bytes(bundle.cert)
    (tmp_path / "tls.key").write_bytes(bundle.key)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def accept() -> None:
        conn, _ = listener.accept()
        try:
            with server.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    client = ssl.create_default_context(cadata=trusted.decode())
    try:
        with (
            socket.create_connection(listener.getsockname(), timeout=5) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            return tls.recv(2).decode()
    except ssl.SSLError as e:
        return f"refused: {e.reason}"
    finally:
        thread.join(timeout=5)
        listener.close()


def test_a_client_trusting_the_bundle_verifies_the_certificate_and_one_trusting_another_ca_does_not(
    tmp_path: Path,
) -> None:
    now = dt.datetime.now(dt.UTC)
    bundle = issue([], ["127.0.0.1"], now=now)
    assert _handshake(bundle, tmp_path, bundle.ca) == "ok"
    assert _handshake(bundle, tmp_path, issue([], ["127.0.0.1"], now=now).ca).startswith("refused")
    # After a renewal the bundle trusts the previous certificate too (a replica not yet switched).
    renewed = issue([], ["127.0.0.1"], now=now, previous=bundle)
    assert _handshake(bundle, tmp_path, renewed.ca) == "ok"
