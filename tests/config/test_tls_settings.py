"""The `tls` section and `auth`: defaults (hmac without tls, tls with it), the checks that
name what is missing, and the section read from a config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import AuthMode, ConfigError, load_settings

TLS = {"ca": "/etc/shoal/ca.crt", "cert": "/etc/shoal/n.crt", "key": "/etc/shoal/n.key"}


def test_auth_defaults_to_hmac_without_tls_and_tls_with_it() -> None:
    assert load_settings(env={}).settings.auth_mode is AuthMode.HMAC
    settings = load_settings(env={}, flags={"tls": TLS}).settings
    assert settings.auth_mode is AuthMode.TLS
    assert settings.tls is not None
    assert settings.tls.crl is None
    assert settings.tls.crl_refresh_s == 30
    assert AuthMode.HMAC_TLS.uses_tls
    assert AuthMode.HMAC_TLS.accepts_hmac
    assert not AuthMode.TLS.accepts_hmac


def test_auth_tls_without_a_tls_section_is_refused() -> None:
    with pytest.raises(ConfigError, match="auth tls needs a tls section"):
        load_settings(env={}, flags={"auth": "tls"})


def test_hmac_plus_tls_needs_the_secret(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"hmac\+tls .* set secret_file"):
        load_settings(env={}, flags={"auth": "hmac+tls", "tls": TLS})
    settings = load_settings(
        env={}, flags={"auth": "hmac+tls", "tls": TLS, "secret_file": tmp_path / "s"}
    ).settings
    assert settings.auth_mode is AuthMode.HMAC_TLS


def test_the_tls_section_from_a_file_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "shoal.yaml"
    path.write_text(
        "tls:\n  ca: /a/ca.crt\n  cert: /a/n.crt\n  key: /a/n.key\n  crl_refresh_s: -1\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert f"{path}:5" in str(caught.value)
    assert "tls.crl_refresh_s" in str(caught.value)
    path.write_text("tls:\n  ca: /a/ca.crt\n  cert: /a/n.crt\n  key: /a/n.key\nauth: hmac\n")
    loaded = load_settings(path, env={})
    assert loaded.settings.auth_mode is AuthMode.HMAC
    assert loaded.sources["tls.cert"].startswith(f"file:{path}:3")
