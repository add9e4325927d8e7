"""Peak bytes of materialized layer tensors over one layerwise reload of vLLM's
LlamaForCausalLM on CPU, from CPU sources (the checkpoint's safetensors).

Run from a vLLM tree's root (v0.33.0, or the series applied), each in its own
process: ``VLLM_TARGET_DEVICE=cpu PYTHONPATH=. python <this file> <dir>``; the
first run writes the checkpoint into ``<dir>`` (transformers), later runs reuse
it.  The vocabulary (32001, padded to 32064) makes ``embed_tokens`` and
``lm_head`` complete only in finalize, as a padded ``lm_head`` does.  Bytes are
counted where ``materialize_meta_tensor`` allocates, and uncounted when the
tensor is freed; the peak covers initialize, load_weights and finalize.
"""

import json
import sys
import tempfile
import weakref
from pathlib import Path

import torch


def main(folder: str) -> None:
    import transformers

    path = Path(folder) / "llama"
    if not path.exists():
        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            vocab_size=32001, hidden_size=256, intermediate_size=512,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        )
        transformers.LlamaForCausalLM(config).save_pretrained(path, max_shard_size="2MB")

    from vllm.config import DeviceConfig, LoadConfig, ModelConfig, VllmConfig
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload, initialize_layerwise_reload, meta,
    )
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
    from vllm.model_executor.models.llama import LlamaForCausalLM

    live = {"now": 0, "peak": 0}

    def uncount(nbytes: int) -> None:
        live["now"] -= nbytes

    materialize = meta.materialize_meta_tensor

    def counting(meta_tensor):
        tensor = materialize(meta_tensor)
        live["now"] += tensor.nbytes
        live["peak"] = max(live["peak"], live["now"])
        weakref.finalize(tensor, uncount, tensor.nbytes)
        return tensor

    meta.materialize_meta_tensor = counting
    model_config = ModelConfig(model=str(path), tokenizer=None, skip_tokenizer_init=True,
                               dtype="float32")
    load_config = LoadConfig(load_format="safetensors")
    vllm_config = VllmConfig(model_config=model_config, load_config=load_config,
                             device_config=DeviceConfig("cpu"))
    with set_current_vllm_config(vllm_config), tempfile.TemporaryDirectory() as tmp:
        init_distributed_environment(1, 0, f"file://{tmp}/init", 0, backend="gloo")
        initialize_model_parallel(1, 1)
        model = LlamaForCausalLM(vllm_config=vllm_config)
        from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
        record_metadata_for_reloading(model)
        DefaultModelLoader(load_config).load_weights(model, model_config)
        sizes = {n: m.weight.nbytes for n, m in model.named_modules()
                 if n in ("model.embed_tokens", "lm_head", "model.layers.0.mlp.gate_up_proj")}
        files = sorted(str(f) for f in path.glob("*.safetensors"))
        initialize_layerwise_reload(model)
        model.load_weights(safetensors_weights_iterator(files, False))
        finalize_layerwise_reload(model, model_config)
    print(json.dumps({"peak_materialized_bytes": live["peak"], "layer_bytes": sizes}))


if __name__ == "__main__":
    main(sys.argv[1])
