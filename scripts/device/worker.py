"""A benchmark worker for one vLLM tree, kept alive for the whole run.

    PYTHONPATH=TREE:SITE python3 worker.py --tree NAME --result-fd FD

It imports vLLM once (about 20 s), says ``ready`` on FD, then answers one JSON
command per stdin line with one JSON line on FD (vLLM logs to stdout, so
results take their own pipe).  The orchestrator keeps one worker per tree and
sends them commands in turn: base and series configurations are measured side
by side, interleaved, in the same run.

Two things are done to the process, both also done by vLLM's own InstantTensor
tests or invisible to the code under test:

- ``current_platform.is_cuda`` / ``is_cuda_alike`` / ``current_device`` are
  set to the CUDA answers: a source tree has no package metadata, so vLLM's
  platform detection finds no platform plugin (see shared/device-notes.md).
  Everything the loader then does runs for real on the GPU.
- ``instanttensor.safe_open`` is replaced by a subclass that records the
  buffer size, chunk size, concurrency, backend and ``copy`` argument of each
  reader after InstantTensor resolved them (the ring is not a torch
  allocation, so this is how its size is read; ``mem_get_info`` confirms it).

With ``--device cpu`` (the tooling tests), the series' pinned host staging
reads into ordinary memory, as the series' own CPU tests do: pinning needs a
GPU, and the code path is the same.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import inspect
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

READERS: list[dict] = []
STATE: dict = {"dests_dir": None, "dests": None, "refs_dir": None, "refs": None}

# "cuda" on the GPU machine.  "cpu" exists for the tooling tests only: it runs
# the same code paths on CPU with a stand-in instanttensor module, so a broken
# script is found before device time is spent on it.
DEVICE = "cuda"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def empty_cache() -> None:
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def reset_peak() -> None:
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()


def allocated() -> int:
    return torch.cuda.memory_allocated() if DEVICE == "cuda" else 0


def max_allocated() -> int:
    return torch.cuda.max_memory_allocated() if DEVICE == "cuda" else 0


def install_reader_recorder() -> None:
    import instanttensor
    from instanttensor import _impl

    base_cls = _impl.safe_open

    class RecordingSafeOpen(base_cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            READERS.append(
                {
                    "buffer_size": self.buffer_size,
                    "chunk_size": self.chunk_size,
                    "concurrency": self.concurrency,
                    "io_depth": self.io_depth,
                    "backend": self.backend.name,
                    "copy": self.copy,
                    "n_tensors": len(self.ordered_tensor_metadatas),
                    "largest_tensor": max(getattr(self, "tensor_sizes", ()), default=None),
                    "total_tensor_size": self.total_tensor_size,
                    "buffer_size_arg": kwargs.get("buffer_size"),
                    "tensor_filter": kwargs.get("tensor_filter") is not None,
                }
            )

    instanttensor.safe_open = RecordingSafeOpen


def set_env(env: dict | None) -> None:
    for key in common.MANAGED_ENV:
        os.environ.pop(key, None)
    if chunk := os.environ.get(common.SMALL_CHUNK_ENV):
        os.environ["INSTANTTENSOR_CHUNK_SIZE"] = chunk
    for key, value in (env or {}).items():
        os.environ[key] = str(value)


def headers(folder: str) -> dict[str, tuple[str, list[int], str]]:
    """name -> (file, shape, safetensors dtype) for the files of the index."""
    index = json.loads((Path(folder) / "model.safetensors.index.json").read_text())
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        path = str(Path(folder) / file)
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        for name, meta in header.items():
            out[name] = (path, meta["shape"], meta["dtype"])
    return out


@functools.cache
def names_in(folder: str) -> frozenset[str]:
    return frozenset(headers(folder))


def as_bytes(t):
    return t.detach().reshape(-1).view(torch.uint8)


def torch_dtype(name: str):
    return {
        "BF16": torch.bfloat16,
        "F16": torch.float16,
        "F32": torch.float32,
        "F64": torch.float64,
        "F8_E4M3": torch.float8_e4m3fn,
        "I64": torch.int64,
        "I32": torch.int32,
        "I16": torch.int16,
        "I8": torch.int8,
        "U8": torch.uint8,
        "BOOL": torch.bool,
    }[name]


def dests_for(folder: str) -> dict:
    """Preallocated GPU parameters for a checkpoint (one checkpoint at a time):
    the consumer copies every yielded tensor into its parameter, as a weight
    loader does, so GPU and CPU-fallback tensors pay the same final copy."""
    drop_references(keep=folder)
    if STATE["dests_dir"] != folder:
        STATE["dests"] = None
        empty_cache()
        STATE["dests"] = {
            name: torch.empty(shape, dtype=torch_dtype(dtype), device=DEVICE)
            for name, (_, shape, dtype) in headers(folder).items()
        }
        STATE["dests_dir"] = folder
    return STATE["dests"]


def make_loader(load_format: str, extra: dict | None = None):
    config = LoadConfig(
        load_format=load_format, use_tqdm_on_load=False, model_loader_extra_config=dict(extra or {})
    )
    return DefaultModelLoader(config)


def weights(folder: str, load_format: str, extra: dict | None = None):
    loader = make_loader(load_format, extra)
    source = DefaultModelLoader.Source(folder, None)
    return loader._get_weights_iterator(source)


def used_bytes() -> int:
    if DEVICE != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info()
    return total - free


def host_bytes() -> int:
    """This process's resident host memory (pinned arenas included once read)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


