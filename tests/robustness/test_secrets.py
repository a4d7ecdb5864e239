"""Secrets never leak.

Client keys, the upstream DEEPSEEK_API_KEY and CHATGATE_ADMIN_KEY appear nowhere chatgate writes or answers
(process log with the access log on, error bodies, /metrics, /admin/usage, the SQLite file, spool files);
client keys exist only as hashes/fingerprints. Managed mode never sends the client key upstream. Admin routes
refuse client keys. Default bind is loopback. Error bodies carry no stack trace or file path."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from chatgate.gateway.auth import fingerprint, hash_key
from chatgate.settings import Settings
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import ADMIN_KEY, REPO_ROOT, make_settings, run_chatgate, spawn_chatgate, unreachable_url

pytestmark = pytest.mark.slow  # chatgate processes and their logs

UPSTREAM_KEY = "sk-upstream-0f9e8d7c6b5a49382716"
PASSTHROUGH_KEYS = ["sk-alice-passthrough-4c1d2e3f", "sk-bad-bob-passthrough-9a8b7c6d"]
UNKNOWN_CG_KEY = "cg-not-a-real-key-but-secret-3e2d1c"
CHAT = "/v1/chat/completions"
QUESTION = {
    "model": "deepseek-chat",
    "messages": [{"role": "user", "content": "Draft a two-line status update for the Lisbon office."}],
}
INVALID = {"model": "deepseek-chat", "messages": [{"role": "user", "content": "hi"}], "temperature": 7}


def create_key(store_url: str, team: str, name: str, cwd: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "chatgate", "keys", "create", "--team", team, "--name", name, "--store",
         store_url],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
    )
    secret = out.stdout.strip().splitlines()[-1]
    assert secret.startswith("cg-"), out.stdout
    return secret


def post(url: str, key: str | None, body: Any, **headers: str) -> httpx2.Response:
    h = {"content-type": "application/json", **headers}
    if key is not None:
        h["authorization"] = f"Bearer {key}"
    return httpx2.post(url + CHAT, content=orjson.dumps(body), headers=h, timeout=30)


def streamed(url: str, key: str) -> bytes:
    with httpx2.stream(
        "POST",
        url + CHAT,
        content=orjson.dumps({**QUESTION, "stream": True}),
        timeout=30,
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
    ) as resp:
        assert resp.status_code == 200
        return resp.read()


def files_under(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots for p in sorted(root.rglob("*")) if p.is_file()}


def assert_no_secret(secrets: list[str], places: dict[str, bytes | str]) -> None:
    leaks = []
    for where, data in places.items():
        blob = data.encode("utf-8", "replace") if isinstance(data, str) else data
        leaks += [f"{s!r} in {where}" for s in secrets if s.encode() in blob]
    assert not leaks, "secret(s) leaked: " + "; ".join(leaks)


def assert_no_stack_trace(body: str) -> None:
    for marker in ("Traceback", 'File "', ".py", "/work/", "site-packages", "Error:"):
        assert marker not in body, f"{marker!r} in error body {body!r}"


@pytest.fixture(scope="module")
def fake() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


def test_managed_mode_leaks_no_key_anywhere(tmp_path: Path, fake: RunningFake) -> None:
    store_url = f"sqlite:///{tmp_path}/usage.db"
    alice = create_key(store_url, "growth", "alice-laptop", tmp_path)
    bob = create_key(store_url, "support", "bob-ci", tmp_path)
    env = {
        "DEEPSEEK_API_KEY": UPSTREAM_KEY,
        "CHATGATE_ADMIN_KEY": ADMIN_KEY,
        "CHATGATE_AUTH_MODE": "managed",
        "CHATGATE_SERVER_ACCESS_LOG": "true",
        "PYTHONPATH": str(REPO_ROOT),
    }
    fake.state.reset()
    bodies: dict[str, str] = {}
    with spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", store_url, env=env) as gate:
        ok = post(gate.url, alice, QUESTION)
        assert ok.status_code == 200, ok.text
        assert b"[DONE]" in streamed(gate.url, bob)
        errors = {
            "missing key": post(gate.url, None, QUESTION),
            "unknown cg key": post(gate.url, UNKNOWN_CG_KEY, QUESTION),
            "upstream key as client key": post(gate.url, UPSTREAM_KEY, QUESTION),
            "admin key as client key": post(gate.url, ADMIN_KEY, QUESTION),
            "invalid body (R-rule 400)": post(gate.url, alice, INVALID),
            "upstream 500": post(gate.url, alice, QUESTION, **{"x-fake-fault": "http_500"}),
            "upstream 401": post(gate.url, bob, QUESTION, **{"x-fake-fault": "http_401"}),
            "upstream 429": post(gate.url, bob, QUESTION, **{"x-fake-fault": "http_429"}),
            "upstream non-JSON 200 (502)": post(
                gate.url, alice, QUESTION, **{"x-fake-fault": "non_json_200"}
            ),
        }
        statuses = {name: r.status_code for name, r in errors.items()}
        assert statuses == {
            "missing key": 401,
            "unknown cg key": 401,
            "upstream key as client key": 401,
            "admin key as client key": 401,
            "invalid body (R-rule 400)": 400,
            "upstream 500": 500,
            "upstream 401": 502,  # DeepSeek refused chatgate's own key: chatgate's upstream_auth_failed
            "upstream 429": 429,
            "upstream non-JSON 200 (502)": 502,
        }
        for name, r in errors.items():
            bodies[f"error body: {name}"] = r.text
            if name not in ("upstream 500", "upstream 429"):  # DeepSeek's own bodies
                assert_no_stack_trace(r.text)
        admin = httpx2.get(gate.url + "/admin/usage?by=key", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert admin.status_code == 200, admin.text
        bodies["/admin/usage"] = admin.text
        for refused in (alice, bob, UPSTREAM_KEY):
            r = httpx2.get(gate.url + "/admin/usage", headers={"authorization": f"Bearer {refused}"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key"
            bodies[f"admin refusal for {refused[:3]}"] = r.text
        bodies["/metrics"] = httpx2.get(gate.url + "/metrics").text
        bodies["/readyz"] = httpx2.get(gate.url + "/readyz").text
        assert gate.terminate() == 0
        log = gate.log()

    assert '"event":"request"' in log.replace(" ", ""), "the access log was not on: the grep proves nothing"
    assert "key_id" in log
    assert admin.json(), "the admin report should not be empty"
    upstream_auth = {r.headers.get("authorization") for r in fake.state.requests}
    assert upstream_auth == {f"Bearer {UPSTREAM_KEY}"}, (
        "managed mode must send only DEEPSEEK_API_KEY upstream"
    )
    for r in fake.state.requests:
        assert_no_secret(
            [alice, bob, ADMIN_KEY], {f"upstream request {r.request_id}": repr(r.headers).encode() + r.body}
        )
    db_files = {str(p): p.read_bytes() for p in tmp_path.glob("usage.db*")}
    assert db_files, "no SQLite file to inspect"
    db = b"".join(db_files.values())
    assert hash_key(alice).encode() in db and hash_key(bob).encode() in db, "keys must be stored as hashes"
    spool = files_under(tmp_path / "spool")
    assert_no_secret(
        [alice, bob, UNKNOWN_CG_KEY, UPSTREAM_KEY, ADMIN_KEY],
        {"process log": log, **bodies, **db_files, **spool},
    )


def test_passthrough_mode_leaks_no_key_anywhere(tmp_path: Path, fake: RunningFake) -> None:
    """Passthrough: the client's sk- key goes upstream (that is the mode); chatgate keeps only fingerprints.
    The usage writer is held back (long flush interval) and the process killed -9, so the spool file holds the
    records when we grep it."""
    store_url = f"sqlite:///{tmp_path}/usage.db"
    env = {
        "CHATGATE_ADMIN_KEY": ADMIN_KEY,
        "CHATGATE_SERVER_ACCESS_LOG": "true",
        "DEEPSEEK_API_KEY": "",
        "CHATGATE_STORE_FLUSH_INTERVAL_MS": "600000",
        "PYTHONPATH": str(REPO_ROOT),
    }
    good, bad = PASSTHROUGH_KEYS
    fake.state.reset()
    bodies: dict[str, str] = {}
    with spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", store_url, env=env) as gate:
        assert post(gate.url, good, QUESTION).status_code == 200
        assert b"[DONE]" in streamed(gate.url, good)
        for name, r in {
            "upstream 401 (bad key)": post(gate.url, bad, QUESTION),
            "invalid body": post(gate.url, good, INVALID),
            "wrong content type": httpx2.post(
                gate.url + CHAT,
                content=b"x",
                headers={"authorization": f"Bearer {good}", "content-type": "text/plain"},
            ),
            "upstream 503": post(gate.url, good, QUESTION, **{"x-fake-fault": "http_503"}),
        }.items():
            assert r.status_code >= 400, name
            bodies[name] = r.text
        for refused in (good, bad):
            r = httpx2.get(gate.url + "/admin/usage", headers={"authorization": f"Bearer {refused}"})
            assert r.status_code == 401
            bodies["admin refusal"] = r.text
        bodies["/metrics"] = httpx2.get(gate.url + "/metrics").text
        gate.kill9()
        log = gate.log()
    with spawn_chatgate(
        tmp_path,
        "--upstream",
        unreachable_url(),
        "--store",
        store_url,
        env=env,
        name="dead-upstream",
    ) as dead:
        r = post(dead.url, good, QUESTION)
        assert r.status_code == 502, r.text
        assert_no_stack_trace(r.text)
        bodies["502 upstream unreachable"] = r.text
        dead.kill9()
        log += dead.log()

    assert {r.headers.get("authorization") for r in fake.state.requests} == {
        f"Bearer {good}",
        f"Bearer {bad}",
    }
    spool = files_under(tmp_path / "spool")
    assert any(fingerprint(good).encode() in data for data in spool.values()), "the spool should hold records"
    assert fingerprint(good) in log, "the access log names callers by fingerprint"
    db_files = {str(p): p.read_bytes() for p in tmp_path.glob("usage.db*")}
    assert_no_secret([good, bad, ADMIN_KEY], {"process log": log, **bodies, **db_files, **spool})


def test_default_bind_is_loopback(tmp_path: Path) -> None:
    assert Settings().server.host == "127.0.0.1"
    help_text = subprocess.run(
        [sys.executable, "-m", "chatgate", "serve", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=True,
    ).stdout
    assert "127.0.0.1" in help_text
    with spawn_chatgate(tmp_path, "--store", "none") as gate:
        listening = listeners(gate.port)
        assert listening == {"127.0.0.1"}, f"port {gate.port} is listening on {listening}"


def listeners(port: int) -> set[str]:
    """Local addresses in LISTEN state on this port, from /proc/net/tcp and tcp6."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:
                found.add(_ip(addr))
    return found


