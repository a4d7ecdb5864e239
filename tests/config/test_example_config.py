"""config/chatgate.toml documents every setting: each section and key of `Settings` appears in it (set or
commented out), and the file loads as a valid configuration with the defaults' values."""

from __future__ import annotations

import re
import tomllib

from chatgate.settings import SECTIONS, Settings, load_settings
from tests.harness import REPO_ROOT

EXAMPLE = REPO_ROOT / "config" / "chatgate.toml"
SECRETS = {("auth", "upstream_api_key"), ("auth", "admin_key")}  # from the environment, never in files


def test_every_setting_is_in_the_example_config() -> None:
    text = EXAMPLE.read_text()
    missing = []
    for section in SECTIONS:
        assert re.search(rf"^\[{section}\]$", text, re.MULTILINE), f"[{section}] is not in the example"
        body = text.split(f"[{section}]", 1)[1].split("\n[", 1)[0]
        for key in type(getattr(Settings(), section)).model_fields:
            if (section, key) not in SECRETS and not re.search(rf"^#? ?{key} = ", body, re.MULTILINE):
                missing.append(f"{section}.{key}")
    assert missing == []


def test_the_example_config_loads_with_the_default_values() -> None:
    loaded = load_settings(str(EXAMPLE), env={})
    defaults = Settings()
    data = tomllib.loads(EXAMPLE.read_text())
    for section in SECTIONS:
        for key, value in data.get(section, {}).items():
            got = getattr(getattr(loaded.settings, section), key)
            assert got == getattr(getattr(defaults, section), key), f"{section}.{key} = {value!r}"
