"""The TOML config file (FAULTLINE_CONFIG): its keys are the settings' names, and a key that
names no setting is an error that says which, not a default kept in silence."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.settings import ConfigError, load_settings


def test_a_config_file_sets_what_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "faultline.toml"
    config.write_text("hang_floor_s = 1234.0\n")
    monkeypatch.setenv("FAULTLINE_CONFIG", str(config))
    assert load_settings(data_dir=tmp_path).hang_floor_s == 1234.0


def test_a_misspelt_key_is_an_error_naming_it_and_the_setting_meant(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "faultline.toml"
    config.write_text("hang_flor_s = 1234.0\n")
    monkeypatch.setenv("FAULTLINE_CONFIG", str(config))
    with pytest.raises(ConfigError) as caught:
        load_settings(data_dir=tmp_path)
    assert "'hang_flor_s'" in str(caught.value) and "'hang_floor_s'" in str(caught.value)


def test_the_environment_outranks_the_file_and_a_bad_value_names_its_setting(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "faultline.toml"
    config.write_text("hang_floor_s = 1234.0\nlive_cached_jobs = 3\n")
    monkeypatch.setenv("FAULTLINE_CONFIG", str(config))
    monkeypatch.setenv("FAULTLINE_HANG_FLOOR_S", "99")
    settings = load_settings(data_dir=tmp_path)
    assert (settings.hang_floor_s, settings.live_cached_jobs) == (99.0, 3)
    config.write_text("live_cached_jobs = -1\n")
    with pytest.raises(ConfigError, match="FAULTLINE_LIVE_CACHED_JOBS"):
        load_settings(data_dir=tmp_path)


@pytest.mark.parametrize(("text", "message"), [(None, "no such file"), ("hang_floor_s = = 3\n", "cannot read")])
def test_a_missing_or_broken_file_is_an_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        text: str | None, message: str) -> None:
    config = tmp_path / "faultline.toml"
    if text is not None:
        config.write_text(text)
    monkeypatch.setenv("FAULTLINE_CONFIG", str(config))
    with pytest.raises(ConfigError, match=message) as caught:
        load_settings(data_dir=tmp_path)
    assert str(config) in str(caught.value)
