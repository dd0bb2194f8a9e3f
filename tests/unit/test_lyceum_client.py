"""The Lyceum API client against the emulator (no VMs booted), and against a scripted loopback server
for answers the emulator never gives: shapes, retries (Retry-After, backoff, what is never repeated),
the create that adopts its lost answer's VM, pooled connections, errors, secrets."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from glue.cloud.lyceum.api import (
    LyceumClient,
    LyceumError,
    LyceumNotFound,
    RetryPolicy,
    api_key_from_env,
    api_url_from_env,
)
from glue.errors import GlueError
from tests.lyceum_emulator import Emulator

FAST = RetryPolicy(attempts=4, base_s=0.01, max_s=0.05, deadline_s=5)
SECRET = "lk_secret_0123456789abcdefSECRET"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvTfQeuTCMyBZ1R3j2pWLZ6d5xUuQ0Q3uF1x4uQ2zVr test"


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emu", boot_vms=False, pending_s=0.1) as emulator:
        yield emulator


@pytest.fixture
def client(emu: Emulator) -> LyceumClient:
    return LyceumClient(emu.api_key, emu.url, retry=FAST)


def creates(emu: Emulator) -> int:
    return sum(1 for m, p, _ in emu.requests if m == "POST" and p.endswith("/vms/create"))


def test_create_poll_list_delete(client: LyceumClient, emu: Emulator) -> None:
    vm = client.create_vm({"hardware_profile": "a100", "user_public_key": KEY, "name": "c1",
                           "instance_specs": {"gpu_count": 2, "disk": 200}})
    assert vm["status"] == "pending" and vm["ip_address"] is None and vm["vm_id"].startswith("vm-")
    deadline = time.monotonic() + 5
    while (status := client.vm_status(vm["vm_id"]))["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    host, port = status["ip_address"].split(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert status["gpu_count"] == 2 and status["instance_specs"]["disk"] == 200
    [listed] = client.list_vms()
    assert listed["vm_id"] == vm["vm_id"] and listed["status"] == "running" and listed["name"] == "c1"
    client.delete_vm(vm["vm_id"])
    assert client.vm_status(vm["vm_id"])["status"] == "terminated"
    # The live list keeps terminated VMs unless asked not to; the client asks.
    assert [v["status"] for v in client.request("GET", "/vms/list")["vms"]] == ["terminated"]
    assert client.list_vms() == []
    client.delete_vm("vm-doesnotexist")  # already gone: not an error


def test_availability_in_both_documented_shapes(client: LyceumClient, emu: Emulator) -> None:
    emu.set_capacity("h100", None)
    profiles = {v["hardware_profile"]: v for v in client.availability()}  # the guide's shape
    assert set(profiles) == {"cpu", "a100", "h100"} and profiles["h100"]["available"] == 0
    assert {k for k in profiles["a100"]} == {"hardware_profile", "available", "total", "gpu_type", "vcpu", "memory_gb"}
    emu.availability_shape = "variants"  # the API reference's shape
    variants = {v["hardware_profile"]: v for v in client.availability()}
    assert set(variants) == {"cpu", "a100"} and variants["a100"]["available_gpus_per_instance"] == [1, 2, 4, 8]


def test_401_shows_detail_and_never_the_key(emu: Emulator) -> None:
    bad = "lk_wrong_key_0123456789abcdef"
    with pytest.raises(LyceumError) as err:
        LyceumClient(bad, emu.url, retry=FAST).list_vms()
    msg = str(err.value)
    assert err.value.status == 401 and "Invalid or expired API key" in msg and "LYCEUM_API_KEY" in msg
    assert bad not in msg and bad not in repr(LyceumClient(bad, emu.url))
    assert "\n" not in msg


def test_403_inactive_key(client: LyceumClient, emu: Emulator) -> None:
    emu.inactive_keys.add(emu.api_key)
    with pytest.raises(LyceumError, match=r"403: API key is inactive"):
        client.list_vms()


def test_404_unknown_vm(client: LyceumClient) -> None:
    with pytest.raises(LyceumNotFound, match=r"404 on GET /vms/vm-nope/status: VM vm-nope not found"):
        client.vm_status("vm-nope")


def test_422_lists_the_fields(client: LyceumClient, emu: Emulator) -> None:
    with pytest.raises(LyceumError) as err:
        client.create_vm({"hardware_profile": 7, "name": "x", "instance_specs": {"gpu_count": -1}})
    assert err.value.status == 422
    assert str(err.value) == (
        "Lyceum rejected the request as malformed (422 on POST /vms/create: user_public_key: Field required; "
        "hardware_profile: Input should be a valid string; instance_specs.gpu_count: Input should be a valid "
        "non-negative integer)")
    assert creates(emu) == 1  # a 4xx is never retried


def test_5xx_and_429_are_retried(client: LyceumClient, emu: Emulator) -> None:
    emu.inject(503, count=2, path="/vms/list")
    emu.inject(429, count=1, path="/vms/list", retry_after=0.2)
    start = time.monotonic()
    assert client.list_vms() == []
    assert time.monotonic() - start >= 0.2  # Retry-After honoured
    assert [s for m, p, s in emu.requests if p.endswith("/vms/list")] == [503, 503, 429, 200]


def test_retries_give_up_with_one_line(client: LyceumClient, emu: Emulator) -> None:
    emu.inject(502, count=10, path="/vms/availability", detail="bad gateway upstream")
    with pytest.raises(LyceumError) as err:
        client.availability()
    assert str(err.value) == ("Lyceum API 502 on GET /vms/availability: bad gateway upstream "
                              "(gave up after 4 attempts)")


def test_create_retried_after_a_lost_answer_makes_one_vm(client: LyceumClient, emu: Emulator) -> None:
    emu.inject(502, count=1, path="/vms/create", after_processing=True)
    vm = client.create_vm({"hardware_profile": "cpu", "user_public_key": KEY, "name": "once"})
    assert len(emu.vms) == 1 and vm["vm_id"] in emu.vms
    emu.inject(503, count=1, path="/vms/create")  # not processed: retried, still one VM each
    client.create_vm({"hardware_profile": "cpu", "user_public_key": KEY, "name": "twice"})
    assert sorted(v.name or "" for v in emu.vms.values()) == ["once", "twice"]


def test_unreachable_api_is_one_line() -> None:
    client = LyceumClient("lk_0123456789abcdef", "http://127.0.0.1:9/api/v2/external",
                          retry=RetryPolicy(attempts=2, base_s=0.01, max_s=0.01))
    with pytest.raises(LyceumError, match=r"^cannot reach the Lyceum API at http://127.0.0.1:9/api/v2/external "
                                          r"\(.*\) \(gave up after 2 attempts\)$"):
        client.list_vms()


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (None, "LYCEUM_API_KEY is not set"),
        ("", "LYCEUM_API_KEY is not set"),
        ("   ", "LYCEUM_API_KEY is not set"),
        ("not-a-key", "LYCEUM_API_KEY is malformed"),
        ("lk_has a space inside", "LYCEUM_API_KEY is malformed"),
        ('"lk_0123456789abcdef"', "LYCEUM_API_KEY is malformed"),
    ],
)
def test_bad_api_keys_are_one_clear_line(value: str | None, needle: str) -> None:
    env = {} if value is None else {"LYCEUM_API_KEY": value}
    with pytest.raises(GlueError) as err:
        api_key_from_env(env)
    assert str(err.value).startswith(needle) and "\n" not in str(err.value)
    if value and value.strip():
        assert value.strip() not in str(err.value)


def test_good_api_keys() -> None:
    assert api_key_from_env({"LYCEUM_API_KEY": " lk_0123456789abcdef\n"}) == "lk_0123456789abcdef"
    assert api_key_from_env({"LYCEUM_API_KEY": "eyJhbGci.eyJzdWIi.c2ln"}) == "eyJhbGci.eyJzdWIi.c2ln"


def test_api_url_rules() -> None:
    assert api_url_from_env({}) == "https://api.lyceum.technology/api/v2/external"
    assert api_url_from_env({"LYCEUM_API_URL": "http://127.0.0.1:8/x/"}) == "http://127.0.0.1:8/x"
    with pytest.raises(GlueError, match="only travels over https"):
        api_url_from_env({"LYCEUM_API_URL": "http://api.example.com/v2"})
    with pytest.raises(GlueError, match="is not an http"):
        api_url_from_env({"LYCEUM_API_URL": "ftp://x"})


# -- retries: Retry-After, backoff, what is never repeated -------------------------------------
def test_retry_after_is_honoured(client: LyceumClient, emu: Emulator) -> None:
    """FAST backs off at most 0.05 s: only the answer's Retry-After explains a wait of a second."""
    emu.inject(429, count=1, path="/vms/list", retry_after=1)
    emu.inject(503, count=1, path="/vms/vm-", method="DELETE", retry_after=0.5)
    start = time.monotonic()
    assert client.list_vms() == []
    assert 1.0 <= time.monotonic() - start < 3.0
    start = time.monotonic()
    client.delete_vm("vm-gone")  # 503 (Retry-After 0.5), then 404: already gone
    assert 0.5 <= time.monotonic() - start < 2.5
    assert [s for m, p, s in emu.requests] == [429, 200, 503, 404]


