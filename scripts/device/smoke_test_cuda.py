"""Smoke tests for the device procedure itself, run against the base tree
while the series has no patches: real InstantTensor on the real GPU through
vLLM's own iterator, and the layerwise module's import.  Same conventions as
the series' CUDA tests: no vLLM conftest fixture, CUDA tests skipped (with a
reason) when there is no GPU, the platform set to CUDA with monkeypatch."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@requires_cuda
def test_instanttensor_iterator_on_gpu(tmp_path, monkeypatch):
    from vllm.model_executor.model_loader.weight_utils import (
        instanttensor_weights_iterator,
    )
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    monkeypatch.setattr(current_platform, "current_device", lambda: 0)
    gen = torch.Generator().manual_seed(0)
    weights = {
        f"layers.{i}.w": torch.randint(
            -(2**15), 2**15, (256, 512), generator=gen, dtype=torch.int16
        ).view(torch.bfloat16)
        for i in range(6)
    }
    weights["scale"] = torch.tensor([0.5], dtype=torch.float32)
    path = tmp_path / "model.safetensors"
    save_file(weights, str(path))
    seen = {}
    for name, tensor in instanttensor_weights_iterator([str(path)], False):
        assert tensor.device.type == "cuda"
        seen[name] = tensor.cpu().clone()  # consumed inline
    assert seen.keys() == weights.keys()
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118
            ref = f.get_tensor(name)
            assert seen[name].dtype == ref.dtype and seen[name].shape == ref.shape
            assert torch.equal(seen[name].view(torch.uint8), ref.view(torch.uint8))


def test_layerwise_imports():
    from vllm.model_executor.model_loader.reload import layerwise

    assert callable(layerwise.initialize_online_processing)
