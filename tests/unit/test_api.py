"""The public facade: every name in ``__all__`` resolves, lazily."""

from __future__ import annotations

import pytest

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


def test_options_refuse_what_cannot_work_together_when_they_are_made() -> None:
    """Issue 36: a request is checked once, when its options are made (and again when ``replace`` makes
    new ones), so that no door, planner or runtime holds an unchecked one."""
    import dataclasses

    import pytest

    from onnxpipe.api import (
        CalibrationOptions,
        DecoderOptions,
        LinkOptions,
        PlanRequest,
        ProfileOptions,
        RunOptions,
        SplitOptions,
        VerifyOptions,
    )
    from onnxpipe.core.errors import UsageError

    made = {
        "`slots=0`": lambda: RunOptions(slots=0),
        "`repeats=0`": lambda: LinkOptions(repeats=0),
        "`runs=0`": lambda: VerifyOptions(runs=0),
        "`stages=0`": lambda: PlanRequest(0),
        "`max_context=0`": lambda: DecoderOptions(max_context=0),
        "`warmup=-1`": lambda: ProfileOptions(warmup=-1),
        "`CalibrationOptions.rounds=-1`": lambda: CalibrationOptions(rounds=-1),
        "`atol=-1.0`": lambda: SplitOptions(out="o", plan=PlanRequest(2), atol=-1.0),
        "`split_nodes=auto`": lambda: SplitOptions(
            out="o",
            plan=PlanRequest(2, split_nodes="auto"),  # type: ignore[arg-type]
            calibration=CalibrationOptions(rounds=1),
        ),
    }
    for names, make in made.items():
        with pytest.raises(UsageError) as info:
            make()
        assert names in str(info.value), (names, str(info.value))
    with pytest.raises(UsageError, match="`slots=0`"):
        dataclasses.replace(RunOptions(), slots=0)


def test_the_facade_lists_its_names_as_type_checkers_read_them() -> None:
    """``from onnxpipe import *`` gives a type checker (mypy, an IDE) the names of ``__all__`` only when
    ``__all__`` is a list of string literals; a computed one (``sorted([*_EXPORTS])``) gives it none.
    So the facade writes its names out, and they must be the ones it resolves at run time."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(str(onnxpipe.__file__)).read_text())
    (listed,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]
    ]
    assert isinstance(listed, ast.List)
    names = [e.value for e in listed.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    assert len(names) == len(listed.elts)
    assert set(names) == set(onnxpipe._EXPORTS) | {"__version__"} == set(onnxpipe.__all__)


@pytest.mark.parametrize("facade", ["onnxpipe", "onnxpipe.api"])
def test_what_a_type_checker_reads_is_what_the_facade_gives(facade: str) -> None:
    """A facade says each public name twice: in the lazy table the run time reads (``_EXPORTS``) and as
    an import under ``if TYPE_CHECKING:`` that mypy and an IDE read.  The two must name the same things,
    and each import must reach the very object the facade hands out, or a user's editor and their
    program disagree about what ``onnxpipe.split`` is."""
    import ast
    import importlib
    from pathlib import Path

    module = importlib.import_module(facade)
    tree = ast.parse(Path(str(module.__file__)).read_text())
    (guarded,) = [
        node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    typed = {
        alias.asname or alias.name: node.module
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert set(typed) == set(module._EXPORTS)
    for name, source in typed.items():
        assert source is not None
        assert getattr(importlib.import_module(source), name) is getattr(module, name), name
