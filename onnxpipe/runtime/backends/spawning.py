"""A ``spawn`` start method whose children never import the caller's ``__main__``.

multiprocessing's ``spawn`` (and ``forkserver``) make each child run the parent's main script again (as
``__mp_main__``) before it unpickles its target, so that functions defined there can be found.  A worker
of ours needs nothing from it (its target and arguments live in onnxpipe), and running it again breaks
the ways people run examples: a script without ``if __name__ == "__main__":`` starts the pipeline again in
every child (multiprocessing's bootstrapping ``RuntimeError``, then an ``EOFError`` in the parent), and
``python -`` gives the child a main file named ``<stdin>`` that does not exist.  So our children are
launched exactly as ``spawn`` launches them, with the two keys that name the main module left out of the
preparation data they read first (:func:`multiprocessing.spawn.prepare` then leaves ``__main__`` alone).

:meth:`_WorkerPopen._launch` is the standard library's ``popen_spawn_posix.Popen._launch`` (the same in
Python 3.11 to 3.13) with that one change; it is copied, not wrapped, because the preparation data is
made and written inside it.
"""

from __future__ import annotations

import io
import os
from multiprocessing import context, popen_spawn_posix, process, reduction, resource_tracker, spawn, util
from typing import Any

MAIN_KEYS = ("init_main_from_name", "init_main_from_path")
"""The preparation data's keys that make a spawned child import the parent's main module."""


def preparation_data(name: str) -> dict[str, Any]:
    """What ``spawn`` sends a child before its process object (paths, working folder, authkey, ...), less
    the caller's main module."""
    data: dict[str, Any] = spawn.get_preparation_data(name)
    for key in MAIN_KEYS:
        data.pop(key, None)
    return data


class _WorkerPopen(popen_spawn_posix.Popen):
    def _launch(self, process_obj: Any) -> None:
        fds: list[int] = self._fds  # type: ignore[attr-defined]  # set by Popen; typeshed omits it
        tracker_fd = resource_tracker.getfd()
        assert tracker_fd is not None  # getfd() starts the tracker first
        fds.append(tracker_fd)
        prep_data = preparation_data(process_obj._name)
        fp = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            context.set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            fds.extend([child_r, child_w])
            self.pid = util.spawnv_passfds(os.fsencode(spawn.get_executable()), cmd, fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            mine = tuple(fd for fd in (parent_r, parent_w) if fd is not None)
            self.finalizer = util.Finalize(self, util.close_fds, mine)  # type: ignore[attr-defined]  # typeshed omits it
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)


class WorkerProcess(context.SpawnProcess):
    """A ``spawn`` process that does not run the caller's main module again (see the module docstring)."""

    @staticmethod
    def _Popen(process_obj: process.BaseProcess) -> _WorkerPopen:
        return _WorkerPopen(process_obj)


class WorkerContext(context.SpawnContext):
    """The context of :class:`WorkerProcess`: its ``Process``, and the rest (``Pipe``, ...) as ``spawn``'s."""

    Process = WorkerProcess


WORKERS = WorkerContext()
"""The context worker processes are started from."""
