"""``links``: a devices file's links measured on a Ray cluster, through the pipeline's own transport.

A module of its own, so that ``links`` loads neither onnx nor the model and pipeline code (``run``'s and
``inspect``'s); named apart from the function, whose name a submodule's would hide
(:mod:`onnxpipe.core.lazy`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnxpipe.api.paths import check_output_file
from onnxpipe.cluster.devicesfile import load_cluster, with_links
from onnxpipe.core.errors import UsageError
from onnxpipe.core.events import SILENT, Listener
from onnxpipe.core.files import write_text_atomic
from onnxpipe.core.options import opt
from onnxpipe.manifest import load_manifest
from onnxpipe.runtime.backends.ray_connect import connected
from onnxpipe.runtime.backends.ray_links import measure_links
from onnxpipe.runtime.backends.ray_resources import load_ray_resources
from onnxpipe.runtime.options import DEFAULT_LINK_SIZES, LinkOptions
from onnxpipe.runtime.report.links import LinkReport, LinkResult


def links(
    devices: str | Path, options: LinkOptions | None = None, *, listener: Listener | None = None
) -> LinkReport:
    """Measure the link between each pair of consecutive devices of the devices file ``devices``, on the
    Ray nodes the devices' resources pin a probe to (:mod:`onnxpipe.runtime.backends.ray_links`), and
    write the file again with them when ``options.out`` says where."""
    say = listener or SILENT
    opts = options or LinkOptions()
    path = Path(devices)
    cluster = load_cluster(path)
    k = len(cluster.devices)
    if k < 2:
        raise UsageError(f"{path}: has one device, so no link to measure; list the devices in pipeline order")
    if opts.out is not None:
        check_output_file(opts.out, "out")
    asks = _probe_options(opts.ray_resources, k)
    if all(not a.get("resources") for a in asks):
        say.warn(
            f"no device names Ray resources ({opt('ray_resources')}): the probes land wherever Ray puts "
            "them, not on the devices' nodes"
        )
    sizes = _sizes(opts, k)
    say.step(f"measuring {k - 1} link(s) at {len({n for s in sizes for n in s}) + 1} size(s)")
    with connected(opts.ray_address) as ray:
        measured = measure_links(ray, asks, sizes, opts.repeats)
    names = [d.name for d in cluster.devices]
    results = tuple(LinkResult(names[i], names[i + 1], m) for i, m in enumerate(measured))
    if opts.out is not None:
        text, _ = with_links(path, [r.link_obj() for r in results])
        write_text_atomic(opts.out, text)
    return LinkReport(results, opts.out)


def _probe_options(given: Path | Sequence[Mapping[str, Any]] | None, k: int) -> list[dict[str, Any]]:
    """Each device's probe's actor options: the device's custom resources (its node), no CPU."""
    if isinstance(given, Path):
        entries: Sequence[Mapping[str, Any]] = load_ray_resources(given, k)
    else:
        entries = given if given is not None else [{}] * k
    if len(entries) != k:
        raise UsageError(
            f"{opt('ray_resources')}: {len(entries)} entries for {k} devices; give one per device"
        )
    return [{"num_cpus": 0, "resources": dict(e.get("resources", {}))} for e in entries]


def _sizes(opts: LinkOptions, k: int) -> list[tuple[int, ...]]:
    """The sizes each link is timed at: the split's boundary between the stages on its two devices, or
    the sizes given, or the defaults."""
    if opts.split is None:
        return [opts.sizes or DEFAULT_LINK_SIZES] * (k - 1)
    manifest = load_manifest(opts.split, check_files=False)
    out: list[tuple[int, ...]] = []
    for i in range(k - 1):
        crossing = manifest.stages[i + 1].link_bytes_in if i + 1 < manifest.k else 0
        out.append((crossing,) if crossing > 0 else DEFAULT_LINK_SIZES)
    return out