PIECES_NAMES = ("_pieced_tensors", "PIECES_PER_RING", "_open_in_pieces")


def has_pieces() -> bool:
    """Whether this tree streams large tensors in pieces (the v4/v5 series with
    "large tensors stream through a bounded ring in pieces"): the series
    after it dropped that patch, and the base, have none of its names."""
    return all(hasattr(weight_utils, name) for name in PIECES_NAMES)


@contextlib.contextmanager
def pieces(setting):
    """How a tree with pieces streams tensors above a quarter of the bound:
    ``"off"`` whole (its bounded path before pieces), an int n in pieces of at
    most the bound // n, ``None`` as the tree does.  A tree without pieces
    (``has_pieces``) is left as it is; yields whether the setting was applied."""
    if setting is None or not has_pieces():
        yield False
        return
    saved = (weight_utils._pieced_tensors, weight_utils.PIECES_PER_RING)
    if setting == "off":
        weight_utils._pieced_tensors = lambda shards, names, buffer_size: {}
    else:
        weight_utils.PIECES_PER_RING = int(setting)
    try:
        yield True
    finally:
        weight_utils._pieced_tensors, weight_utils.PIECES_PER_RING = saved


PINNED_READ_NAMES = ("PINNED_READ_THREADS", "PINNED_READ_CHUNK_BYTES")


def has_pinned_read_constants() -> bool:
    """Whether the tree's pinned reader takes its threads and chunk size from
    module constants (the series since v5-split: ``_PinnedReader(shards,
    reads, pinned_bytes)``) rather than from arguments (before it)."""
    return all(hasattr(weight_utils, name) for name in PINNED_READ_NAMES)


@contextlib.contextmanager
def pinned_read(threads: int | None = None, chunk_bytes: int | None = None):
    """The series' pinned reader with ``threads`` threads reading in chunks
    of ``chunk_bytes`` (None: as the tree has it), for the duration: its
    module constants are set (a reader takes the threads when it is made,
    the chunk size at each read, so the whole load runs inside).  A tree
    without the constants is left as it is; yields whether they were set."""
    if (threads is None and chunk_bytes is None) or not has_pinned_read_constants():
        yield False
        return
    saved = (weight_utils.PINNED_READ_THREADS, weight_utils.PINNED_READ_CHUNK_BYTES)
    if threads is not None:
        weight_utils.PINNED_READ_THREADS = int(threads)
    if chunk_bytes is not None:
        weight_utils.PINNED_READ_CHUNK_BYTES = int(chunk_bytes)
    try:
        yield True
    finally:
        weight_utils.PINNED_READ_THREADS, weight_utils.PINNED_READ_CHUNK_BYTES = saved


def reference_tensor(path: str, name: str):
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        return f.get_tensor(name)


def references(folder: str) -> dict:
    """name -> the file's tensor as safetensors reads it, on the device, for
    one checkpoint at a time: read once per worker and checkpoint, so that
    every verified load of a checkpoint compares each tensor, bitwise, with
    the file's bytes without reading the file again (9 GiB a time)."""
    if STATE.get("refs_dir") != folder:
        STATE["refs"] = None
        empty_cache()
        STATE["refs"] = {
            name: reference_tensor(path, name).to(DEVICE)
            for name, (path, _shape, _dtype) in headers(folder).items()
        }
        STATE["refs_dir"] = folder
    return STATE["refs"]


def drop_references(keep: str | None = None) -> None:
    if STATE.get("refs_dir") not in (None, keep):
        STATE["refs"] = STATE["refs_dir"] = None
        empty_cache()


# --- operations ------------------------------------------------------------------


def op_info(cmd: dict) -> dict:
    import importlib.metadata as md

    import vllm

    on_gpu = DEVICE == "cuda"

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    return {
        "vllm_file": vllm.__file__,
        "has_pieces": has_pieces(),
        # Whether the loader takes "instanttensor_copy" (borrowed mode): the base
        # and a series prefix before the borrowed-mode patch reject the key.
        "copy_option": "instanttensor_copy" in getattr(weight_utils, "INSTANTTENSOR_SETTINGS", ()),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if on_gpu else None,
        "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory if on_gpu else None,
        "instanttensor": version("instanttensor"),
        "instanttensor_file": sys.modules["instanttensor"].__file__,
        "safetensors": version("safetensors"),
        "transformers": version("transformers"),
        "python": sys.version.split()[0],
    }


@contextlib.contextmanager
def retention_check(enabled: bool):
    """With ``enabled`` false, the series' handling of borrowed tensors (their
    release where InstantTensor moves past them and the check of what still
    refers to their storage) is replaced by a pass-through that only marks
    them, for the duration (to measure its cost).  A tree without it is left
    as it is.  Yields whether it was switched off, so that a renamed function
    cannot pass for a disabled one."""
    names = ("_borrowed_views",)
    originals = {name: getattr(weight_utils, name, None) for name in names}
    if enabled or None in originals.values():
        yield False
        return

    def marked(weights):
        for name, tensor in weights:
            setattr(tensor, weight_utils.BORROWED_WEIGHT_ATTR, True)
            yield name, tensor

    weight_utils._borrowed_views = marked
    try:
        yield True
    finally:
        for name, original in originals.items():
            setattr(weight_utils, name, original)


