"""Shared by the scripts that run on the GPU machine (Python 3.12, torch 2.11).

Standard library only at import time: the orchestrator imports it before the
carried wheels are installed, and the tooling tests import it on a CPU machine.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tarfile
from pathlib import Path

MiB = 1 << 20
GiB = 1 << 30


def install_wheels_command(python: str, wheels: list[str], site: Path) -> list[str]:
    """pip's command line that installs the bundle's *wheels* into *site*,
    offline and without their dependencies (the bundle carries them all)."""
    return [
        python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
        "--no-cache-dir", "--upgrade", "--target", str(site), *wheels,
    ]  # fmt: skip


# Environment variables the benchmarks set per configuration; every other
# InstantTensor variable is left as the machine has it (unset).  Borrowed
# mode is no variable: the series reads it from the loader option
# ``instanttensor_copy`` alone.
MANAGED_ENV = (
    "INSTANTTENSOR_BUFFER_SIZE",
    "INSTANTTENSOR_CHUNK_SIZE",
    "INSTANTTENSOR_CONCURRENCY",
    "INSTANTTENSOR_IO_DEPTH",
    "INSTANTTENSOR_BACKEND",
)
# ``--small`` (CPU tests): the I/O chunk every worker reads with unless a
# configuration sets its own, scaled down with the bounds, which InstantTensor
# refuses below one chunk.
SMALL_CHUNK_ENV = "QUALIFICATION_SMALL_CHUNK_SIZE"


# --- trees -------------------------------------------------------------------


def extract(archive: Path, dest: Path) -> None:
    """Unpack a tar.xz with tarfile's ``data`` filter; system tar if lzma is missing."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        import lzma  # noqa: F401
    except ImportError:
        subprocess.run(["tar", "-xJf", str(archive), "-C", str(dest)], check=True)
        return
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")


def unpack_tree(bundle_dir: Path, bundle: dict, name: str, dest: Path) -> Path:
    """Lay out tree ``name`` of the bundle in ``dest``: the base, then the
    tree's overlay and deletions when it has one."""
    trees = bundle["trees"]
    tree = trees[name]
    if dest.exists():
        shutil.rmtree(dest)
    base = tree.get("overlay_of")
    if base:
        extract(bundle_dir / trees[base]["archive"], dest)
        for rel in tree.get("deleted", []):
            path = dest / rel
            if path.is_file() or path.is_symlink():
                path.unlink()
    extract(bundle_dir / tree["archive"], dest)
    return dest


# --- statistics ----------------------------------------------------------------


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def gib_per_s(nbytes: int, seconds: float | None) -> float | None:
    if not seconds:
        return None
    return nbytes / GiB / seconds


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return a / b


# --- checkpoints -----------------------------------------------------------------
# Specs are plain data: (name, shape, safetensors dtype) per tensor, per shard.

DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I64": 8, "I32": 4, "U8": 1}


def nbytes_of(shape, dtype: str) -> int:
    n = DTYPE_SIZE[dtype]
    for s in shape:
        n *= s
    return n


def synthetic_spec(layers: int = 32, shards: int = 4, small: bool = False) -> list[list[tuple]]:
    """About 8 GiB in ``shards`` shards: a Llama-like stack with mixed sizes.

    Sizes range from 4 B (a scalar scale) to 56 MiB (MLP matrices); the
    embedding and head are 62.5 MiB, under a 64 MiB staging bound.
    ``small`` (CPU tests of the scripts): the same layout, 1/16 of each side.
    """
    hidden, inter, kv, vocab = (256, 448, 64, 500) if small else (4096, 7168, 1024, 8000)
    per_shard = layers // shards
    spec: list[list[tuple]] = []
    for s in range(shards):
        shard: list[tuple] = []
        if s == 0:
            shard.append(("model.embed_tokens.weight", (vocab, hidden), "BF16"))
        for i in range(s * per_shard, (s + 1) * per_shard):
            p = f"model.layers.{i}"
            shard += [
                (f"{p}.input_layernorm.weight", (hidden,), "BF16"),
                (f"{p}.post_attention_layernorm.weight", (hidden,), "BF16"),
                (f"{p}.self_attn.q_proj.weight", (hidden, hidden), "BF16"),
                (f"{p}.self_attn.k_proj.weight", (kv, hidden), "BF16"),
                (f"{p}.self_attn.v_proj.weight", (kv, hidden), "BF16"),
                (f"{p}.self_attn.o_proj.weight", (hidden, hidden), "BF16"),
                (f"{p}.self_attn.q_norm.weight", (128,), "BF16"),
                (f"{p}.self_attn.k_scale", (), "F32"),
                (f"{p}.mlp.gate_proj.weight", (inter, hidden), "BF16"),
                (f"{p}.mlp.up_proj.weight", (inter, hidden), "BF16"),
                (f"{p}.mlp.down_proj.weight", (hidden, inter), "BF16"),
                (f"{p}.mlp.down_proj.weight_scale", (hidden,), "F32"),
            ]
        if s == shards - 1:
            shard.append(("model.norm.weight", (hidden,), "BF16"))
            shard.append(("lm_head.weight", (vocab, hidden), "BF16"))
        spec.append(shard)
    return spec