def test_retry_after_past_the_deadline_gives_up_at_once(emu: Emulator) -> None:
    client = LyceumClient(emu.api_key, emu.url, retry=RetryPolicy(attempts=4, base_s=0.01, max_s=0.05, deadline_s=2))
    emu.inject(429, count=1, path="/vms/list", retry_after=30)
    start = time.monotonic()
    with pytest.raises(LyceumError) as err:
        client.list_vms()
    assert time.monotonic() - start < 1.0
    assert str(err.value) == ("Lyceum API 429 on GET /vms/list: emulated upstream failure (gave up after 1 attempt: "
                              "Lyceum asked to retry after 30s, past the 2s retry deadline)")
    assert len(emu.requests) == 1


def test_backoff_grows_and_is_bounded(emu: Emulator) -> None:
    """Five retries wait [0.05, 0.1] + 4 x [0.1, 0.2] s (0.45 to 0.9 s); uncapped by max_s they would wait
    0.1 + 0.2 + 0.4 + 0.8 + 1.6 s, halved at the least: over 1.5 s."""
    client = LyceumClient(emu.api_key, emu.url, retry=RetryPolicy(attempts=6, base_s=0.1, max_s=0.2, deadline_s=10))
    emu.inject(500, count=5, path="/vms/availability")
    start = time.monotonic()
    assert client.availability()
    assert 0.45 <= time.monotonic() - start < 1.4
    assert [s for m, p, s in emu.requests] == [500] * 5 + [200]


