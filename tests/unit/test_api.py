"""The public facade: every name in ``__all__`` resolves, lazily."""

from __future__ import annotations

import onnxpipe


def test_every_public_name_resolves() -> None:
    for name in onnxpipe.__all__:
        assert getattr(onnxpipe, name) is not None, name


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        onnxpipe.no_such_thing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_no_public_name_is_a_submodule() -> None:
    """Importing a submodule sets the package attribute of its name, hiding a function called the same."""
    from pathlib import Path

    package = Path(onnxpipe.__file__).parent
    clashes = [n for n in onnxpipe.__all__ if (package / f"{n}.py").exists() or (package / n).is_dir()]
    assert clashes == []


def test_verify_survives_importing_every_module() -> None:
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(onnxpipe.__path__, "onnxpipe."):
        if "ray" in info.name:
            continue
        importlib.import_module(info.name)
    assert callable(onnxpipe.verify) and callable(onnxpipe.split)
