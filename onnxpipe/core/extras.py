"""How to install an optional part of onnxpipe, worded once for every message that needs one.

``pip install 'onnxpipe[text]'`` installs the extra from a package index; someone who installed from a
source checkout (the README's ``pip install .``) needs ``pip install '.[text]'`` instead, which the
first form would not do (it fetches onnxpipe from the index, or fails).  Every hint says both.
"""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """``pip install 'onnxpipe[EXTRA]' (or '.[EXTRA]' in a source checkout)``."""
    return f"pip install 'onnxpipe[{extra}]' (or '.[{extra}]' in a source checkout)"
