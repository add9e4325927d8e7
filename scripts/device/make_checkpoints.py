"""Write the qualification checkpoints (CPU only, so it can run beside tests).

    python3 make_checkpoints.py ROOT [--only synthetic,...,draft,kimi,disk] [--disk-root DISK]

ROOT/synthetic  about 8 GiB, 4 indexed shards, mixed tensor sizes
ROOT/staging    the same shards (hard links) plus a shard with one 1 GiB tensor
ROOT/heavy      shards 1-2 of the same (hard links) and three 1 GiB tensors, each
                in a shard of its own, first, in the middle and last: 43 % of
                the bytes are in tensors above a 64 MiB staging bound
ROOT/layered    a model-like stack for layerwise processing (fused q/k/v, gate/up)
ROOT/real       a small Qwen3-MoE written by transformers' save_pretrained, sharded
ROOT/many       116,000 bf16 tensors of 16 KiB in 100 indexed shards (1.9 GB), and
                ROOT/many-part, its first 20 shards (hard links)
ROOT/draft      an EAGLE-style draft of a Kimi-class target: lm_head 163840 x 7168
                bf16 and one dense layer, 3.3 GiB
ROOT/kimi       the synthetic shards (hard links) between embed_tokens and lm_head
                (163840 x 7168 bf16 each; lm_head the draft's shard, linked)
DISK/disk       staging's 1 GiB tensor and two synthetic shards, copied to
                ``--disk-root`` (the machine's own disk), 5 GiB

Each folder gets ``checkpoint.json``: what was written (tensor count, bytes,
stream order where the benchmarks need it, timings).  Tensor bytes are random
(a seeded random block, tiled from a different offset for every tensor), so a
stale or overwritten buffer never matches by accident.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

TORCH_DTYPE = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F8_E4M3": torch.float8_e4m3fn,
    "I64": torch.int64,
    "I32": torch.int32,
    "U8": torch.uint8,
}

BLOCK = np.random.default_rng(20261129).integers(
    0, 256, size=64 * common.MiB + 4093, dtype=np.uint8
)


def random_tensor(index: int, shape, dtype: str) -> torch.Tensor:
    n = common.nbytes_of(shape, dtype)
    buf = np.empty(n, dtype=np.uint8)
    pos, off = 0, (index * 1_000_003) % len(BLOCK)
    while pos < n:
        take = min(len(BLOCK) - off, n - pos)
        buf[pos : pos + take] = BLOCK[off : off + take]
        pos += take
        off = 0
    return torch.from_numpy(buf).view(TORCH_DTYPE[dtype]).reshape(shape)


def write_sharded(
    folder: Path, spec: list[list[tuple]], first_index: int = 0, names: list[str] | None = None
) -> dict:
    """Write ``spec`` as indexed shards ``model-0000i-of-0000n.safetensors``."""
    folder.mkdir(parents=True, exist_ok=True)
    n = len(spec)
    files = names or [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    offsets = [first_index]
    for shard in spec[:-1]:
        offsets.append(offsets[-1] + len(shard))

    def one(i: int) -> None:
        tensors = {
            name: random_tensor(offsets[i] + j, shape, dtype)
            for j, (name, shape, dtype) in enumerate(spec[i])
        }
        save_file(tensors, str(folder / files[i]), metadata={"format": "pt"})

    with ThreadPoolExecutor(max_workers=min(4, n)) as pool:
        list(pool.map(one, range(n)))
    weight_map = {name: files[i] for i, shard in enumerate(spec) for name, _, _ in shard}
    total = sum(common.nbytes_of(s, d) for shard in spec for _, s, d in shard)
    return {"files": files, "weight_map": weight_map, "total_size": total}


def write_index(folder: Path, weight_map: dict, total: int) -> None:
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def describe(folder: Path, files: list[str], extra: dict) -> dict:
    paths = [str(folder / f) for f in files]
    order = common.stream_order(paths)
    info = {
        "dir": str(folder),
        "files": files,
        "n_tensors": len(order),
        "payload_bytes": None,
        "file_bytes": sum(os.path.getsize(p) for p in paths),
        **extra,
    }
    sizes = {}
    for path in paths:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        for name, meta in header.items():
            sizes[name] = meta["data_offsets"][1] - meta["data_offsets"][0]
    info["payload_bytes"] = sum(sizes.values())
    info["largest_tensor_bytes"] = max(sizes.values())
    common.write_json(folder / "checkpoint.json", info)
    return info


SMALL = False  # --small: CPU tests of these scripts


def make_synthetic(root: Path) -> dict:
    folder = root / "synthetic"
    spec = common.synthetic_spec(small=SMALL)
    written = write_sharded(folder, spec)
    write_index(folder, written["weight_map"], written["total_size"])
    return describe(folder, written["files"], {"kind": "synthetic"})


def link_shards(
    root: Path, folder: Path, keep: int | None = None, source: str = "synthetic"
) -> tuple[list[str], dict]:
    """Hard-link the first ``keep`` (default: all) shards of ``source`` into
    ``folder`` (no second copy in RAM); returns their names and weight map."""
    src = root / source
    folder.mkdir(parents=True, exist_ok=True)
    synthetic = json.loads((src / "model.safetensors.index.json").read_text())
    files = sorted(set(synthetic["weight_map"].values()))[:keep]
    for name in files:
        target = folder / name
        if target.exists():
            target.unlink()
        try:
            os.link(src / name, target)
        except OSError:
            shutil.copy2(src / name, target)
    weight_map = {k: v for k, v in synthetic["weight_map"].items() if v in files}
    return files, weight_map


def big_tensor(name: str) -> tuple:
    """A 1 GiB tensor (``--small``: 4 MiB) named ``name``."""
    _, shape, dtype = common.BIG_TENSOR_SMALL if SMALL else common.BIG_TENSOR
    return (name, shape, dtype)


def make_staging(root: Path) -> dict:
    """The synthetic shards plus one shard holding a 1 GiB tensor, sorted
    between shards 2 and 3 so the oversized tensor sits in the middle of the
    stream."""
    folder = root / "staging"
    files, weight_map = link_shards(root, folder)
    extra_name = files[1].replace("-of-", "b-extra-of-")
    big = big_tensor(common.BIG_TENSOR[0])
    written = write_sharded(folder, [[big]], first_index=len(weight_map), names=[extra_name])
    weight_map |= written["weight_map"]
    write_index(folder, weight_map, total_size(folder, files + [extra_name]))
    return describe(
        folder,
        sorted(files + [extra_name]),
        {"kind": "staging", "big_tensor": big[0], "big_file": str(folder / extra_name)},
    )


def make_heavy(root: Path) -> dict:
    """Synthetic shards 1 and 2 and three 1 GiB tensors, each in a shard of
    its own, sorted first, between the two and last (as a vocabulary-sized
    embedding and lm_head would be): 3 of 6.9 GiB above a 64 MiB bound."""
    folder = root / "heavy"
    files, weight_map = link_shards(root, folder, keep=2)
    names = ["model-00000-heavy.safetensors"] + [f.replace("-of-", "b-heavy-of-") for f in files]
    spec = [[big_tensor(f"model.heavy_{i}.weight")] for i in range(len(names))]
    written = write_sharded(folder, spec, first_index=20_000, names=names)
    weight_map |= written["weight_map"]
    write_index(folder, weight_map, total_size(folder, files + names))
    info = describe(folder, sorted(files + names), {"kind": "heavy"})
    big_bytes = common.nbytes_of(spec[0][0][1], spec[0][0][2]) * len(names)
    info["oversized_fraction"] = big_bytes / info["payload_bytes"]
    common.write_json(folder / "checkpoint.json", info)
    return info


def total_size(folder: Path, files: list[str]) -> int:
    """The payload bytes of ``files`` (the index's ``total_size``)."""
    total = 0
    for name in files:
        with open(folder / name, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        total += sum(m["data_offsets"][1] - m["data_offsets"][0] for m in header.values())
    return total


def make_layered(root: Path) -> dict:
    folder = root / "layered"
    spec = common.layered_spec(small=SMALL)
    written = write_sharded(folder, spec, first_index=10_000)
    write_index(folder, written["weight_map"], written["total_size"])
    order = common.stream_order([str(folder / f) for f in written["files"]])
    sizes = {name: common.nbytes_of(s, d) for shard in spec for name, s, d in shard}
    modules = common.layered_modules(spec)
    return describe(
        folder,
        written["files"],
        {
            "kind": "layered",
            "modules": modules,
            "order": order,
            "incomplete_bound_bytes": common.incomplete_bound(modules, order, sizes),
            "model_bytes": sum(sizes.values()),
        },
    )


def make_real(root: Path) -> dict:
    """A small Qwen3-MoE (random weights) written by transformers itself."""
    import transformers

    folder = root / "real"
    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    arch = "Qwen3MoeForCausalLM"
    try:
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        scale = 8 if SMALL else 1
        config = Qwen3MoeConfig(
            vocab_size=32768 // scale,
            hidden_size=1024 // scale,
            intermediate_size=2048,
            moe_intermediate_size=512,
            num_hidden_layers=6,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=64,
            num_experts=16,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            tie_word_embeddings=False,
            max_position_embeddings=4096,
        )
        model = Qwen3MoeForCausalLM(config)
    except ImportError:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        arch = "Qwen3ForCausalLM"
        config = Qwen3Config(
            vocab_size=32768,
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=12,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=64,
            tie_word_embeddings=False,
        )
        model = Qwen3ForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(str(folder), max_shard_size="2MB" if SMALL else "160MB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    return describe(
        folder,
        files,
        {
            "kind": "real",
            "architecture": arch,
            "transformers": transformers.__version__,
            "params": sum(p.numel() for p in model.parameters()),
        },
    )


def make_many(root: Path) -> dict:
    """Many small tensors (``common.many_spec``), and ``many-part``: its first
    fifth of the shards (hard links), where the retention check's cost is
    measured in shorter loads."""
    folder = root / "many"
    spec = common.many_spec(small=SMALL)
    written = write_sharded(folder, spec, first_index=30_000)
    write_index(folder, written["weight_map"], written["total_size"])
    part = root / "many-part"
    files, weight_map = link_shards(root, part, keep=len(spec) // 5, source="many")
    write_index(part, weight_map, total_size(part, files))
    part_info = describe(part, files, {"kind": "many-part"})
    return describe(
        folder,
        written["files"],
        {"kind": "many", "part": {k: part_info[k] for k in ("dir", "n_tensors", "payload_bytes")}},
    )


VOCAB_SHAPE = (163840, 7168)  # Kimi-K2's embed_tokens and lm_head, bf16: 2.19 GiB each
VOCAB_SHAPE_SMALL = (8192, 256)  # --small: 4 MiB, above its 2 MiB bound


def vocab_tensor(name: str) -> tuple:
    return (name, VOCAB_SHAPE_SMALL if SMALL else VOCAB_SHAPE, "BF16")


def make_draft(root: Path) -> dict:
    """A draft shaped like an EAGLE draft of a Kimi-class target: ``lm_head``
    (163840 x 7168 bf16, 2.19 GiB) in a shard of its own, and one dense
    layer (hidden 7168, MLP 18432) in another: about 3.3 GiB."""
    folder = root / "draft"
    h, m, kv = (256, 640, 64) if SMALL else (7168, 18432, 1024)
    p = "model.layers.0."
    layer = [
        (f"{p}self_attn.q_proj.weight", (h, h), "BF16"),
        (f"{p}self_attn.k_proj.weight", (kv, h), "BF16"),
        (f"{p}self_attn.v_proj.weight", (kv, h), "BF16"),
        (f"{p}self_attn.o_proj.weight", (h, h), "BF16"),
        (f"{p}mlp.gate_proj.weight", (m, h), "BF16"),
        (f"{p}mlp.up_proj.weight", (m, h), "BF16"),
        (f"{p}mlp.down_proj.weight", (h, m), "BF16"),
        (f"{p}input_layernorm.weight", (h,), "BF16"),
        ("model.fc.weight", (h, 2 * h), "BF16"),
    ]
    written = write_sharded(folder, [layer, [vocab_tensor("lm_head.weight")]], first_index=40_000)
    write_index(folder, written["weight_map"], written["total_size"])
    return describe(folder, written["files"], {"kind": "draft"})


def make_kimi(root: Path) -> dict:
    """A Kimi-K2-class byte mix: only ``embed_tokens`` (first shard) and
    ``lm_head`` (last; the draft's shard, hard-linked) at 163840 x 7168 bf16,
    the synthetic checkpoint's middle shards (dense tensors of at most
    56 MiB; not the shards with its own embedding and head) between them."""
    folder = root / "kimi"
    files, weight_map = link_shards(root, folder)
    # The synthetic shards that hold its own embedding and head stay out.
    vocab = {weight_map[n] for n in weight_map if n.startswith(("model.embed_tokens.", "lm_head."))}
    for name in vocab:
        (folder / name).unlink()
    files = [f for f in files if f not in vocab]
    weight_map = {n: f for n, f in weight_map.items() if f not in vocab}
    first = "model-00000-embed.safetensors"
    written = write_sharded(folder, [[vocab_tensor("model.embed_tokens.weight")]],
                            first_index=50_000, names=[first])  # fmt: skip
    last = "model-99999-lm-head.safetensors"
    draft = json.loads((root / "draft" / "model.safetensors.index.json").read_text())
    target = folder / last
    target.unlink(missing_ok=True)
    os.link(root / "draft" / draft["weight_map"]["lm_head.weight"], target)
    weight_map |= written["weight_map"] | {"lm_head.weight": last}
    names = sorted([first, *files, last])
    write_index(folder, weight_map, total_size(folder, names))
    return describe(folder, names, {"kind": "kimi"})


DISK_ROOT: Path | None = None  # --disk-root: the GPU machine's own disk


def make_disk(root: Path) -> dict:
    """The staging checkpoint's first two synthetic shards and its 1 GiB
    tensor, copied (not linked) to ``DISK_ROOT``, a folder on the machine's
    own disk, where InstantTensor reads with its O_DIRECT backends."""
    folder = DISK_ROOT / "disk"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    staging = json.loads((root / "staging" / "model.safetensors.index.json").read_text())
    files = sorted(set(staging["weight_map"].values()))
    keep = [f for f in files if "extra" in f] + [f for f in files if "extra" not in f][:2]
    for name in keep:
        shutil.copyfile(root / "staging" / name, folder / name)
    weight_map = {k: v for k, v in staging["weight_map"].items() if v in keep}
    write_index(folder, weight_map, total_size(folder, keep))
    os.sync()
    return describe(folder, sorted(keep), {"kind": "disk"})


MAKERS = {
    "synthetic": make_synthetic,
    "staging": make_staging,
    "heavy": make_heavy,
    "layered": make_layered,
    "real": make_real,
    "many": make_many,
    "draft": make_draft,
    "kimi": make_kimi,
    "disk": make_disk,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--only", default=",".join(MAKERS))
    parser.add_argument("--small", action="store_true", help="tiny sizes, for CPU tests")
    parser.add_argument("--disk-root", help="the disk checkpoint's folder (default: ROOT)")
    args = parser.parse_args()
    global SMALL, DISK_ROOT
    SMALL = args.small
    DISK_ROOT = Path(args.disk_root or args.root)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in filter(None, args.only.split(",")):
        t0 = time.perf_counter()
        info = MAKERS[name](root)
        info["seconds_to_write"] = round(time.perf_counter() - t0, 2)
        results[name] = info
        print(
            f"{name}: {info['n_tensors']} tensors, {info['payload_bytes'] / common.GiB:.2f}"
            f" GiB in {len(info['files'])} files, {info['seconds_to_write']} s",
            flush=True,
        )
    summary = {
        k: {kk: vv for kk, vv in v.items() if kk not in ("modules", "order")}
        for k, v in results.items()
    }
    common.write_json(root / "checkpoints.json", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
