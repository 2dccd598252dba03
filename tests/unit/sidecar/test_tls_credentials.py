"""Secret files: owner-only rule, several tokens during a roll, reload on change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from crewfence_sidecar.config import ConfigError, load_config
from crewfence_sidecar.credentials import (
    CredentialError,
    TokenSource,
    check_owner_only,
    matches,
    read_token_file,
    secret_mode_ok,
)


def _write(path: Path, text: str, mode: int = 0o600) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)
    return path


@pytest.mark.parametrize("mode, ok", [(0o600, True), (0o400, True), (0o604, False),
                                      (0o660, False), (0o644, False), (0o606, False)])
def test_owner_only_rule(tmp_path: Path, mode: int, ok: bool) -> None:
    f = _write(tmp_path / "secret", "x", mode)
    if ok:
        check_owner_only(f, "secret")
    else:
        with pytest.raises(CredentialError, match=f"has {mode:04o}"):
            check_owner_only(f, "secret")


@pytest.mark.parametrize("mode, uid, ok", [
    (0o600, 1000, True), (0o400, 1000, True), (0o640, 1000, False), (0o440, 1000, False),
    # The kubelet's Secret volume under fsGroup: root-owned, defaultMode | 0440.
    (0o640, 0, True), (0o440, 0, True), (0o660, 0, False), (0o644, 0, False),
    (0o650, 0, False), (0o604, 0, False),
])
def test_secret_mode_rule(mode: int, uid: int, ok: bool) -> None:
    assert secret_mode_ok(mode, uid) is ok


def test_symlink_to_an_owner_only_file_is_fine(tmp_path: Path) -> None:
    target = _write(tmp_path / "..data_token", "t")
    (tmp_path / "token").symlink_to(target.name)
    assert read_token_file(tmp_path / "token") == ("t",)


def test_several_tokens_one_per_line(tmp_path: Path) -> None:
    f = _write(tmp_path / "token", "new-token\n\nold-token\nnew-token\n")
    assert read_token_file(f) == ("new-token", "old-token")
    with pytest.raises(CredentialError, match="printable ASCII"):
        read_token_file(_write(f, "with space\n"))
    with pytest.raises(CredentialError, match="empty"):
        read_token_file(_write(f, "\n \n"))


def test_token_source_follows_the_file_and_ignores_a_bad_change(tmp_path: Path) -> None:
    f = _write(tmp_path / "token", "old\n")
    source = TokenSource.from_file(f)
    assert source.current() == (b"old",)
    _write(f, "new\nold\n")
    assert source.current() == (b"new", b"old")
    _write(f, "new\n", mode=0o644)  # breaks the rule: the previous tokens stay
    assert source.current() == (b"new", b"old")
    _write(f, "new\n")
    assert source.current() == (b"new",)


def test_matches_needs_a_non_empty_exact_token() -> None:
    assert matches(b"b", (b"a", b"b"))
    assert not matches(b"", (b"",))
    assert not matches(b"a", ())
    assert not matches(b"ab", (b"a",))


def test_config_accepts_a_multi_line_token_file(tmp_path: Path) -> None:
    crews = tmp_path / "crews.yaml"
    crews.write_text("crews: {}\n")
    f = _write(tmp_path / "token", "first\nsecond\n")
    cfg = load_config([], {"CREWFENCE_CREWS_FILE": str(crews), "CREWFENCE_HOST": "127.0.0.1",
                           "CREWFENCE_STATE_FILE": str(tmp_path / "s/j.db"),
                           "CREWFENCE_TOKEN_FILE": str(f)})
    assert cfg.token == "first" and cfg.token_file == f
    assert "first" not in repr(cfg)


def test_config_refuses_plaintext_off_loopback(tmp_path: Path) -> None:
    crews = tmp_path / "crews.yaml"
    crews.write_text("crews: {}\n")
    env = {"CREWFENCE_CREWS_FILE": str(crews), "CREWFENCE_TOKEN": "t",
           "CREWFENCE_STATE_FILE": str(tmp_path / "s/j.db"), "CREWFENCE_HOST": "10.1.2.3"}
    with pytest.raises(ConfigError, match=r"refusing plain HTTP on 10\.1\.2\.3"):
        load_config([], env)
    assert load_config([], {**env, "CREWFENCE_INSECURE_PLAINTEXT": "1"}).insecure_plaintext
    assert not load_config([], {**env, "CREWFENCE_HOST": "127.0.0.9"}).tls


def test_llm_api_key_from_a_file_named_by_the_env_convention(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from crewfence_sidecar.offline_llm import resolve_llm

    key_file = _write(tmp_path / "llm-api-key", "sk-from-file\n")
    monkeypatch.delenv("CREWFENCE_LLM_API_KEY", raising=False)
    monkeypatch.setenv("CREWFENCE_LLM_API_KEY_FILE", str(key_file))
    llm = resolve_llm("openai/gpt-4o-mini", "CREWFENCE_LLM_API_KEY",
                      base_url="http://127.0.0.1:9/v1")
    assert llm.api_key == "sk-from-file"
    _write(key_file, "sk-from-file\n", mode=0o644)
    with pytest.raises(ValueError, match="must have mode 0600") as err:
        resolve_llm("openai/gpt-4o-mini", "CREWFENCE_LLM_API_KEY")
    assert "sk-from-file" not in str(err.value)
    monkeypatch.delenv("CREWFENCE_LLM_API_KEY_FILE")
    with pytest.raises(ValueError, match="is not set"):
        resolve_llm("openai/gpt-4o-mini", "CREWFENCE_LLM_API_KEY")


def test_declarative_llm_api_key_file(tmp_path: Path) -> None:
    from crewfence_sidecar.declarative import DefinitionError, parse_crews_document

    crew = {"agents": {"a": {"role": "R", "goal": "G", "backstory": "B"}},
            "tasks": [{"name": "t", "agent": "a", "description": "D", "expected_output": "E"}]}
    parsed = parse_crews_document({"crews": {"c": {**crew, "llm": {
        "model": "openai/gpt-4o-mini", "apiKeyFile": "/etc/crewfence/credentials/k"}}}})
    assert parsed["c"].llm.api_key_file == "/etc/crewfence/credentials/k"
    with pytest.raises(DefinitionError, match="exclusive"):
        parse_crews_document({"crews": {"c": {**crew, "llm": {
            "model": "openai/gpt-4o-mini", "api_key_file": "/k", "api_key_env": "K"}}}})
