"""The unit lane's rule, enforced: no test here opens an onnxruntime session or starts a process.

That is what keeps the lane at about a minute (``pytest tests/unit``), to be run after every edit.  A
test that needs onnxruntime or a subprocess belongs in ``tests/integration`` or ``tests/e2e``; one that
tries here fails with that advice, whether the test itself or a fixture it uses does it.
"""

from __future__ import annotations

import multiprocessing.process
import subprocess
from collections.abc import Iterator
from typing import Any

# matplotlib (in the test extra) builds its font cache on first use by running fc-list: on a fresh machine
# that would be the first plotting test's subprocess.  Built here, before the rule is in force, the cache
# is a hit for every test after.
import matplotlib.font_manager  # noqa: F401
import onnxruntime
import pytest

_ACTIVE = [False]
_SESSION = onnxruntime.InferenceSession.__init__
_POPEN = subprocess.Popen.__init__
_START = multiprocessing.process.BaseProcess.start


def _refuse(what: str) -> None:
    if _ACTIVE[0]:
        raise AssertionError(f"a unit test {what}; move the test to tests/integration or tests/e2e")


def _session(self: Any, *args: Any, **kwargs: Any) -> None:
    _refuse("opened an onnxruntime session")
    _SESSION(self, *args, **kwargs)


def _popen(self: Any, *args: Any, **kwargs: Any) -> None:
    _refuse("started a subprocess")
    _POPEN(self, *args, **kwargs)


def _start(self: Any) -> None:
    _refuse("started a process")
    _START(self)


onnxruntime.InferenceSession.__init__ = _session  # type: ignore[method-assign]
subprocess.Popen.__init__ = _popen  # type: ignore[method-assign]
multiprocessing.process.BaseProcess.start = _start  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """From the first fixture a unit test sets up to its teardown, sessions and processes are refused."""
    _ACTIVE[0] = True
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    _ACTIVE[0] = False
