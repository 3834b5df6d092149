"""http(s) media URLs: off unless the server names the hosts it may fetch from (no SSRF).

A host must be on the allow-list (exact, or `*.example.com` for its subdomains, or `*` for any); every
address it resolves to must be public unless private addresses are allowed too; the connection goes to
the address that was checked (no second DNS lookup, so no rebinding); redirects are not followed; the
body is read with a timeout and never past the byte limit.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from vllm_sr_runtime.errors import InvalidRequest, RequestTooLarge


@dataclass(frozen=True)
class UrlPolicy:
    allow_hosts: tuple[str, ...] = ()  # empty: http(s) URLs are refused
    allow_private: bool = False  # loopback, private, link-local and other non-global addresses
    timeout_s: float = 10.0

    @property
    def enabled(self) -> bool:
        return bool(self.allow_hosts)

    def allows_host(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        for pattern in self.allow_hosts:
            pattern = pattern.lower().rstrip(".")
            if pattern == "*" or host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:])):
                return True
        return False

    def card(self) -> dict:
        return {"http_urls": list(self.allow_hosts) if self.enabled else "off", "http_private_addresses": self.allow_private}


def fetch(url: str, policy: UrlPolicy, allowed_mime, max_bytes: int, what: str) -> tuple[str, bytes]:
    """(mime, body) of an http(s) URL under `policy`."""
    if not policy.enabled:
        raise InvalidRequest(f"{what}: http(s) URLs are disabled on this server; send a base64 data URL")
    parts = urlsplit(url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidRequest(f"{what}: not an http(s) URL")
    if not policy.allows_host(host):
        raise InvalidRequest(f"{what}: host {host} is not on this server's media URL allow-list")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = _vetted_address(host, port, policy, what)
    connection_cls = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
    connection = connection_cls(host, port, address, policy.timeout_s)
    try:
        connection.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers={"Accept": ", ".join(allowed_mime)})
        response = connection.getresponse()
        if 300 <= response.status < 400:
            raise InvalidRequest(f"{what}: {url} redirects (HTTP {response.status}); redirects are not followed")
        if response.status != 200:
            raise InvalidRequest(f"{what}: fetching {url} returned HTTP {response.status}")
        mime = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if mime not in allowed_mime:
            raise InvalidRequest(f"{what}: {url} is {mime or 'untyped'}, not one of {', '.join(allowed_mime)}")
        declared = response.getheader("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            raise RequestTooLarge(f"{what}: {url} is {declared} bytes, over {max_bytes}")
        body = response.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise RequestTooLarge(f"{what}: {url} is over {max_bytes} bytes")
        return mime, body
    except (socket.timeout, TimeoutError):
        raise InvalidRequest(f"{what}: fetching {url} timed out after {policy.timeout_s:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise InvalidRequest(f"{what}: cannot fetch {url} ({type(exc).__name__}: {exc})") from None
    finally:
        connection.close()


def _vetted_address(host: str, port: int, policy: UrlPolicy, what: str) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise InvalidRequest(f"{what}: cannot resolve {host} ({exc})") from None
    addresses = sorted({info[4][0] for info in infos})
    if not policy.allow_private:
        blocked = [a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_global]
        if blocked:
            raise InvalidRequest(f"{what}: {host} resolves to a loopback or private address ({blocked[0]}); not fetched")
    return addresses[0]


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)