def test_a_lost_answer_to_a_get_is_retried(client: LyceumClient, emu: Emulator) -> None:
    emu.inject(0, count=2, path="/vms/list", drop=True)
    assert client.list_vms() == []
    assert [s for m, p, s in emu.requests] == [0, 0, 200]


def test_a_post_is_never_repeated_by_the_transport(client: LyceumClient, emu: Emulator) -> None:
    body = {"hardware_profile": "cpu", "user_public_key": KEY, "name": "p"}
    emu.inject(503, count=1, path="/vms/create", after_processing=True)
    with pytest.raises(LyceumError) as err:
        client.request("POST", "/vms/create", body)
    assert err.value.status == 503 and err.value.retryable and creates(emu) == 1
    emu.inject(0, count=1, path="/vms/create", drop=True, after_processing=True)
    with pytest.raises(LyceumError, match=r"\(the connection closed without an answer\)$") as err:
        client.request("POST", "/vms/create", {**body, "name": "q"})
    assert err.value.status is None and err.value.retryable and creates(emu) == 2 and len(emu.vms) == 2


# -- POST /vms/create: a lost answer is adopted, never duplicated -----------------------------
def test_create_whose_connection_dropped_after_processing_adopts_the_vm(client: LyceumClient, emu: Emulator) -> None:
    emu.inject(0, count=1, path="/vms/create", drop=True, after_processing=True)
    vm = client.create_vm({"hardware_profile": "cpu", "user_public_key": KEY, "name": "lost"})
    [made] = emu.vms.values()
    assert vm["vm_id"] == made.vm_id and made.name == "lost"
    assert [(m, p.rsplit("/", 1)[-1], s) for m, p, s in emu.requests] == [
        ("GET", "list", 200), ("POST", "create", 0), ("GET", "list", 200)]  # looked, found, adopted


def test_create_adopts_only_its_own_new_vm(client: LyceumClient, emu: Emulator) -> None:
    """A VM of the same name that existed before the create is not the one it made."""
    old = client.create_vm({"hardware_profile": "cpu", "user_public_key": KEY, "name": "same"})
    emu.inject(0, count=1, path="/vms/create", drop=True)  # not processed: nothing to adopt
    new = client.create_vm({"hardware_profile": "cpu", "user_public_key": KEY, "name": "same"})
    assert new["vm_id"] != old["vm_id"] and len(emu.vms) == 2 and creates(emu) == 3