def _ip(hex_addr: str) -> str:
    if len(hex_addr) == 8:
        return ".".join(str(b) for b in reversed(bytes.fromhex(hex_addr)))
    return "ipv6:" + hex_addr


class ExplodingStore:
    """A store whose every call fails with a message full of internals (path, line, a password)."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                f"disk I/O error at /work/main/app/store/sqlite.py:42 in {name} password=hunter2"
            )

        return fail


def test_internal_error_body_has_no_stack_trace_or_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Force the internal-error path: the key lookup (managed) and the admin report hit a store that raises.
    The 500 body is the generic OpenAI-shaped error; the details go to the log only."""
    settings = make_settings(
        tmp_path, auth={"mode": "managed", "admin_key": ADMIN_KEY, "upstream_api_key": UPSTREAM_KEY}
    )
    with run_chatgate(settings) as gate:
        real = gate.state.store
        gate.state.gw.auth.store = gate.state.store = ExplodingStore()
        answers = [
            post(gate.url, "cg-some-client-key", QUESTION),
            httpx2.get(gate.url + "/admin/usage", headers={"authorization": f"Bearer {ADMIN_KEY}"}),
        ]
        gate.state.gw.auth.store = gate.state.store = real  # a clean shutdown closes the real store
    for resp in answers:
        assert resp.status_code == 500, resp.text
        assert resp.json()["error"]["code"] == "internal_error"
        assert resp.json()["error"]["type"] == "server_error"
        assert_no_stack_trace(resp.text)
        assert "hunter2" not in resp.text and "sqlite" not in resp.text
    assert "hunter2" in caplog.text, "the details should be logged for the operator"
