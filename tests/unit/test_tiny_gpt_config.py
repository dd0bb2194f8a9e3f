"""The example trainer validates its own `config:` block: a bad value is one line and no training."""

from __future__ import annotations

import pytest

from glue.examples import tiny_gpt


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ('{"steps": -5}', "config.steps must be >= 1"),
        ('{"steps": 0}', "config.steps must be >= 1"),
        ('{"steps": "ten"}', "config.steps must be int"),
        ('{"steps": true}', "config.steps must be int"),
        ('{"lr": 0}', "config.lr must be >="),
        ('{"dropout": 1.0}', "config.dropout must be below 1"),
        ('{"d_model": 30, "n_head": 4}', "multiple of config.n_head"),
        ('{"device": "tpu"}', "config.device"),
        ('{"stepz": 5}', "unknown key 'stepz' in config"),
    ],
)
def test_bad_config_is_refused_before_training(override: str, needle: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert tiny_gpt.main(["--config", override]) == 2
    err = capsys.readouterr()
    assert needle in err.err and len(err.err.strip().splitlines()) == 1
    assert "step 1" not in err.out


def test_defaults_are_valid() -> None:
    assert tiny_gpt.check_config(dict(tiny_gpt.DEFAULTS)) == tiny_gpt.DEFAULTS