def many_spec(small: bool = False) -> list[list[tuple]]:
    """100 shards of 1,160 bf16 tensors of 16 KiB: 116,000 tensors, 1.9 GB,
    the tensor count of the largest MoE checkpoints, where a load's time is
    almost all per-tensor cost.  ``small`` (CPU tests): 10 shards of 40
    tensors of 256 B."""
    shards, per_shard, numel = (10, 40, 128) if small else (100, 1160, 8192)
    return [
        [(f"model.layers.{s}.w{i:04d}", (numel,), "BF16") for i in range(per_shard)]
        for s in range(shards)
    ]


BIG_TENSOR = ("model.extra_embedding.weight", (131072, 4096), "BF16")  # 1 GiB
BIG_TENSOR_SMALL = ("model.extra_embedding.weight", (8192, 256), "BF16")  # 4 MiB


def layered_spec(layers: int = 12, shards: int = 2, small: bool = False) -> list[list[tuple]]:
    """A model-like stack for layerwise processing: q/k/v and gate/up arrive
    as separate tensors and are fused into one parameter each, so those
    modules stay incomplete until their last part arrives (as in vLLM's
    QKVParallelLinear / MergedColumnParallelLinear)."""
    hidden, inter, kv = (128, 512, 32) if small else (2048, 8192, 512)
    per_shard = layers // shards
    spec = []
    for s in range(shards):
        shard = []
        for i in range(s * per_shard, (s + 1) * per_shard):
            p = f"layers.{i}"
            shard += [
                (f"{p}.input_layernorm.weight", (hidden,), "BF16"),
                (f"{p}.self_attn.q_proj.weight", (hidden, hidden), "BF16"),
                (f"{p}.self_attn.k_proj.weight", (kv, hidden), "BF16"),
                (f"{p}.self_attn.v_proj.weight", (kv, hidden), "BF16"),
                (f"{p}.self_attn.o_proj.weight", (hidden, hidden), "BF16"),
                (f"{p}.mlp.gate_proj.weight", (inter, hidden), "BF16"),
                (f"{p}.mlp.up_proj.weight", (inter, hidden), "BF16"),
                (f"{p}.mlp.down_proj.weight", (hidden, inter), "BF16"),
            ]
        spec.append(shard)
    return spec


# Checkpoint name suffix -> (fused module suffix, shard id, order within module).
FUSED = {
    "self_attn.q_proj.weight": ("self_attn.qkv_proj", "q"),
    "self_attn.k_proj.weight": ("self_attn.qkv_proj", "k"),
    "self_attn.v_proj.weight": ("self_attn.qkv_proj", "v"),
    "mlp.gate_proj.weight": ("mlp.gate_up_proj", 0),
    "mlp.up_proj.weight": ("mlp.gate_up_proj", 1),
}
FUSED_ORDER = {"self_attn.qkv_proj": ["q", "k", "v"], "mlp.gate_up_proj": [0, 1]}


def layered_modules(spec: list[list[tuple]]) -> dict[str, dict]:
    """Module name -> {"shape", "dtype", "parts": [(ckpt name, shard id, row
    offset, rows)]} for the layered spec."""
    tensors = {name: (shape, dtype) for shard in spec for name, shape, dtype in shard}
    modules: dict[str, dict] = {}
    for name, (shape, dtype) in tensors.items():
        layer, _, rest = name.partition(".")
        idx, _, suffix = rest.partition(".")
        prefix = f"{layer}.{idx}"
        if suffix in FUSED:
            mod_suffix, shard_id = FUSED[suffix]
            mod = modules.setdefault(
                f"{prefix}.{mod_suffix}",
                {"dtype": dtype, "parts": [], "cols": shape[1]},
            )
            mod["parts"].append([name, shard_id, 0, shape[0]])
        else:
            module = name[: -len(".weight")]
            modules[module] = {
                "dtype": dtype,
                "parts": [[name, None, 0, shape[0]]],
                "cols": shape[1] if len(shape) > 1 else None,
            }
    for mod_name, mod in modules.items():
        order = FUSED_ORDER.get(mod_name.split(".", 2)[2])
        if order:
            mod["parts"].sort(key=lambda part: order.index(part[1]))
        offset = 0
        for part in mod["parts"]:
            part[2] = offset
            offset += part[3]
        mod["shape"] = [offset] if mod["cols"] is None else [offset, mod["cols"]]
    return modules


