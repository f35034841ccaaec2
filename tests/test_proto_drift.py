"""The committed code under electric_sdk/_proto/ is exactly what proto/ generates.

`scripts/genproto.py --check` passes on the repository, fails once a .proto
changes without regenerating, and every generated module imports.
"""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import electric_sdk._proto

ROOT = Path(__file__).resolve().parent.parent
GENPROTO = Path("scripts") / "genproto.py"


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / GENPROTO), "--check"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """proto/, scripts/ and the committed generated code, copied: genproto's root is its parent folder."""
    ignore = shutil.ignore_patterns("__pycache__")
    for part in ("proto", "scripts", "electric_sdk/_proto"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=ignore)
    return tmp_path


def test_committed_code_matches_proto() -> None:
    result = check(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "generated code matches proto/" in result.stdout


def test_unmodified_copy_passes(repo_copy: Path) -> None:
    result = check(repo_copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_changed_proto_is_drift(repo_copy: Path) -> None:
    types = repo_copy / "proto" / "electric" / "v1" / "types.proto"
    text = types.read_text()
    anchor = "message EntityRef {\n  string type = 1;\n  string id = 2;\n"
    assert anchor in text
    types.write_text(text.replace(anchor, anchor + "  string drift_probe = 3;\n"))

    result = check(repo_copy)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "drifted from proto/" in result.stderr
    assert "committed/electric/v1/types_pb2.py" in result.stdout
    assert "drift_probe" in result.stdout  # the diff names the new field (in the .pyi stub)
    # --check never writes: the committed copy is untouched.
    assert (repo_copy / "electric_sdk/_proto").exists()
    assert "drift_probe" not in (repo_copy / "electric_sdk/_proto/electric/v1/types_pb2.pyi").read_text()


def test_removed_generated_file_is_drift(repo_copy: Path) -> None:
    (repo_copy / "electric_sdk/_proto/electric/v1/types_pb2_grpc.py").unlink()
    result = check(repo_copy)
    assert result.returncode == 1
    assert "generated/electric/v1/types_pb2_grpc.py" in result.stdout


def test_every_generated_module_imports() -> None:
    names = [
        m.name for m in pkgutil.walk_packages(electric_sdk._proto.__path__, prefix="electric_sdk._proto.")
    ]
    modules = [n for n in names if n.startswith("electric_sdk._proto.electric.v1.")]
    protos = sorted(p.stem for p in (ROOT / "proto" / "electric" / "v1").glob("*.proto"))
    assert protos, "no protos found"
    assert sorted(modules) == sorted(
        f"electric_sdk._proto.electric.v1.{stem}{suffix}"
        for stem in protos
        for suffix in ("_pb2", "_pb2_grpc")
    )
    for name in names:
        module = importlib.import_module(name)
        assert module.__name__ == name
    from electric_sdk._proto.electric.v1 import entity_service_pb2, types_pb2

    assert entity_service_pb2.DESCRIPTOR.services_by_name["EntityService"].full_name == (
        "electric.v1.EntityService"
    )
    assert types_pb2.DESCRIPTOR.package == "electric.v1"
