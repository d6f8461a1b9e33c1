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
