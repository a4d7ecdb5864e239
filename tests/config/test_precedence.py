"""Settings precedence: command-line flags > environment (CHATGATE_*) > config file > built-in defaults, with
the source of every value recorded (unit tests of chatgate.settings.load_settings)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from chatgate.settings import ConfigError, Settings, effective, load_settings

FILE = """
[server]
port = 9001
workers = 2

[upstream]
base_url = "http://127.0.0.1:7000/"
read_timeout = 30

[store]
url = "sqlite:///from-file.db"

[pricing]
off_peak_multiplier = "0.25"

[models."deepseek-v4-pro"]
max_tokens_max = 8192
"""


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "chatgate.toml"
    path.write_text(FILE)
    return str(path)


def test_defaults_when_nothing_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    loaded = load_settings(None, env={"HOME": "/home/u"}, flags={})
    assert loaded.settings.model_copy(update={"store": Settings().store}) == Settings()
    assert loaded.sources == {}
    assert loaded.settings.server.host == "127.0.0.1" and loaded.settings.server.port == 8787
    store = loaded.settings.store
    assert (store.url, store.spool_dir) == ("sqlite:////home/u/.local/share/chatgate/chatgate.db",
                                            "/home/u/.local/share/chatgate/spool")


@pytest.mark.parametrize(("env", "data"), [
    ({"HOME": "/home/u", "XDG_DATA_HOME": "/data/u"}, "/data/u/chatgate"),
    ({"HOME": "/home/u", "XDG_DATA_HOME": "relative/ignored"}, "/home/u/.local/share/chatgate"),
    ({"HOME": "/home/u", "XDG_DATA_HOME": ""}, "/home/u/.local/share/chatgate"),
])
def test_the_default_store_is_in_the_per_user_data_directory(
        env: dict[str, str], data: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for where in (tmp_path, tmp_path.parent):  # whatever the current directory
        monkeypatch.chdir(where)
        store = load_settings(None, env=env).settings.store
        assert (store.url, store.spool_dir) == (f"sqlite:///{data}/chatgate.db", f"{data}/spool")


def test_a_store_at_the_old_default_place_is_kept_and_a_set_one_wins(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "chatgate.db").write_bytes(b"")
    store = load_settings(None, env={"HOME": "/home/u"}).settings.store
    assert (store.url, store.spool_dir) == ("sqlite:///data/chatgate.db", "data/spool")
    loaded = load_settings(None, env={"HOME": "/home/u", "CHATGATE_STORE_URL": "sqlite:///elsewhere.db"})
    assert loaded.settings.store.url == "sqlite:///elsewhere.db" and loaded.sources["store.url"] == "env"
    monkeypatch.chdir(tmp_path.parent)
    store = load_settings(None, env={"HOME": "/home/u", "CHATGATE_STORE_URL": "sqlite:///x.db"}).settings.store
    assert store.spool_dir == "/home/u/.local/share/chatgate/spool", "the spool's default is the user's"


def test_file_overrides_defaults(config: str) -> None:
    loaded = load_settings(config, env={}, flags={})
    s = loaded.settings
    assert (s.server.port, s.server.workers, s.store.url) == (9001, 2, "sqlite:///from-file.db")
    assert s.upstream.base_url == "http://127.0.0.1:7000"  # trailing slash dropped
    assert s.pricing.off_peak_multiplier == Decimal("0.25")
    assert s.profiles()["deepseek-v4-pro"].max_tokens_max == 8192
    assert loaded.sources["server.port"] == "file"
    assert "server.host" not in loaded.sources  # still the default


def test_env_overrides_file(config: str) -> None:
    env = {"CHATGATE_SERVER_PORT": "9002", "CHATGATE_STORE_URL": "sqlite:///from-env.db",
           "CHATGATE_VALIDATION_STRICT": "true", "CHATGATE_PRICING_PEAK_HOURS_UTC": '["02:00-03:00"]'}
    loaded = load_settings(config, env=env, flags={})
    s = loaded.settings
    assert (s.server.port, s.store.url, s.validation.strict) == (9002, "sqlite:///from-env.db", True)
    assert s.pricing.peak_hours_utc == ["02:00-03:00"]
    assert s.server.workers == 2, "a setting the env does not name keeps its file value"
    assert loaded.sources["server.port"] == "env" and loaded.sources["server.workers"] == "file"


def test_flags_override_env_and_file(config: str) -> None:
    env = {"CHATGATE_SERVER_PORT": "9002", "CHATGATE_STORE_URL": "sqlite:///from-env.db"}
    flags = {"server.port": 9003, "store.url": "none", "auth.mode": None}  # None: flag not given
    loaded = load_settings(config, env=env, flags=flags)
    s = loaded.settings
    assert (s.server.port, s.store.url, s.store.enabled) == (9003, "none", False)
    assert s.auth.mode == "passthrough"
    assert loaded.sources["server.port"] == "flag" and loaded.sources["store.url"] == "flag"
    assert "auth.mode" not in loaded.sources


def test_secrets_come_from_their_own_env_names() -> None:
    env = {"DEEPSEEK_API_KEY": "sk-upstream-secret", "CHATGATE_ADMIN_KEY": "admin-secret-" + "0" * 32}
    loaded = load_settings(None, env=env, flags={})
    auth = loaded.settings.auth
    assert auth.upstream_api_key is not None
    assert auth.upstream_api_key.get_secret_value() == "sk-upstream-secret"
    assert auth.admin_key is not None and auth.admin_key.get_secret_value() == "admin-secret-" + "0" * 32
    assert "sk-upstream-secret" not in repr(loaded.settings)
    assert loaded.sources["auth.upstream_api_key"] == "env"


def test_config_file_named_by_chatgate_config_env(config: str) -> None:
    loaded = load_settings(None, env={"CHATGATE_CONFIG": config}, flags={})
    assert loaded.settings.server.port == 9001 and loaded.config_path == config


def test_effective_lists_every_setting_with_its_source(config: str) -> None:
    rows = effective(load_settings(config, env={"CHATGATE_SERVER_WORKERS": "3", "DEEPSEEK_API_KEY": "sk-s"},
                                   flags={"server.port": 9100}))
    by_name = {name: (value, source) for name, value, source in rows}
    for section, model in Settings.model_fields.items():
        if section == "models":
            continue
        for key in model.annotation.model_fields:  # type: ignore[union-attr]
            assert f"{section}.{key}" in by_name
    assert by_name["server.port"] == ("9100", "flag")
    assert by_name["server.workers"] == ("3", "env")
    assert by_name["store.url"] == ("'sqlite:///from-file.db'", "file")
    assert by_name["server.host"] == ("'127.0.0.1'", "default")
    assert by_name["auth.upstream_api_key"] == ("****", "env")
    assert by_name["models.deepseek-v4-pro"][1] == "file"


@pytest.mark.parametrize("env,setting", [
    ({"CHATGATE_SERVER_PORT": "eighty"}, "server.port"),
    ({"CHATGATE_UPSTREAM_BASE_URL": "ftp://deepseek"}, "upstream.base_url"),
    ({"CHATGATE_SERVERPORT": "1"}, "CHATGATE_SERVERPORT"),
    ({"CHATGATE_SERVER_COLOUR": "blue"}, "server.colour"),
    ({"CHATGATE_LIMITS_MAX_BODY_BYTES": "10"}, "limits.max_body_bytes"),
])
def test_bad_env_names_the_setting(env: dict[str, str], setting: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(None, env=env, flags={})
    assert setting in str(exc.value) and "\n" not in str(exc.value)


def test_a_peak_window_may_cross_midnight(tmp_path: Path) -> None:
    path = tmp_path / "chatgate.toml"
    path.write_text('[pricing]\npeak_hours_utc = ["22:00-02:00", "23:30-00:00", "00:00-24:00"]\n')
    loaded = load_settings(str(path), env={}, flags={})
    assert loaded.settings.pricing.peak_hours_utc == ["22:00-02:00", "23:30-00:00", "00:00-24:00"]


@pytest.mark.parametrize(("window", "says"), [
    ("10:00-10:00", "window '10:00-10:00' is empty: it ends where it starts (all day is '00:00-24:00')"),
    ("00:00-00:00", "window '00:00-00:00' is empty"),
    ("22:00-24:30", "window '22:00-24:30' must look like '06:00-10:00'"),
    ("24:00-02:00", "window '24:00-02:00' must look like '06:00-10:00'"),
])
def test_a_bad_peak_window_is_a_config_error_naming_it(window: str, says: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(None, env={"CHATGATE_PRICING_PEAK_HOURS_UTC": f'["01:00-04:00", "{window}"]'}, flags={})
    assert str(exc.value).startswith("pricing.peak_hours_utc: ") and says in str(exc.value)
    assert str(exc.value).endswith("(from env)") and "\n" not in str(exc.value)


def test_a_deprecated_setting_loads_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "old.toml"
    path.write_text("[store]\nturn_flush_interval_ms = 500.0\nbatch_max = 7\n")
    with caplog.at_level("WARNING", logger="chatgate"):
        loaded = load_settings(str(path), env={})
    assert loaded.settings.store.batch_max == 7
    assert loaded.deprecated == ("store.turn_flush_interval_ms (from file) is deprecated: no longer used "
                                 "(relayed turns are not spooled): remove it",)
    assert "store.turn_flush_interval_ms" in caplog.text
    assert "store.turn_flush_interval_ms" not in [row[0] for row in effective(loaded)]
    from_env = load_settings(None, env={"CHATGATE_STORE_TURN_FLUSH_INTERVAL_MS": "1000"})
    assert from_env.deprecated[0].startswith("store.turn_flush_interval_ms (from env) is deprecated")
    assert load_settings(None, env={}).deprecated == ()


def test_upstream_retries_defaults_and_environment() -> None:
    """Issue 35: two retries by default (three attempts), CHATGATE_UPSTREAM_RETRIES=0 turns them off, and a
    status no retry can change is refused in retry_statuses."""
    up = load_settings(None, env={}, flags={}).settings.upstream
    assert (up.retries, up.retry_statuses, up.retry_base_ms, up.retry_max_wait_s) == (
        2, [429, 500, 502, 503, 504], 200.0, 20.0)
    assert (up.accounts, up.account_cooldown_s) == ([], 300.0)
    loaded = load_settings(None, env={"CHATGATE_UPSTREAM_RETRIES": "0"}, flags={})
    assert loaded.settings.upstream.retries == 0 and loaded.sources["upstream.retries"] == "env"
    with pytest.raises(ConfigError) as exc:
        load_settings(None, env={"CHATGATE_UPSTREAM_RETRY_STATUSES": "[503, 402]"}, flags={})
    assert "upstream.retry_statuses" in str(exc.value) and "[402] can never be retried" in str(exc.value)