# Module suffix -> the weight dimension that tensor parallelism splits, as in
# vLLM's parallel linear layers: column-parallel layers (the fused q/k/v and
# gate/up projections) split their output rows, row-parallel layers (o_proj,
# down_proj) their input columns; 1-D weights (norms) are replicated.
TP_DIM = {
    "self_attn.qkv_proj": 0,
    "mlp.gate_up_proj": 0,
    "self_attn.o_proj": 1,
    "mlp.down_proj": 1,
}


def tp_local_modules(modules: dict[str, dict], tp: int) -> dict[str, dict]:
    """``layered_modules`` as rank 0 of ``tp`` ranks holds them.

    Each module gains ``tp_dim`` (None: replicated); its ``shape`` and its
    parts' row offsets and row counts become the rank's (1/tp of each fused
    part's rows), while each part keeps its checkpoint name.
    """
    local = {}
    for name, mod in modules.items():
        dim = TP_DIM.get(name.split(".", 2)[2]) if len(mod["shape"]) > 1 else None
        shape = list(mod["shape"])
        parts = [list(part) for part in mod["parts"]]
        if dim is not None:
            if shape[dim] % tp or any(part[3] % tp for part in parts):
                raise ValueError(f"{name}: {shape} does not split into {tp} ranks")
            shape[dim] //= tp
            if dim == 0:
                for part in parts:
                    part[2] //= tp
                    part[3] //= tp
        local[name] = {**mod, "shape": shape, "parts": parts, "tp_dim": dim}
    return local


def incomplete_bound(modules: dict[str, dict], order: list[str], sizes: dict) -> int:
    """Bytes that layerwise processing may hold for one incomplete module when
    tensors arrive in ``order``: the largest sum, over fused modules, of the
    parts that arrive before the module's last part."""
    position = {name: i for i, name in enumerate(order)}
    worst = 0
    for mod in modules.values():
        names = [part[0] for part in mod["parts"]]
        if len(names) < 2:
            continue
        last = max(names, key=position.__getitem__)
        worst = max(worst, sum(sizes[n] for n in names if n != last))
    return worst


def incomplete_layers_bytes(modules: dict[str, dict], order: list[str]) -> int:
    """The largest total size, along the arrival ``order``, of the fused
    modules that have received some but not all of their parts: what loading
    straight into materialized parameters holds for incomplete layers (with
    ``tp_local_modules``, the TP-local size of the incomplete layers)."""
    owner = {part[0]: name for name, mod in modules.items() for part in mod["parts"]}
    missing = {name: len(mod["parts"]) for name, mod in modules.items()}
    held = worst = 0
    for tensor in order:
        name = owner[tensor]
        mod = modules[name]
        if len(mod["parts"]) < 2:
            continue
        if missing[name] == len(mod["parts"]):
            held += nbytes_of(mod["shape"], mod["dtype"])
        worst = max(worst, held)
        missing[name] -= 1
        if not missing[name]:
            held -= nbytes_of(mod["shape"], mod["dtype"])
    return worst


def stream_order(files: list[str]) -> list[str]:
    """Tensor names in the order InstantTensor streams them: files sorted by
    name, then by data offset (read from the safetensors headers)."""
    order = []
    for path in sorted(files):
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        order += sorted(header, key=lambda n: header[n]["data_offsets"][0])
    return order


def tensor_sizes(paths: list[str]) -> dict[str, int]:
    """Tensor name -> bytes, read from the safetensors headers of ``paths``."""
    sizes = {}
    for path in paths:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        for name, meta in header.items():
            sizes[name] = meta["data_offsets"][1] - meta["data_offsets"][0]
    return sizes


def geometry_bound(sizes) -> tuple[int, int]:
    """The "geometry rule" bound of a checkpoint and its tensor: B = 2 x L,
    where L is the largest tensor that stays on the GPU at B (tensors above B
    are read on CPU), so that InstantTensor's ring holds two of the largest
    tensors it streams and always reads ahead.  Of the bounds that satisfy
    the rule and leave some tensor above them, the largest (the fewest
    bytes on CPU); without one, twice the largest tensor (all on the GPU)."""
    distinct = sorted(set(sizes))
    if not distinct:
        return 0, 0
    best = distinct[-1]
    for i, s in enumerate(distinct):
        above = distinct[i + 1 :]
        if above and above[-1] > 2 * s and not any(t <= 2 * s for t in above):
            best = s
    return 2 * best, best


def write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False, default=str) + "\n")
    tmp.replace(path)


def env_without_managed() -> dict:
    return {k: v for k, v in os.environ.items() if k not in MANAGED_ENV}
