"""The default code version covers the app's own package (or the files beside a single-module
app), not only the module that defines the entity: editing a ``prompts.py`` it imports is a new
version, so a SIGHUP'd entity wakes on the new code."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from electric_sdk.runtime import App

APP = textwrap.dedent(
    """
    from electric_sdk.runtime import App, Context, Message

    from {prompts} import SYSTEM

    app = App()


    @app.entity("agent")
    async def agent(ctx: Context, message: Message) -> None:
        ctx.output.write(SYSTEM)
    """
)


@pytest.fixture
def imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Names of modules the test imports from ``tmp_path``: forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []
    yield names
    for name in names:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()


def load(name: str, imported: list[str]) -> App:
    importlib.invalidate_caches()
    module = importlib.import_module(name)
    top = name.partition(".")[0]
    imported.extend(n for n in list(sys.modules) if n.partition(".")[0] == top)
    app = module.app
    assert isinstance(app, App)
    return app


def test_editing_a_module_of_the_package_changes_the_version(tmp_path: Path, imported: list[str]) -> None:
    package = tmp_path / "cv_agentpkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "prompts.py").write_text('SYSTEM = "be brief"\n')
    (package / "main.py").write_text(APP.format(prompts="cv_agentpkg.sub.prompts"))
    (tmp_path / "unrelated.py").write_text("X = 1\n")
    app = load("cv_agentpkg.main", imported)
    before = app.code_version
    assert len(before) == 12
    assert before != "dev"

    (tmp_path / "unrelated.py").write_text("X = 2\n")  # outside the package: not the app's code
    assert app.code_version == before
    (package / "sub" / "prompts.py").write_text('SYSTEM = "be thorough"\n')
    edited = app.code_version
    assert edited != before
    (package / "sub" / "prompts.py").write_text('SYSTEM = "be brief"\n')
    assert app.code_version == before  # the same code is the same version


def test_a_single_module_app_covers_the_files_beside_it(tmp_path: Path, imported: list[str]) -> None:
    (tmp_path / "cv_prompts.py").write_text('SYSTEM = "be brief"\n')
    (tmp_path / "cv_solo.py").write_text(APP.format(prompts="cv_prompts"))
    app = load("cv_solo", imported)
    before = app.code_version
    (tmp_path / "cv_prompts.py").write_text('SYSTEM = "be thorough"\n')
    assert app.code_version != before


def test_a_given_code_version_overrides_the_hash(tmp_path: Path, imported: list[str]) -> None:
    (tmp_path / "cv_prompts2.py").write_text('SYSTEM = "x"\n')
    (tmp_path / "cv_pinned.py").write_text(
        APP.format(prompts="cv_prompts2").replace("App()", 'App(code_version="v42")')
    )
    app = load("cv_pinned", imported)
    (tmp_path / "cv_prompts2.py").write_text('SYSTEM = "y"\n')
    assert app.code_version == "v42"
