"""The built wheel installs and works from a fresh virtualenv (issue 23, point 2).

`make dist` builds what a user installs. Here the wheel is built the same way
(`python -m build`), installed into a new virtualenv that sees none of this
checkout, first bare (the client and CLI: the server commands say which extra
to add), then with the [server] extra, from which `electric dev` hosts the
examples and takes a spawn and a signal. A missing package-data file or
dependency fails here. Packages come from the registry, as a user's would.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import OutputPump

import electric_sdk

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(600)


def _run(*argv: str | Path, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=540, check=False, env=_env()
    )
    if check:
        assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done


def _env() -> dict[str, str]:
    # Nothing of this checkout's environment: no ELECTRIC_*, no PYTHONPATH into the source tree.
    return {k: v for k, v in os.environ.items() if not k.startswith(("ELECTRIC_", "PYTHON", "VIRTUAL_ENV"))}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("src") / "electric"
    # A copy, so the build's own files (build/, *.egg-info) never land in the checkout under test.
    shutil.copytree(
        ROOT, source, ignore=shutil.ignore_patterns(".venv", ".tools", "node_modules", ".git", "dist")
    )
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", out, source)
    (found,) = out.glob("electric_sdk-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    home = tmp_path_factory.mktemp("venv") / "v"
    _run(sys.executable, "-m", "venv", home)
    _run(home / "bin" / "python", "-m", "pip", "install", "--quiet", wheel)
    return home


def test_the_base_install_is_the_client_and_says_which_extra_serves(venv: Path, tmp_path: Path) -> None:
    version = _run(venv / "bin" / "electric", "--version").stdout.strip()
    assert version == f"electric {electric_sdk.__version__}"
    _run(
        venv / "bin" / "python",
        "-c",
        "from electric_sdk import Client, AsyncClient; from electric_sdk.runtime import App; "
        "from electric_sdk.runtime.metrics import WorkerMetrics",  # a worker's --metrics needs no extra
    )
    server = _run(
        venv / "bin" / "electric", "server", "--listen", "127.0.0.1:0", "--data", tmp_path, check=False
    )
    assert server.returncode == 2, server.stderr
    assert "pip install 'electric-sdk[server]'" in server.stderr
    assert "Traceback" not in server.stderr
    # The MCP face's tools ship in the wheel; serving them needs the [mcp] extra, and says so.
    _run(
        venv / "bin" / "python",
        "-c",
        "from electric_sdk.mcp_face import tool_list; assert len(tool_list()) == 6",
    )
    mcp = _run(venv / "bin" / "electric", "mcp", check=False)
    assert mcp.returncode == 2, mcp.stderr
    assert "pip install 'electric-sdk[mcp]'" in mcp.stderr
    assert "Traceback" not in mcp.stderr


@pytest.fixture
def dev(venv: Path, wheel: Path, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    _run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", f"{wheel}[server]")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")  # the user's own code, beside the install
    proc = subprocess.Popen(
        [
            venv / "bin" / "electric",
            "dev",
            "examples.agents:app",
            "--exec",
            "examples/tasks.toml",
            "--listen",
            "127.0.0.1:0",
            "--data",
            tmp_path / "data",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    output = OutputPump(proc)
    try:
        address = output.wait_for(r"electric server listening on (\S+)", 60).group(1)
        output.wait_for(r"stop: ", 60)
        yield venv / "bin" / "electric", address
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, output.text()
        assert proc.stdout is not None
        proc.stdout.close()


def test_the_server_extra_runs_dev_on_the_examples(dev: tuple[Path, str]) -> None:
    electric, address = dev
    _run(electric, "--address", address, "spawn", "research/w1")
    waited = _run(electric, "--address", address, "wait", "research/w1", "running")
    assert waited.stdout.strip() == "/research/w1 running"
    signalled = _run(electric, "--address", address, "signal", "research/w1", "SIGTERM")
    assert "SIGTERM running → stopping" in signalled.stdout
    _run(electric, "--address", address, "wait", "research/w1", "stopped")
    _run(electric, "--address", address, "spawn", "ticker/t1")  # an exec entity from the TOML file
    assert "/ticker/t1 running" in _run(electric, "--address", address, "wait", "ticker/t1", "running").stdout


@pytest.mark.skipif(shutil.which("npm") is None, reason="Node.js/npm is not installed")
def test_the_typescript_client_installs_from_its_tarball_with_no_build(tmp_path: Path) -> None:
    """`make ts-pack`'s tarball (npm ci and npm pack, built by its prepack) installs into an empty
    project with no build there: no TypeScript compiler is installed, no source comes along."""
    package = tmp_path / "typescript"
    shutil.copytree(
        ROOT / "clients" / "typescript", package, ignore=shutil.ignore_patterns("node_modules", "dist")
    )
    _run("npm", "ci", "--loglevel=error", "--no-audit", "--no-fund", cwd=package)
    _run("npm", "pack", ".", "--pack-destination", str(tmp_path), "--loglevel=error", cwd=package)
    (tarball,) = tmp_path.glob("electric-client-*.tgz")
    project = tmp_path / "project"
    project.mkdir()
    (project / "package.json").write_text('{"name": "project", "version": "1.0.0", "type": "module"}\n')
    _run("npm", "install", "--no-audit", "--no-fund", str(tarball), cwd=project)
    installed = project / "node_modules" / "@electric" / "client"
    assert not (project / "node_modules" / "typescript").exists(), "a compiler came with the client"
    assert [p.name for p in installed.rglob("*.ts") if not p.name.endswith(".d.ts")] == []
    assert not (installed / "src").exists(), "the client's sources came with it"
    shown = _run(
        "node",
        "-e",
        "import('@electric/client').then(m => console.log(typeof m.Signal, typeof m.Code))",
        cwd=project,
    )
    assert shown.stdout.split() == ["object", "object"], shown
