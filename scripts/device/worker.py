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
"""

from __future__ import annotations

import argparse
import gc
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
STATE: dict = {"dests_dir": None, "dests": None}

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
                    "total_tensor_size": self.total_tensor_size,
                    "buffer_size_arg": kwargs.get("buffer_size"),
                    "tensor_filter": kwargs.get("tensor_filter") is not None,
                }
            )

    instanttensor.safe_open = RecordingSafeOpen


def set_env(env: dict | None) -> None:
    for key in common.MANAGED_ENV:
        os.environ.pop(key, None)
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


def reference_tensor(path: str, name: str):
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        return f.get_tensor(name)


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


def op_load(cmd: dict) -> dict:
    """One timed load of a checkpoint folder through DefaultModelLoader."""
    folder, fmt = cmd["dir"], cmd.get("format", "instanttensor")
    verify = cmd.get("verify", False)
    set_env(cmd.get("env"))
    dests = dests_for(folder)
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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        prev = t0
        for name, tensor in weights(folder, fmt, cmd.get("extra")):
            dest = dests[name]
            dest.copy_(tensor)
            if tensor.device.type == "cpu":
                # A CPU-fallback tensor is timed to the end of its copy.
                sync()
                cpu_n += 1
                now = time.perf_counter()
                cpu_seconds += now - prev
                cpu_bytes += tensor.nbytes
            else:
                now = time.perf_counter()
            n_bytes += tensor.nbytes
            seen.append(name)
            peak_used = max(peak_used, used_bytes())
            prev = now
        sync()
        seconds = time.perf_counter() - t0
    result = {
        "seconds": seconds,
        "bytes": n_bytes,
        "n": len(seen),
        "cpu_n": cpu_n,
        "cpu_bytes": cpu_bytes,
        "cpu_seconds": cpu_seconds,
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
        for name, (path, _shape, _dtype) in headers(folder).items():
            ref = reference_tensor(path, name).to(DEVICE)
            dest = dests[name]
            if (
                ref.dtype != dest.dtype
                or ref.shape != dest.shape
                or not torch.equal(as_bytes(ref), as_bytes(dest))
            ):
                bad.append(name)
            del ref
        result["mismatches"] = bad[:20]
        result["n_mismatches"] = len(bad)
    return result


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
    borrowed = cpu = 0

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
            borrowed += bool(getattr(tensor, "_vllm_instanttensor_borrowed", False))
            cpu += tensor.device.type == "cpu"
            if inline:
                check(name, tensor)
            else:
                kept.append((name, tensor))
        seconds = time.perf_counter() - t0
    for name, tensor in kept:
        check(name, tensor)
    names = set(seen)
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
        "readers": list(READERS),
        "warnings": sorted({str(w.message)[:300] for w in caught}),
    }


def build_layered_model(modules: dict):
    """Modules whose weights live on meta until layerwise processing
    materialises them on CUDA, with vLLM-style sharded weight loaders."""

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

        def loader(param, loaded_weight, loaded_shard_id=None, _offsets=offsets):
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


def op_layerwise(cmd: dict) -> dict:
    """Stream a layered checkpoint into meta-device modules through vLLM's
    layerwise online processing; measure the extra peak GPU memory over the
    final model and compare every processed weight with the checkpoint."""
    folder = cmd["dir"]
    info = json.loads((Path(folder) / "checkpoint.json").read_text())
    set_env(cmd.get("env"))
    STATE["dests"] = None
    STATE["dests_dir"] = None
    sync()
    empty_cache()
    model, route = build_layered_model(info["modules"])
    reset_peak()
    alloc0 = allocated()
    used0 = used_bytes()
    READERS.clear()
    # Extra memory = what is allocated beyond the parameters materialised so
    # far: queued sources, owned copies, InstantTensor's clones.  torch's peak
    # is reset every step, so each step's peak (the yielded tensor, the queue,
    # the layer being processed) is compared with the parameters that exist
    # at the end of that step.
    materialised = 0
    done: set[int] = set()
    extra_alloc = extra_used = 0
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
            reset_peak()
        layerwise.finalize_layerwise_processing(model, None)
        sync()
        seconds = time.perf_counter() - t0
    final_alloc = allocated() - alloc0
    meta = headers(folder)
    bad, on_meta = [], 0
    for mod_name, spec in info["modules"].items():
        weight = getattr(model, mod_name.replace(".", "_")).weight
        if weight.is_meta:
            on_meta += 1
            bad.append(f"{mod_name}: never processed")
            continue
        parts = [reference_tensor(meta[p[0]][0], p[0]) for p in spec["parts"]]
        ref = torch.cat(parts, 0) if len(parts) > 1 else parts[0]
        if not torch.equal(as_bytes(weight).cpu(), as_bytes(ref)):
            bad.append(f"{mod_name}: bytes differ")
    result = {
        "seconds": seconds,
        "model_bytes": info["model_bytes"],
        "incomplete_bound_bytes": info["incomplete_bound_bytes"],
        "final_alloc_delta": final_alloc,
        "materialised_bytes": materialised,
        "extra_peak_alloc": extra_alloc,
        "extra_peak_used": extra_used,
        "n_modules": len(info["modules"]),
        "n_mismatched_modules": len(bad),
        "mismatches": bad[:10],
        "never_processed": on_meta,
        "readers": list(READERS),
        "warnings": sorted({str(w.message)[:300] for w in caught}),
    }
    del model, route
    empty_cache()
    return result


OPS = {
    "info": op_info,
    "load": op_load,
    "pinned": op_pinned,
    "real": op_real,
    "layerwise": op_layerwise,
}


def main() -> int:
    global torch, LoadConfig, DefaultModelLoader, layerwise, DEVICE
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
            weight_utils,  # noqa: F401
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
