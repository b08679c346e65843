"""Process workers' start-up data: the caller's ``__main__`` is never named to a child."""

from __future__ import annotations

import sys
from multiprocessing import spawn

import pytest

from onnxpipe.runtime.backends.processes import MAIN_KEYS, WORKERS, WorkerProcess, preparation_data


@pytest.mark.parametrize(
    ("spec_name", "file"), [("pytest.__main__", None), (None, "/somewhere/user_script.py"), (None, "<stdin>")]
)
def test_preparation_data_names_no_main_module(
    monkeypatch: pytest.MonkeyPatch, spec_name: str | None, file: str | None
) -> None:
    """Whatever ``__main__`` is (``python -m``, a script, ``python -``), spawn would name it; ours does not,
    and keeps everything else spawn sends (paths, working folder, authkey)."""
    main = type(sys)("__main__")
    main.__spec__ = None if spec_name is None else type("Spec", (), {"name": spec_name})()
    if file is not None:
        main.__file__ = file
    monkeypatch.setitem(sys.modules, "__main__", main)
    theirs = spawn.get_preparation_data("w")
    assert set(MAIN_KEYS) & set(theirs), "spawn names the main module: the case this guards against"
    ours = preparation_data("w")
    assert not set(MAIN_KEYS) & set(ours)
    assert ours == {k: v for k, v in theirs.items() if k not in MAIN_KEYS}


def test_the_workers_context_makes_worker_processes() -> None:
    process = WORKERS.Process(target=print, daemon=True)
    assert isinstance(process, WorkerProcess)
    assert WORKERS.get_start_method() == "spawn"
