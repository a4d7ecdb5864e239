"""chatgate's HTTP protocol subclasses uvicorn's (chatgate/uvicorn_protocol.py), written for one uvicorn
release: pyproject.toml pins it exactly, and `chatgate serve` refuses to start, saying why, on any other."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
import uvicorn

from chatgate import server
from chatgate.cli import main
from chatgate.settings import ServerSettings
from chatgate.uvicorn_protocol import UVICORN, UvicornMismatch, check_uvicorn

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_pins_the_uvicorn_the_protocol_is_written_for() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"uvicorn[standard]=={UVICORN}" in dependencies
    assert f"uvicorn=={UVICORN}\n" in (ROOT / "docker" / "requirements.lock").read_text()
    assert uvicorn.__version__ == UVICORN
    check_uvicorn()


def test_another_uvicorn_release_is_refused_by_name() -> None:
    with pytest.raises(UvicornMismatch, match=r"written for uvicorn 0\.55\.0, and uvicorn 0\.56\.0 is "
                                              r"installed.*uvicorn\[standard\]==0\.55\.0"):
        check_uvicorn("0.56.0")


def test_serve_on_another_uvicorn_exits_3_with_the_reason(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    for name in [n for n in os.environ if n.startswith("CHATGATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(uvicorn, "__version__", "0.56.0")

    def started(*args: object, **kwargs: object) -> bool:
        raise AssertionError("the server started on a uvicorn chatgate is not written for")
    monkeypatch.setattr(server, "run", started)
    monkeypatch.setattr("chatgate.cli._absorb_replayed_stop_signals", lambda: None)
    monkeypatch.setenv("_CHATGATE_SERVE_FLAGS", "")
    assert main(["serve", "--port", "0", "--store", "none"]) == 3
    err = capsys.readouterr().err
    assert "uvicorn 0.56.0 is installed" in err and "uvicorn[standard]==0.55.0" in err
    with pytest.raises(UvicornMismatch):  # and a --workers process, which configures the protocol again
        server.configure(ServerSettings())