def test_create_waits_out_a_429_without_looking(client: LyceumClient, emu: Emulator) -> None:
    emu.inject(429, count=1, path="/vms/create", retry_after=1)
    start = time.monotonic()
    client.create_vm({"hardware_profile": "cpu", "user_public_key": KEY, "name": "busy"})
    assert time.monotonic() - start >= 1.0 and len(emu.vms) == 1
    assert [(m, p.rsplit("/", 1)[-1], s) for m, p, s in emu.requests] == [
        ("GET", "list", 200), ("POST", "create", 429), ("POST", "create", 200)]


def test_create_without_a_name_is_not_retried_after_a_lost_answer(client: LyceumClient, emu: Emulator) -> None:
    emu.inject(502, count=1, path="/vms/create", after_processing=True)
    with pytest.raises(LyceumError, match=r"^Lyceum API 502 on POST /vms/create: .*\(not retried: the create names "
                                          r"no VM"):
        client.create_vm({"hardware_profile": "cpu", "user_public_key": KEY})
    assert creates(emu) == 1


def test_create_gives_up_when_even_the_lookup_fails(client: LyceumClient, emu: Emulator,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A create that may have gone through is not repeated when we cannot check whether it did."""
    real_list = client.list_vms
    looks = 0

    def list_then_break() -> list[dict[str, Any]]:
        nonlocal looks
        looks += 1
        if looks == 2:  # the look after the lost answer: the API is down for lists now
            emu.inject(503, count=50, path="/vms/list", detail="list is down")
        return real_list()

    monkeypatch.setattr(client, "list_vms", list_then_break)
    emu.inject(502, count=1, path="/vms/create", after_processing=True)
    with pytest.raises(LyceumError) as err:
        client.create_vm({"hardware_profile": "cpu", "user_public_key": KEY, "name": "unsure"})
    assert str(err.value) == (
        "Lyceum API 502 on POST /vms/create: emulated upstream failure; the create of unsure may have gone through, "
        "and listing the VMs to check failed too (Lyceum API 503 on GET /vms/list: list is down "
        "(gave up after 4 attempts))")
    assert creates(emu) == 1 and len(emu.vms) == 1


# -- pooled connections --------------------------------------------------------------------------
def test_connections_are_reused(client: LyceumClient, emu: Emulator) -> None:
    """One keep-alive connection serves request after request, errors included (the old client opened one each)."""
    vm = client.create_vm({"hardware_profile": "cpu", "user_public_key": KEY, "name": "pooled"})
    for _ in range(5):
        client.vm_status(vm["vm_id"])
        client.availability()
        with pytest.raises(LyceumNotFound):
            client.vm_status("vm-nope")
    client.delete_vm(vm["vm_id"])
    assert len(emu.requests) == 18 and emu.connections == 1


def test_threads_share_the_pool(client: LyceumClient, emu: Emulator) -> None:
    with ThreadPoolExecutor(4) as pool:
        assert all(r == [] for r in pool.map(lambda _: client.list_vms(), range(40)))
    assert len(emu.requests) == 40 and emu.connections <= 4


def test_a_closed_client_reconnects(client: LyceumClient, emu: Emulator) -> None:
    client.list_vms()
    client.close()
    client.list_vms()
    assert emu.connections == 2


# -- a scripted loopback server: answers the emulator never gives -----------------------------
Answer = tuple[int, dict[str, str], bytes]


class Scripted:
    """HTTP/1.1 on 127.0.0.1 that answers each request with the next entry of a script; an entry may
    be a function of the request's headers (to echo them, as a careless proxy might)."""

    def __init__(self, script: list[Answer | Callable[[Any], Answer]]) -> None:
        self.script = list(script)
        self.seen: list[tuple[str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.seen.append((self.command, self.path))
                entry = owner.script.pop(0) if len(owner.script) > 1 else owner.script[0]
                status, headers, body = entry(self.headers) if callable(entry) else entry
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v2/external"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted() -> Iterator[Callable[..., tuple[Scripted, LyceumClient]]]:
    servers: list[Scripted] = []

    def start(*script: Answer | Callable[[Any], Answer]) -> tuple[Scripted, LyceumClient]:
        servers.append(Scripted(list(script)))
        return servers[-1], LyceumClient(SECRET, servers[-1].url, retry=FAST)

    yield start
    for server in servers:
        server.close()


def echo_auth(status: int, content_type: str = "application/json") -> Callable[[Any], Answer]:
    def answer(headers: Any) -> Answer:
        auth = headers.get("Authorization", "")
        body = (json.dumps({"detail": f"upstream refused {auth}"}) if content_type == "application/json"
                else f"<html><body><h1>Error</h1><pre>Authorization: {auth}</pre></body></html>")
        return status, {"Content-Type": content_type}, body.encode()
    return answer


def test_the_key_never_shows(scripted: Callable[..., tuple[Scripted, LyceumClient]],
                             caplog: pytest.LogCaptureFixture) -> None:
    """Not in errors (even when the answer echoes the Authorization header), logs, reprs or the client's state."""
    caplog.set_level(logging.DEBUG)
    server, client = scripted(echo_auth(500), echo_auth(401), echo_auth(200, "text/html"), echo_auth(400, "text/plain"))
    texts = []
    for _ in range(3):
        with pytest.raises(GlueError) as err:
            client.list_vms()
        assert isinstance(err.value, LyceumError)
        texts += [str(err.value), err.value.detail, repr(err.value)]
        assert "\n" not in str(err.value)
    assert texts[0].startswith("Lyceum rejected the API key (401 on GET /vms/list: upstream refused Bearer <redacted>)")
    assert texts[3].startswith("Lyceum API answered GET /vms/list with 200 but a body that is not JSON (text/html: "
                               "'Error Authorization: Bearer <redacted>')")
    assert texts[6] == "Lyceum API 400 on GET /vms/list: Error Authorization: Bearer <redacted>"
    texts += [r.getMessage() for r in caplog.records] + [repr(client), str(vars(client)), repr(vars(client))]
    assert len(server.seen) == 4  # the 500 was retried once
    assert all(SECRET not in t for t in texts), [t for t in texts if SECRET in t]
    assert any("500" in r.getMessage() and "<redacted>" in r.getMessage() for r in caplog.records)


def test_a_success_that_echoes_the_key_has_it_blanked(scripted: Callable[..., tuple[Scripted, LyceumClient]]) -> None:
    def answer(headers: Any) -> Answer:
        auth = headers.get("Authorization", "")
        return 200, {"Content-Type": "application/json"}, json.dumps(
            {"available_hardware_profiles": [{"profile": "cpu", "available": 4, "note": auth}]}).encode()
    _, client = scripted(answer)
    [profile] = client.availability()
    assert profile["note"] == "Bearer <redacted>" and SECRET not in json.dumps(profile)


def test_answers_of_the_wrong_shape_are_one_line(scripted: Callable[..., tuple[Scripted, LyceumClient]]) -> None:
    _, client = scripted((200, {}, b"[1, 2]"), (200, {}, b'{"vms": "none"}'), (200, {}, b"{not json"))
    with pytest.raises(LyceumError, match=r"^Lyceum API answered GET /vms/vm-1/status with JSON of an unexpected "
                                          r"shape \(list, expected an object\)$"):
        client.vm_status("vm-1")
    with pytest.raises(LyceumError, match=r"^Lyceum API answered GET /vms/list with JSON of an unexpected shape"):
        client.list_vms()
    with pytest.raises(LyceumError, match=r"^Lyceum API answered GET /vms/list with 200 but a body that is not JSON "
                                          r"\(application/json: '\{not json'\); is LYCEUM_API_URL the API's URL\?$"):
        client.list_vms()


def test_a_redirect_is_not_followed(scripted: Callable[..., tuple[Scripted, LyceumClient]]) -> None:
    """Following it could carry the key to another host; it is an error instead."""
    elsewhere, _ = scripted((200, {}, b"{}"))
    server, client = scripted((302, {"Location": elsewhere.url + "/vms/list"}, b""))
    with pytest.raises(LyceumError, match=r"^Lyceum API answered GET /vms/list with a redirect \(302\) that gpukit "
                                          r"does not follow; is LYCEUM_API_URL the API's URL\?$"):
        client.list_vms()
    assert len(server.seen) == 1 and elsewhere.seen == []


def test_an_http_date_retry_after_is_honoured(scripted: Callable[..., tuple[Scripted, LyceumClient]]) -> None:
    from email.utils import formatdate

    def busy(headers: Any) -> Answer:
        return 503, {"Retry-After": formatdate(time.time() + 2, usegmt=True)}, b'{"detail": "maintenance"}'

    server, client = scripted(busy, (200, {}, b'{"vms": []}'))
    start = time.monotonic()
    assert client.list_vms() == []
    assert time.monotonic() - start >= 1.0 and len(server.seen) == 2  # the date has whole seconds: 1 to 2 s