@contextlib.contextmanager
def ring_policy(half: bool):
    """With ``half``, the series plans as if the bound were half as large, so
    that tensors above half the bound are read on CPU and InstantTensor's ring
    (still the whole bound) always holds two tensors: the ring policy the
    bounded benchmarks compare with the series' own (tensors above the bound
    on CPU)."""
    if not half:
        yield
        return
    plan = weight_utils._plan_instanttensor_runs

    def halved(shards, *, buffer_size, **kwargs):
        return plan(shards, buffer_size=buffer_size and buffer_size // 2, **kwargs)

    weight_utils._plan_instanttensor_runs = halved
    try:
        yield
    finally:
        weight_utils._plan_instanttensor_runs = plan


def borrowed_attr() -> str:
    """The series' borrowed-tensor marker (its first version's name when the
    tree predates the shared constant)."""
    return getattr(weight_utils, "BORROWED_WEIGHT_ATTR", "_vllm_instanttensor_borrowed")


def op_load(cmd: dict) -> dict:
    """One timed load of a checkpoint folder through DefaultModelLoader.

    ``retention_check`` (default true): false disables the series' check that
    no borrowed tensor outlives its step, for this load only; ``half_bound``
    selects the other ring policy (``ring_policy``); ``pieces`` how tensors
    above a quarter of the bound stream (``pieces``); ``pinned_read``
    (``{"threads", "chunk_bytes"}``) how the pinned reader reads
    (``pinned_read``); ``drop_cache``: the page cache is dropped first
    (``drop_page_cache``, recorded as ``page_cache``)."""
    folder, fmt = cmd["dir"], cmd.get("format", "instanttensor")
    verify = cmd.get("verify", False)
    set_env(cmd.get("env"))
    dests = dests_for(folder)
    cache = drop_page_cache(folder) if cmd.get("drop_cache") else None
    if verify:
        for d in dests.values():
            as_bytes(d).fill_(0xA5)
    expected = set(dests)
    sync()
    empty_cache()
    reset_peak()
    alloc0 = allocated()
    used0 = used_bytes()
    READERS.clear()
    seen: list[str] = []
    n_bytes = cpu_bytes = cpu_n = 0
    cpu_seconds = 0.0
    peak_used = used0
    host0 = peak_host = host_bytes()
    with (
        warnings.catch_warnings(record=True) as caught,
        retention_check(cmd.get("retention_check", True)) as check_off,
        ring_policy(cmd.get("half_bound", False)),
        pieces(cmd.get("pieces")) as pieces_set,
        pinned_read(**cmd.get("pinned_read", {})) as pinned_read_set,
    ):
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        prev = t0
        for name, tensor in weights(folder, fmt, cmd.get("extra")):
            dest = dests[name]
            dest.copy_(tensor)
            if tensor.device.type == "cpu":
                # Timed to the end of the copy from it (a synchronous copy).
                cpu_n += 1
                now = time.perf_counter()
                cpu_seconds += now - prev
                cpu_bytes += tensor.nbytes
            else:
                now = time.perf_counter()
            n_bytes += tensor.nbytes
            seen.append(name)
            peak_used = max(peak_used, used_bytes())
            peak_host = max(peak_host, host_bytes())
            prev = now
        sync()
        seconds = time.perf_counter() - t0
    result = {
        "seconds": seconds,
        "page_cache": cache,
        "bytes": n_bytes,
        "n": len(seen),
        "cpu_n": cpu_n,
        "cpu_bytes": cpu_bytes,
        "cpu_seconds": cpu_seconds,
        "retention_check_off": check_off,
        "pieces_set": pieces_set,
        "pinned_read_set": pinned_read_set,
        "tree_has_pieces": has_pieces(),
        "peak_host_delta": peak_host - host0,
        "peak_used_delta": peak_used - used0,
        "torch_peak_delta": max_allocated() - alloc0,
        "readers": list(READERS),
        "warnings": sorted({str(w.message)[:300] for w in caught}),
        "names_ok": sorted(seen) == sorted(expected),
        "duplicates": sorted({n for n in seen if seen.count(n) > 1})[:10],
        "missing": sorted(expected - set(seen))[:10],
    }
    if verify:
        bad = []
        refs = references(folder)
        for name in headers(folder):
            ref, dest = refs[name], dests[name]
            if (
                ref.dtype != dest.dtype
                or ref.shape != dest.shape
                or not torch.equal(as_bytes(ref), as_bytes(dest))
            ):
                bad.append(name)
        result["mismatches"] = bad[:20]
        result["n_mismatches"] = len(bad)
    return result


def drop_page_cache(folder: str) -> str:
    """Drop the page cache before a load from disk: the kernel's whole cache
    as root (``drop_caches``), else each of the folder's files
    (``posix_fadvise`` DONTNEED, after fsync).  Returns which was done."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        for path in Path(folder).iterdir():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "posix_fadvise"


def op_draft(cmd: dict) -> dict:
    """A draft loaded after its target filled the GPU: the draft's
    parameters are allocated first, then the GPU is filled so that
    ``leave_free`` bytes stay free, then one timed load (``load``'s
    arguments, not verified); a load that raises is recorded as its outcome.
    Last, with the filler freed, every parameter is compared bitwise with the
    file."""
    folder = cmd["dir"]
    dests = dests_for(folder)
    for d in dests.values():
        as_bytes(d).fill_(0xA5)
    empty_cache()
    free0 = torch.cuda.mem_get_info()[0] if DEVICE == "cuda" else None
    if free0 is not None:
        STATE["filler"] = torch.empty(
            max(0, free0 - cmd["leave_free"]), dtype=torch.uint8, device=DEVICE
        )
    free = torch.cuda.mem_get_info()[0] if DEVICE == "cuda" else None
    try:
        result = op_load({**cmd, "verify": False})
        result["outcome"] = "loaded"
    except Exception as e:
        result = {"outcome": "raised", "failure": f"{type(e).__name__}: {e}"[-800:]}
    finally:
        STATE.pop("filler", None)
        empty_cache()
    result.update(free_before=free, leave_free=cmd["leave_free"])
    if result["outcome"] == "loaded":
        refs = references(folder)
        bad = [n for n in dests if not torch.equal(as_bytes(refs[n]), as_bytes(dests[n]))]
        result.update(n_mismatches=len(bad), mismatches=bad[:20])
    drop_references()
    return result


def at_depth(depth: int, fn):
    """``fn()`` called ``depth - 1`` frames below this one."""
    return fn() if depth <= 1 else at_depth(depth - 1, fn)


def op_stream(cmd: dict) -> dict:
    """One timed load of a checkpoint of many small tensors through
    DefaultModelLoader, with a lean consumer (``load`` asks the driver for
    free memory at every tensor, which would count at 100,000 tensors): it
    copies each tensor into its preallocated GPU parameter and notes the
    time to the first tensor.

    ``dests``: the folder whose parameters to use (default ``dir``; a folder
    of some of its shards shares them).  ``keep_owned``: the consumer keeps
    an owned copy of its first tensor in a local to the end, as a model with
    a tied embedding does.  ``depth``: the consuming loop runs that many
    frames deep.  ``retention_check``: as in ``load``."""
    folder, fmt = cmd["dir"], cmd.get("format", "instanttensor")
    keep_owned = cmd.get("keep_owned", False)
    set_env(cmd.get("env"))
    dests = dests_for(cmd.get("dests", folder))
    sync()
    empty_cache()
    READERS.clear()
    seen: list[str] = []

    def consume() -> float | None:
        first = kept = None
        for name, tensor in weights(folder, fmt, cmd.get("extra")):
            if first is None:
                first = time.perf_counter() - t0
                if keep_owned:
                    kept = tensor.clone()
            dests[name].copy_(tensor)
            seen.append(name)
        del kept
        return first

    with retention_check(cmd.get("retention_check", True)) as check_off:
        t0 = time.perf_counter()
        first = at_depth(cmd.get("depth", 1), consume)
        sync()
        seconds = time.perf_counter() - t0
    expected = names_in(folder)
    return {
        "seconds": seconds,
        "first_tensor_s": first,
        "n": len(seen),
        "names_ok": len(seen) == len(expected) and set(seen) == expected,
        "retention_check_off": check_off,
        "readers": [{"copy": rd["copy"], "buffer_size": rd["buffer_size"]} for rd in READERS],
    }


def op_profile_first(cmd: dict) -> dict:
    """cProfile of a load up to its first tensor (``env`` and ``extra`` as in
    ``load``): the functions with the most cumulative time, to see where the
    time before the first tensor goes."""
    import cProfile
    import io
    import pstats

    set_env(cmd.get("env"))
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    stream = weights(cmd["dir"], cmd.get("format", "instanttensor"), cmd.get("extra"))
    next(stream)
    profile.disable()
    seconds = time.perf_counter() - t0
    stream.close()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
    return {"first_tensor_s": seconds, "profile": text.getvalue()[-6000:]}


def op_pinned(cmd: dict) -> dict:
    """Host-to-device copy ceilings: pinned and pageable, ``size`` bytes.

    The buffers are allocated once and kept (a GPU and a pinned host buffer of
    ``size``), so repeated calls measure copies, not allocations."""
    size, reps = cmd.get("size", common.GiB), cmd.get("reps", 5)
    bufs = STATE.get("h2d")
    if bufs is None or bufs["dev"].numel() != size:
        bufs = {"dev": torch.empty(size, dtype=torch.uint8, device=DEVICE)}
        for kind in ("pinned", "pageable"):
            pin = kind == "pinned" and DEVICE == "cuda"
            bufs[kind] = torch.empty(size, dtype=torch.uint8, pin_memory=pin).fill_(7)
        STATE["h2d"] = bufs
    dev = bufs["dev"]
    out = {}
    for kind in cmd.get("kinds", ["pinned", "pageable"]):
        host = bufs[kind]
        dev.copy_(host, non_blocking=True)
        sync()
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            dev.copy_(host, non_blocking=True)
            sync()
            samples.append(time.perf_counter() - t0)
        out[kind] = samples
    return {"size": size, "seconds": out}


def op_real(cmd: dict) -> dict:
    """Load a transformers-written checkpoint through DefaultModelLoader and
    compare every tensor with what safetensors reads from the files: names,
    shapes, dtypes and bytes.  ``inline``: compare each tensor before the
    iterator advances (required for borrowed views); otherwise keep all
    tensors and compare after the iterator is exhausted (owned storage must
    survive the reader's close)."""
    folder, inline = cmd["dir"], cmd.get("inline", False)
    set_env(cmd.get("env"))
    meta = headers(folder)
    refs = {name: reference_tensor(path, name) for name, (path, _, _) in meta.items()}
    READERS.clear()
    kept: list = []
    seen: list[str] = []
    bad: list[str] = []
    marker = borrowed_attr()
    borrowed = cpu = cpu_borrowed = cpu_pinned = 0

    def check(name, tensor):
        ref = refs.get(name)
        if ref is None:
            return
        if tensor.dtype != ref.dtype or tuple(tensor.shape) != tuple(ref.shape):
            bad.append(
                f"{name}: {tensor.dtype}{tuple(tensor.shape)} != {ref.dtype}{tuple(ref.shape)}"
            )
        elif not torch.equal(as_bytes(tensor).cpu(), as_bytes(ref)):
            bad.append(f"{name}: bytes differ")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        for name, tensor in weights(folder, "instanttensor", cmd.get("extra")):
            seen.append(name)
            is_borrowed = bool(getattr(tensor, marker, False))
            borrowed += is_borrowed
            if tensor.device.type == "cpu":
                cpu += 1
                cpu_borrowed += is_borrowed
                cpu_pinned += DEVICE == "cuda" and tensor.is_pinned()
            if inline:
                check(name, tensor)
            else:
                kept.append((name, tensor))
        seconds = time.perf_counter() - t0
    for name, tensor in kept:
        check(name, tensor)
    names = set(seen)
    prefixes = tuple((cmd.get("extra") or {}).get("instanttensor_priority_prefixes", ()))
    n_priority = sum(name.startswith(prefixes) for name in seen) if prefixes else 0
    return {
        "n_tensors": len(seen),
        "n_reference": len(refs),
        "seconds": seconds,
        "names_equal": names == set(refs) and len(seen) == len(names),
        "missing": sorted(set(refs) - names)[:10],
        "unexpected": sorted(names - set(refs))[:10],
        "duplicates": sorted({n for n in seen if seen.count(n) > 1})[:10],
        "n_mismatches": len(bad),
        "mismatches": bad[:10],
        "on_cpu": cpu,
        "borrowed_marked": borrowed,
        "borrowed_marker": marker,
        "cpu_borrowed": cpu_borrowed,
        "cpu_pinned": cpu_pinned,
        "n_priority": n_priority,
        # Priority tensors come first: the first n_priority names are theirs.
        "priority_first": all(name.startswith(prefixes) for name in seen[:n_priority])
        if prefixes
        else None,
        "readers": list(READERS),
        "warnings": sorted({str(w.message)[:300] for w in caught}),
    }


def build_layered_model(modules: dict, tp: int = 1):
    """Modules whose weights live on meta until layerwise processing
    materialises them on the device, with vLLM-style weight loaders.

    ``tp`` > 1: each module is rank 0's of ``tp`` ranks (``modules`` come from
    ``common.tp_local_modules``); its loader narrows the whole checkpoint
    tensor to rank 0's slice before copying it, as vLLM's parallel linear
    loaders do."""

    class Holder(torch.nn.Module):
        pass

    model = Holder()
    route = {}
    for mod_name, spec in modules.items():
        mod = torch.nn.Module()
        weight = torch.nn.Parameter(
            torch.empty(spec["shape"], dtype=torch_dtype(spec["dtype"]), device="meta"),
            requires_grad=False,
        )
        offsets = {part[1]: (part[2], part[3]) for part in spec["parts"]}
        dim = spec.get("tp_dim") if tp > 1 else None

        def loader(param, loaded_weight, loaded_shard_id=None, _offsets=offsets, _dim=dim):
            if _dim is not None:
                size = loaded_weight.shape[_dim] // tp
                loaded_weight = loaded_weight.narrow(_dim, 0, size)  # rank 0
            if loaded_shard_id is None:
                param.data.copy_(loaded_weight)
                return
            offset, rows = _offsets[loaded_shard_id]
            param.data.narrow(0, offset, rows).copy_(loaded_weight)

        weight.weight_loader = loader
        mod.register_parameter("weight", weight)
        model.add_module(mod_name.replace(".", "_"), mod)
        for part in spec["parts"]:
            route[part[0]] = (mod, part[1])
    with torch.device(DEVICE):
        for mod, _ in route.values():
            layerwise.initialize_online_processing(mod)
    return model, route


def layered_reference(meta: dict, spec: dict, tp: int):
    """What rank 0 of ``tp`` ranks holds for one module, from the files."""
    parts = []
    for part in spec["parts"]:
        ref = reference_tensor(meta[part[0]][0], part[0])
        dim = spec.get("tp_dim") if tp > 1 else None
        if dim is not None:
            ref = ref.narrow(dim, 0, ref.shape[dim] // tp)
        parts.append(ref)
    return torch.cat(parts, 0) if len(parts) > 1 else parts[0]


def op_layerwise(cmd: dict) -> dict:
    """Stream a layered checkpoint into meta-device modules through vLLM's
    layerwise online processing; measure the extra peak GPU memory over the
    materialised parameters and compare every processed weight with the
    checkpoint (``verify``, default true).

    ``tp`` (default 1): a tensor-parallel-like run, as rank 0 of ``tp``
    ranks: parameters hold the rank's rows of each fused part and the
    loaders narrow the checkpoint tensors; what incomplete layers may hold
    is then their TP-local size (``common.incomplete_layers_bytes``)."""
    folder, tp = cmd["dir"], cmd.get("tp", 1)
    info = json.loads((Path(folder) / "checkpoint.json").read_text())
    modules = common.tp_local_modules(info["modules"], tp) if tp > 1 else info["modules"]
    set_env(cmd.get("env"))
    STATE["dests"] = None
    STATE["dests_dir"] = None
    sync()
    empty_cache()
    model, route = build_layered_model(modules, tp)
    reset_peak()
    alloc0 = allocated()
    used0 = used_bytes()
    READERS.clear()
    # Extra memory = what is allocated beyond the parameters materialised so
    # far: queued sources, owned copies, InstantTensor's clones.  torch's peak
    # is reset every step, so each step's peak (the yielded tensor, the queue,
    # the layer being processed) is compared with the parameters that exist
    # at the end of that step.  "Held" is what stays allocated between steps
    # (queued sources and copies), without the step's own transient tensors.
    materialised = 0
    done: set[int] = set()
    extra_alloc = extra_used = extra_held = 0
    held_peak_after = None  # the tensor after which the most stayed held
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        for name, tensor in weights(folder, "instanttensor", cmd.get("extra")):
            mod, shard_id = route[name]
            param = mod.weight
            if shard_id is None:
                param.weight_loader(param, tensor)
            else:
                param.weight_loader(param, tensor, shard_id)
            if id(mod) not in done and not mod.weight.is_meta:
                done.add(id(mod))
                materialised += mod.weight.nbytes
            extra_alloc = max(extra_alloc, max_allocated() - alloc0 - materialised)
            extra_used = max(extra_used, used_bytes() - used0 - materialised)
            del tensor, param
            held = allocated() - alloc0 - materialised
            if held > extra_held:
                extra_held, held_peak_after = held, name
            reset_peak()
        layerwise.finalize_layerwise_processing(model, None)
        sync()
        seconds = time.perf_counter() - t0
    final_alloc = allocated() - alloc0
    meta = headers(folder)
    bad, on_meta = [], 0
    for mod_name, spec in modules.items():
        weight = getattr(model, mod_name.replace(".", "_")).weight
        if weight.is_meta:
            on_meta += 1
            bad.append(f"{mod_name}: never processed")
            continue
        if not cmd.get("verify", True):
            continue
        ref = layered_reference(meta, spec, tp)
        if tuple(weight.shape) != tuple(ref.shape) or not torch.equal(
            as_bytes(weight).cpu(), as_bytes(ref)
        ):
            bad.append(f"{mod_name}: bytes differ")
    bound = info["incomplete_bound_bytes"]
    result = {
        "seconds": seconds,
        "tp": tp,
        "verified": cmd.get("verify", True),
        "model_bytes": info["model_bytes"],
        "incomplete_bound_bytes": bound,
        "tp_local_bound_bytes": common.incomplete_layers_bytes(modules, info["order"]),
        "held_peak_after": held_peak_after,
        "final_alloc_delta": final_alloc,
        "materialised_bytes": materialised,
        "extra_peak_alloc": extra_alloc,
        "extra_peak_used": extra_used,
        "extra_held_alloc": extra_held,
        "n_modules": len(modules),
        "n_mismatched_modules": len(bad),
        "mismatches": bad[:10],
        "never_processed": on_meta,
        "readers": list(READERS),
        "warnings": sorted({str(w.message)[:300] for w in caught}),
    }
    del model, route
    empty_cache()
    return result


def quantize_to_fp8(layer) -> None:
    """A stand-in for online FP8 quantization: a float32 temporary per
    parameter for the scale, an fp8 output per parameter, then the parameters
    are replaced by their outputs."""
    outputs = {}
    for name, param in list(layer.named_parameters()):
        work = param.detach().float()
        scale = work.abs().amax().clamp(min=1e-12) / 448.0
        outputs[name] = (work / scale).to(torch.float8_e4m3fn)
        del work
    for name, output in outputs.items():
        delattr(layer, name)
        layer.register_parameter(name, torch.nn.Parameter(output, requires_grad=False))


def op_cpu_sources_peak(cmd: dict) -> dict:
    """Peak device memory over a whole layerwise load from CPU sources: a padded
    ``lm_head``-like layer first (its loader leaves the padding rows unwritten,
    so it completes only in finalize), then two layers of four bf16 parameters
    (``shape``), each processed to fp8 when complete.  The peak is the bytes
    allocated above the start from the first call until finalize returns (on
    CPU: the bytes ``materialize_meta_tensor`` allocated and still alive).
    The base release queues CPU sources and materializes a layer when it completes."""
    import weakref

    from vllm.model_executor.model_loader.reload import meta

    def rows_loader(param, loaded_weight):
        param.data[: loaded_weight.shape[0]].copy_(loaded_weight)

    rows, cols = (int(n) for n in cmd.get("shape", (4096, 4096)))
    method = fp8_hook_quant_method()
    specs = {"lm_head": {"weight": (2 * rows + 64, cols // 2)}}
    specs.update({f"layer{i}": {f"w{j}": (rows, cols) for j in range(4)} for i in range(2)})
    model = torch.nn.Module()
    for mod_name, params in specs.items():
        mod = torch.nn.Module()
        mod.quant_method = method
        for name, shape in params.items():
            param = torch.empty(shape, dtype=torch.bfloat16, device="meta")
            param = torch.nn.Parameter(param, requires_grad=False)
            param.weight_loader = rows_loader
            mod.register_parameter(name, param)
        model.add_module(mod_name, mod)
        with torch.device(DEVICE):
            layerwise.initialize_online_processing(mod)
    live = {"now": 0, "peak": 0}
    materialize = meta.materialize_meta_tensor

    def counting(meta_tensor):
        tensor = materialize(meta_tensor)
        live["now"] += tensor.nbytes
        live["peak"] = max(live["peak"], live["now"])
        weakref.finalize(tensor, lambda n=tensor.nbytes: live.__setitem__("now", live["now"] - n))
        return tensor

    meta.materialize_meta_tensor = counting
    sync()
    empty_cache()
    reset_peak()
    start = allocated()
    try:
        for mod_name, params in specs.items():
            for name, shape in params.items():
                param = getattr(getattr(model, mod_name), name)
                loaded = rows * 2 if mod_name == "lm_head" else shape[0]
                source = torch.full((loaded, shape[1]), 1.0, dtype=torch.bfloat16)  # CPU
                param.weight_loader(param, source)
                del source, param
        layerwise.finalize_layerwise_processing(model, None)
    finally:
        meta.materialize_meta_tensor = materialize
    sync()
    peak = max_allocated() - start if DEVICE == "cuda" else live["peak"]
    processed = all(p.dtype == torch.float8_e4m3fn for p in model.parameters())
    del model
    empty_cache()
    return {"shape": [rows, cols], "peak_bytes": peak, "processed": processed}


def fp8_hook_quant_method():
    """A quant method whose processing is ``quantize_to_fp8``."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    from vllm.platforms import current_platform

    # Processing imports vLLM's online-quantization modules, one of which asks
    # at import time whether CUTLASS fp8 kernels exist: on a platform that
    # claims CUDA that calls a compiled op a source tree lacks.  They are
    # imported here with the platform's own answers (as the series' CUDA
    # tests see it), then the CUDA answers are put back.
    claimed = {k: v for k, v in vars(current_platform).items() if k.startswith("is_cuda")}
    for key in claimed:
        delattr(current_platform, key)
    try:
        import vllm.model_executor.layers.quantization.online.fp8  # noqa: F401
        import vllm.model_executor.layers.quantization.online.moe_base  # noqa: F401
        import vllm.model_executor.model_loader.utils  # noqa: F401
    finally:
        for key, value in claimed.items():
            setattr(current_platform, key, value)

    class HookQuantMethod(QuantizeMethodBase):
        uses_meta_device = True

        def create_weights(self, layer, *weight_args, **extra_weight_attrs):
            pass

        def apply(self, layer, *args, **kwargs):
            raise NotImplementedError

        def process_weights_after_loading(self, layer):
            quantize_to_fp8(layer)

    return HookQuantMethod()


def op_processing_peak(cmd: dict) -> dict:
    """Peak memory while one layer is loaded and processed: four bf16
    parameters (``shape``, default 4096 x 4096: 32 MiB each) loaded from
    device sources, one call each, through layerwise online processing whose
    processing quantizes them to fp8.  The peak is the bytes allocated above
    the start, from the first call until processing has run.  The base release keeps
    the queued sources until processing returns; the series loads each
    source at its call and keeps none."""
    shape = tuple(cmd.get("shape", (4096, 4096)))
    names = [f"w{i}" for i in range(4)]
    layer = torch.nn.Module()
    layer.quant_method = fp8_hook_quant_method()
    for name in names:
        param = torch.nn.Parameter(
            torch.empty(shape, dtype=torch.bfloat16, device="meta"), requires_grad=False
        )
        param.weight_loader = weight_utils.default_weight_loader
        layer.register_parameter(name, param)
    with torch.device(DEVICE):
        layerwise.initialize_online_processing(layer)
    sync()
    empty_cache()
    reset_peak()
    start = allocated()
    for index, name in enumerate(names):
        source = torch.full(shape, float(index + 1), dtype=torch.bfloat16, device=DEVICE)
        param = getattr(layer, name)
        param.weight_loader(param, source)
        del source, param
    sync()
    peak = max_allocated() - start
    processed = all(getattr(layer, name).dtype == torch.float8_e4m3fn for name in names)
    del layer
    empty_cache()
    return {
        "shape": list(shape),
        "param_bytes": 2 * shape[0] * shape[1],
        "peak_bytes": peak,
        "processed": processed,
    }


def op_pinned_read(cmd: dict) -> dict:
    """Read one large tensor of a tmpfs shard and copy it into a preallocated
    GPU tensor, timed to the end of that copy, per method: safetensors'
    ``get_tensor`` (pageable memory) and the series' pinned reader
    (``weight_utils._PinnedReader``, a new one per read, as a load makes one)
    for each threads x chunk-size pair: set as the module constants
    ``PINNED_READ_THREADS`` / ``PINNED_READ_CHUNK_BYTES`` for that read
    (``pinned_read``), or, in a tree from before them, passed to the
    reader.  Methods run in interleaved rounds; each method's first result
    is compared bitwise with the file.  A tree without the reader runs the
    pageable method only."""
    from safetensors import safe_open

    path, name = cmd["file"], cmd["tensor"]
    reps = cmd.get("reps", 5)
    reader_cls = getattr(weight_utils, "_PinnedReader", None)
    constants = False  # how the reader takes its threads and chunk size
    shards = {path: weight_utils._open_shard(path, True)} if reader_cls else None
    nbytes = shards[path].sizes[name] if shards else os.path.getsize(path)
    ref = reference_tensor(path, name).to(DEVICE)
    dest = torch.empty_like(ref)
    sync()
    methods: dict[str, object] = {"safetensors get_tensor (pageable)": None}
    out: dict = {"file": path, "tensor": name, "bytes": nbytes, "reps": reps, "methods": {}}
    if reader_cls is None:
        out["pinned_reader"] = "absent from this tree"
    else:
        constants = has_pinned_read_constants()
        out["settings"] = "module constants" if constants else "reader arguments"
        if constants:
            threads, chunk = (getattr(weight_utils, name) for name in PINNED_READ_NAMES)
        else:
            defaults = inspect.signature(weight_utils.instanttensor_weights_iterator).parameters
            threads = defaults["read_threads"].default
            chunk = defaults["read_chunk_bytes"].default
        out["default"] = {"threads": threads, "chunk_bytes": chunk}
        for threads in cmd.get("threads", [4, 8, 16]):
            for chunk in cmd.get("chunks", [4 * common.MiB, 16 * common.MiB, 64 * common.MiB]):
                label = f"pinned reader, {threads} threads, {chunk // common.MiB} MiB chunks"
                methods[label] = (threads, chunk)
    samples: dict[str, list] = {label: [] for label in methods}
    reads: dict[str, list] = {label: [] for label in methods}
    labels = list(methods)
    for r in range(reps):
        for i in range(len(labels)):
            label = labels[(r + i) % len(labels)]
            method = methods[label]
            t0 = time.perf_counter()
            with contextlib.ExitStack() as stack:
                pool_threads = None
                if method is None:
                    f = stack.enter_context(safe_open(path, framework="pt", device="cpu"))
                    tensor = f.get_tensor(name)
                else:
                    args = [shards, [(path, name, nbytes)], 2 * nbytes]
                    if constants:
                        stack.enter_context(pinned_read(*method))
                    else:
                        args += method
                    reader = stack.enter_context(contextlib.closing(reader_cls(*args)))
                    # The threads the reader really has (the setting took).
                    pool_threads = getattr(getattr(reader, "pool", None), "_max_workers", None)
                    tensor = reader(path, name)
                t1 = time.perf_counter()
                dest.copy_(tensor)
                sync()
            samples[label].append(time.perf_counter() - t0)
            reads[label].append(t1 - t0)
            entry = out["methods"].setdefault(label, {})
            if "bitwise_equal" not in entry:
                entry["bitwise_equal"] = bool(torch.equal(as_bytes(dest), as_bytes(ref)))
                entry["is_pinned"] = DEVICE == "cuda" and bool(tensor.is_pinned())
                entry["borrowed_marked"] = bool(getattr(tensor, borrowed_attr(), False))
                if method is not None:
                    entry["threads"], entry["chunk_bytes"] = method
                    entry["reader_threads"] = pool_threads
            del tensor
    for label in labels:
        med = common.median(samples[label])
        entry = out["methods"].setdefault(label, {})
        entry.update(
            seconds=samples[label],
            median_s=med,
            read_median_s=common.median(reads[label]),
            gb_s=nbytes / 1e9 / med if med else None,
        )
    pinned = [e for e in out["methods"].values() if "threads" in e and e.get("gb_s")]
    if pinned:
        best = max(pinned, key=lambda e: e["gb_s"])
        out["best"] = {k: best[k] for k in ("threads", "chunk_bytes", "gb_s")}
        default = next(
            (
                e
                for e in pinned
                if (e["threads"], e["chunk_bytes"])
                == (out["default"]["threads"], out["default"]["chunk_bytes"])
            ),
            None,
        )
        out["default"]["gb_s"] = default["gb_s"] if default else None
    del ref, dest
    empty_cache()
    return out


OPS = {
    "info": op_info,
    "load": op_load,
    "stream": op_stream,
    "draft": op_draft,
    "pinned": op_pinned,
    "real": op_real,
    "layerwise": op_layerwise,
    "pinned_read": op_pinned_read,
    "profile_first": op_profile_first,
    "processing_peak": op_processing_peak,
    "cpu_sources_peak": op_cpu_sources_peak,
}


def main() -> int:
    global torch, LoadConfig, DefaultModelLoader, layerwise, weight_utils, DEVICE
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", required=True)
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu: tooling tests only (stand-in instanttensor)",
    )
    args = parser.parse_args()
    DEVICE = args.device
    out = os.fdopen(args.result_fd, "w", buffering=1)

    def send(obj) -> None:
        out.write(json.dumps(obj, default=str) + "\n")
        out.flush()

    t0 = time.perf_counter()
    try:
        import torch

        install_reader_recorder()
        from vllm.config import LoadConfig
        from vllm.model_executor.model_loader import (
            DefaultModelLoader,
            default_loader,  # noqa: F401
            weight_utils,
        )
        from vllm.model_executor.model_loader.reload import layerwise
        from vllm.platforms import current_platform

        current_platform.is_cuda = lambda: True
        current_platform.is_cuda_alike = lambda: True
        if DEVICE == "cuda":
            # No CUDA call here: the context is created by the first command,
            # after the GPU tests (which may measure device memory) are done.
            current_platform.current_device = lambda: torch.cuda.current_device()
        else:
            current_platform.current_device = lambda: "cpu"
            # No pinning without a GPU: the series' pinned reader reads into
            # pageable memory (it registers its arena with CUDA otherwise).
            weight_utils.is_pin_memory_available = lambda: False
    except Exception:
        send({"ready": False, "error": traceback.format_exc()[-4000:]})
        return 1
    send(
        {
            "ready": True,
            "tree": args.tree,
            "import_seconds": time.perf_counter() - t0,
            "platform": type(current_platform).__name__,
        }
    )
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd.get("op") == "quit":
            send({"bye": True})
            break
        t1 = time.perf_counter()
        if cmd["op"] not in ("load", "info"):
            drop_references()  # only verified loads use them
        try:
            result = OPS[cmd["op"]](cmd)
        except Exception:
            result = {"error": traceback.format_exc()[-4000:]}
            print(result["error"], file=sys.stderr, flush=True)
        result["op_seconds"] = time.perf_counter() - t1
        send(result)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
