"""Configuration: every CREWFENCE_* variable, its flag, bounds and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from crewfence_sidecar.config import BOUNDS, ConfigError, load_config
from crewfence_sidecar.contract import Operation


@pytest.fixture
def base(tmp_path: Path) -> dict[str, str]:
    crews = tmp_path / "crews.yaml"
    crews.write_text("crews: {}\n")
    return {"CREWFENCE_CREWS_FILE": str(crews), "CREWFENCE_STATE_FILE": str(tmp_path / "s/j.db"),
            "CREWFENCE_TOKEN": "secret-token", "CREWFENCE_INSECURE_PLAINTEXT": "1"}


def test_defaults(base: dict[str, str]) -> None:
    cfg = load_config([], base)
    assert cfg.host == "0.0.0.0" and cfg.port == 8090
    assert cfg.allowed_operations == frozenset({Operation.RUN})
    assert cfg.max_retained_runs == BOUNDS["max_retained_runs"].default
    assert "secret-token" not in repr(cfg)


@pytest.mark.parametrize("env, nice", [({}, 5), ({"CREWFENCE_WORKER_NICE": "0"}, 0),
                                       ({"CREWFENCE_WORKER_NICE": "19"}, 19)])
def test_the_workers_get_the_configured_nice_levels(base: dict[str, str], env: dict[str, str],
                                                    nice: int) -> None:
    from crewfence_sidecar.workers.settings import TemplateSettings, template_settings

    settings = template_settings(load_config([], {**base, **env}))
    assert settings.nice == nice
    assert TemplateSettings.from_json(settings.to_json()).nice == nice  # crosses to the template


def test_flags_win_over_environment(base: dict[str, str]) -> None:
    cfg = load_config(["--port", "9000", "--max-concurrency", "7",
                       "--allowed-operations", "run,batch_run"],
                      {**base, "CREWFENCE_PORT": "1", "CREWFENCE_MAX_CONCURRENCY": "2"})
    assert cfg.port == 9000 and cfg.max_concurrency == 7
    assert cfg.allowed_operations == {Operation.RUN, Operation.BATCH_RUN}


@pytest.mark.parametrize("key", sorted(BOUNDS))
def test_each_bound_is_range_checked(base: dict[str, str], key: str) -> None:
    b = BOUNDS[key]
    assert getattr(load_config([], {**base, b.env: str(b.maximum)}), key) == b.maximum
    for bad in (str(b.minimum - 1), str(b.maximum + 1), "many"):
        with pytest.raises(ConfigError, match=b.env):
            load_config([], {**base, b.env: bad})


@pytest.mark.parametrize("env, message", [
    ({"CREWFENCE_STATE_FILE": ""}, "CREWFENCE_STATE_FILE is required"),
    ({"CREWFENCE_EPHEMERAL": "1"}, "refused off loopback"),
    ({"CREWFENCE_TOKEN": "", "CREWFENCE_ALLOW_UNAUTHENTICATED": "1"}, "refused off loopback"),
    ({"CREWFENCE_TOKEN": ""}, "no bearer token"),
    ({"CREWFENCE_TOKEN_FILE": "/nonexistent"}, "exclusive"),
    ({"CREWFENCE_ALLOWED_OPERATIONS": "run,fly"}, "unknown operation"),
    ({"CREWFENCE_ALLOWED_OPERATIONS": "train"}, "CREWFENCE_TRAINING_DIR is required"),
    ({"CREWFENCE_PORT": "70000"}, "CREWFENCE_PORT"),
    ({"CREWFENCE_REGISTRY": "nocolon"}, "module:attribute"),
    ({"CREWFENCE_CREWS_FILE": "/nonexistent.yaml"}, "CREWS_FILE"),
    ({"CREWFENCE_EPHEMERAL": "maybe"}, "CREWFENCE_EPHEMERAL"),
    ({"CREWFENCE_POD_UID": "x" * 129}, "CREWFENCE_POD_UID"),
    ({"CREWFENCE_POD_UID": "uid\nforged"}, "CREWFENCE_POD_UID"),
])
def test_refusals(base: dict[str, str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config([], {**base, **env})
    assert "secret-token" not in str(err.value)
    assert "\n" not in str(err.value)


def test_loopback_allows_development_modes(base: dict[str, str]) -> None:
    env = {**base, "CREWFENCE_HOST": "127.0.0.5", "CREWFENCE_EPHEMERAL": "1",
           "CREWFENCE_STATE_FILE": "", "CREWFENCE_TOKEN": "",
           "CREWFENCE_ALLOW_UNAUTHENTICATED": "1"}
    cfg = load_config([], env)
    assert cfg.ephemeral and cfg.allow_unauthenticated and cfg.token is None
    assert load_config(["--host", "::1"], env).host == "::1"


def test_token_file_rules(base: dict[str, str], tmp_path: Path) -> None:
    env = {**base, "CREWFENCE_TOKEN": ""}
    tf = tmp_path / "token"
    tf.write_text("from-file\n")
    tf.chmod(0o644)
    with pytest.raises(ConfigError, match="0600"):
        load_config(["--token-file", str(tf)], env)
    tf.chmod(0o600)
    assert load_config(["--token-file", str(tf)], env).token == "from-file"
    with pytest.raises(ConfigError, match="regular"):
        load_config(["--token-file", str(tmp_path)], env)
    tf.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        load_config(["--token-file", str(tf)], env)


def test_training_dir(base: dict[str, str], tmp_path: Path) -> None:
    train = tmp_path / "train"
    train.mkdir()
    cfg = load_config([], {**base, "CREWFENCE_ALLOWED_OPERATIONS": "train",
                           "CREWFENCE_TRAINING_DIR": str(train)})
    assert cfg.training_dir == train
    with pytest.raises(ConfigError, match="not a directory"):
        load_config([], {**base, "CREWFENCE_TRAINING_DIR": str(train / "missing")})


def test_unknown_flag_is_one_line(base: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="unrecognized"):
        load_config(["--bogus"], base)
