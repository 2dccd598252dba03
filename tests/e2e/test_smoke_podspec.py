"""Pure parts of the pod runner: path rewriting, $(VAR) expansion, fsGroup permissions.
(No cluster needed; these pin the rules the e2e pods rely on.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from harness.podspec import Mount, apply_fs_group, expand, rewrite

MOUNTS = [
    Mount("/var/lib/crewfence", Path("/tmp/pvc"), False),
    Mount("/var/lib/crewfence/training", Path("/h/train"), False),
    Mount("/tmp", Path("/h/tmp"), False),
]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/var/lib/crewfence/journal/journal.db", "/tmp/pvc/journal/journal.db"),
        ("/var/lib/crewfence", "/tmp/pvc"),
        ("--state=/var/lib/crewfence/j.db", "--state=/tmp/pvc/j.db"),
        ("/var/lib/crewfence/training/a", "/h/train/a"),  # the longest mount wins
        ("/var/lib/crewfencex", "/var/lib/crewfencex"),  # not a path boundary
        ("x/var/lib/crewfence", "x/var/lib/crewfence"),
        ("/tmp", "/h/tmp"),
        ("a:/tmp/b", "a:/h/tmp/b"),
    ],
)
def test_mount_paths_are_rewritten_at_path_boundaries(value: str, expected: str) -> None:
    assert rewrite(value, MOUNTS) == expected


def test_rewriting_is_one_pass() -> None:
    # /var/lib/crewfence -> /tmp/pvc must not then be rewritten by the /tmp mount.
    assert rewrite("/var/lib/crewfence/x", MOUNTS) == "/tmp/pvc/x"


def test_dollar_paren_expansion_follows_kubernetes() -> None:
    env = {"A": "1"}
    assert expand("$(A)-$$(A)-$(B)", env) == "1-$(A)-$(B)"


def test_fs_group_gives_kubelet_permissions(tmp_path: Path) -> None:
    gid = os.getgid()  # a group we may chown to without privileges
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o755)
    token = secret / "token"
    token.write_text("x")
    token.chmod(0o600)
    apply_fs_group(secret, gid, read_only=True)
    assert stat.S_IMODE(token.stat().st_mode) == 0o640  # 0600 | 0440
    assert stat.S_IMODE(secret.stat().st_mode) == 0o2755 | 0o550
    claim = tmp_path / "claim"
    claim.mkdir()
    claim.chmod(0o770)
    apply_fs_group(claim, gid, read_only=False)
    assert stat.S_IMODE(claim.stat().st_mode) == 0o2770
    assert claim.stat().st_gid == gid


def test_on_root_mismatch_leaves_a_prepared_volume_alone(tmp_path: Path) -> None:
    gid = os.getgid()
    claim = tmp_path / "claim"
    claim.mkdir()
    claim.chmod(0o770)
    journal_dir = claim / "journal"
    journal_dir.mkdir(mode=0o700)
    apply_fs_group(claim, gid, read_only=False, change_policy="OnRootMismatch")
    assert stat.S_IMODE(claim.stat().st_mode) == 0o2770
    # The sidecar tightens its own folder after the first mount; a remount must keep that.
    journal_dir.chmod(0o700)
    apply_fs_group(claim, gid, read_only=False, change_policy="OnRootMismatch")
    assert stat.S_IMODE(journal_dir.stat().st_mode) == 0o700
    apply_fs_group(claim, gid, read_only=False)  # the default policy (Always) walks the tree
    assert stat.S_IMODE(journal_dir.stat().st_mode) == 0o2770
