"""Segmentation models with the shape node: shapes at any size, one encoder pass, the shape node's
input, gradients, SegNet's unpooling, pretrained weights (offline, local files), bad input."""

from __future__ import annotations

import socket
import time
import urllib.error

import huggingface_hub.constants as hf_constants
import pytest
import segmentation_models_pytorch as smp
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torchvision.models import VGG16_BN_Weights

from train import seg_models, weights
from train.seg_models import build_segmentation_model, valid_mean

SMALL = ("deeplabv3plus", "resnet18")  # the configs' architecture with a small encoder
SEGNET = ("segnet", "vgg16_bn")


def _build(arch_encoder, seed=0, **kw):
    torch.manual_seed(seed)
    return build_segmentation_model(*arch_encoder, kw.pop("encoder_weights", None), 4, **kw)


@pytest.fixture(scope="module")
def deeplab():
    return _build(SMALL).eval()


@pytest.fixture(scope="module")
def segnet():
    return _build(SEGNET).eval()


def _run(model, hw, batch=2, seed=0):
    x = torch.randn(batch, model.in_channels, *hw, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return x, *model(x)


class _Recorder:
    """Forward hook: remembers every output of a module."""

    def __init__(self, module):
        self.outputs = []
        self.handle = module.register_forward_hook(lambda _m, _i, out: self.outputs.append(out))

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.handle.remove()


# --- shapes, padding ------------------------------------------------------------------------------


@pytest.mark.parametrize("hw", [(106, 160), (53, 77)])
def test_deeplab_output_shapes_at_odd_sizes(deeplab, hw):
    _, logits, u = _run(deeplab, hw)
    assert logits.shape == (2, 4, *hw) and u.shape == (2,)
    assert deeplab.size_multiple == 16  # DeepLabV3+ encoder output stride; 106 is not a multiple


def test_segnet_output_shapes_at_odd_sizes_and_several_scores():
    model = _build(SEGNET, shape_scores=3).eval()
    for hw in [(106, 160), (21, 45)]:
        _, logits, u = _run(model, hw)
        assert logits.shape == (2, 4, *hw) and u.shape == (2, 3)
    assert model.size_multiple == 32


def test_matches_smps_own_forward_when_no_padding_is_needed(deeplab):
    torch.manual_seed(0)  # same seed, same construction order: the same weights
    reference = smp.create_model(
        *SMALL[:1], encoder_name=SMALL[1], encoder_weights=None, classes=4
    ).eval()
    x, logits, _ = _run(deeplab, (64, 96))
    with torch.no_grad():
        assert torch.equal(logits, reference(x))
        x, logits, _ = _run(deeplab, (53, 77))  # by hand: zero pad to (64, 80), smp, crop
        assert torch.equal(logits, reference(F.pad(x, (0, 3, 0, 11)))[..., :53, :77])


@pytest.mark.parametrize("name", ["deeplab", "segnet"])
def test_logits_are_the_crop_of_the_zero_padded_inputs_logits(name, request):
    model = request.getfixturevalue(name)
    hw = (53, 77) if name == "deeplab" else (21, 45)
    x, logits, _ = _run(model, hw)
    padded = F.pad(x, (0, -hw[1] % model.size_multiple, 0, -hw[0] % model.size_multiple))
    with torch.no_grad():
        logits_padded, _ = model(padded)  # needs no padding: the pad is a no-op
    assert torch.equal(logits, logits_padded[..., : hw[0], : hw[1]])


# --- the shape node ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["deeplab", "segnet"])
def test_encoder_runs_exactly_once_per_forward(name, request):
    model = request.getfixturevalue(name)
    with _Recorder(model.encoder) as rec:
        _run(model, (20, 27))
    assert len(rec.outputs) == 1


def test_valid_mean_averages_the_cells_that_cover_the_image():
    f = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    # 53 x 77 padded to 128 x 160 at stride 32: ceil(53/32) = 2 rows, ceil(77/32) = 3 cols
    assert torch.equal(valid_mean(f, (53, 77), (128, 160)), f[..., :2, :3].mean((-2, -1)))
    assert torch.equal(valid_mean(f, (128, 160), (128, 160)), f.mean((-2, -1)))


@pytest.mark.parametrize(
    ("arch_encoder", "hw", "cells"),
    [
        (SMALL, (106, 160), (7, 10)),  # multiple = stride: every cell covers the image
        (SEGNET, (21, 45), (1, 2)),
        (("pan", "resnet18"), (53, 77), (4, 5)),  # PAN pads to 128: only 4 x 5 of 8 x 8 cells
    ],
)
def test_u_is_the_shape_head_on_the_pooled_deepest_encoder_features(arch_encoder, hw, cells):
    model = _build(arch_encoder).eval()
    with _Recorder(model.encoder) as rec:
        _, _, u = _run(model, hw)
    out = rec.outputs[0]
    deepest = (out[0] if isinstance(out, tuple) else out)[-1]
    pooled = deepest[..., : cells[0], : cells[1]].mean((-2, -1))  # by hand
    linear = model.shape_head.linear
    assert torch.allclose(u, (pooled @ linear.weight.T + linear.bias)[:, 0], atol=1e-6)
    if deepest.shape[-2:] != cells:  # padding cells left out: not the plain mean
        all_cells = deepest.mean((-2, -1)) @ linear.weight.T + linear.bias
        assert not torch.allclose(u, all_cells[:, 0], atol=1e-4)


@pytest.mark.parametrize("arch_encoder", [SMALL, SEGNET])
def test_gradients_flow_from_u_to_the_encoder_and_from_logits_to_the_decoder(arch_encoder):
    model = _build(arch_encoder).train()
    logits, u = model(torch.randn(2, 3, 20, 27))
    u.sum().backward(retain_graph=True)
    first_conv = next(p for n, p in model.encoder.named_parameters() if p.dim() == 4)
    assert first_conv.grad is not None and first_conv.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.decoder.parameters())  # u reads the encoder only
    assert all(p.grad is None for p in model.segmentation_head.parameters())
    model.zero_grad(set_to_none=True)
    logits.square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.decoder.parameters())
    assert all(p.grad is None for p in model.shape_head.parameters())


# --- SegNet ----------------------------------------------------------------------------------------


def test_segnet_unpools_at_the_encoders_argmax_positions(segnet):
    with _Recorder(segnet.encoder) as enc, _Recorder(segnet.decoder.unpool) as unpool:
        _run(segnet, (53, 77))
    features, indices = enc.outputs[0]
    assert len(indices) == 5 and len(unpool.outputs) == 5
    x, idx, above = features[-1], indices[-1], features[-2]
    expected = torch.zeros(*x.shape[:2], above.shape[-2] * above.shape[-1])
    expected.scatter_(2, idx.flatten(2), x.flatten(2))  # each value back at its argmax
    first = unpool.outputs[0]
    assert torch.equal(first, expected.view(*x.shape[:2], *above.shape[-2:]))
    assert (first != 0).sum() <= idx.numel()


def test_segnet_encoder_is_torchvisions_vgg16_bn_feature_extractor():
    classifier = 512 * 7 * 7 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 1000 + 1000
    expected = VGG16_BN_Weights.IMAGENET1K_V1.meta["num_params"] - classifier
    encoder = seg_models.SegNetEncoder()
    assert sum(p.numel() for p in encoder.parameters()) == expected
    assert encoder.out_channels == (3, 64, 128, 256, 512, 512)
    pools = [m for m in encoder.features if isinstance(m, torch.nn.MaxPool2d)]
    assert len(pools) == 5 and all(m.return_indices for m in pools)


# --- pretrained weights ----------------------------------------------------------------------------


def _closed_port_url() -> str:
    with socket.socket() as s:  # bind, then close: nothing listens there
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_reachable_probe():
    assert not seg_models._reachable(_closed_port_url(), timeout=2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert seg_models._reachable(f"http://127.0.0.1:{s.getsockname()[1]}", timeout=2)


def test_imagenet_without_network_fails_fast_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))  # nothing cached
    monkeypatch.setattr(hf_constants, "ENDPOINT", _closed_port_url())  # no route to the hub
    offline_before = hf_constants.HF_HUB_OFFLINE
    start = time.monotonic()
    with pytest.raises(
        RuntimeError, match=r"no network route.*encoder_weights=null.*HF_HUB_OFFLINE"
    ):
        build_segmentation_model(*SMALL, "imagenet", 4)
    assert time.monotonic() - start < 10  # the hub client alone retries for ~25 s
    assert hf_constants.HF_HUB_OFFLINE == offline_before


def test_imagenet_without_network_loads_from_a_prepopulated_cache(monkeypatch, tmp_path):
    settings = smp.encoders.encoders["resnet18"]["pretrained_settings"]["imagenet"]
    repo = "models--" + settings["repo_id"].replace("/", "--")
    snapshot = tmp_path / repo / "snapshots" / settings["revision"]  # the hub cache's layout
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    state = {k: v.contiguous() for k, v in _build(SMALL, seed=1).encoder.state_dict().items()}
    save_file(state, snapshot / "model.safetensors")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hf_constants, "ENDPOINT", _closed_port_url())
    model = _build(SMALL, seed=2, encoder_weights="imagenet")
    assert torch.equal(model.encoder.conv1.weight, state["conv1.weight"])


def test_failed_download_is_a_runtime_error_with_the_fix(monkeypatch, tmp_path):
    def no_download(*_a, **_k):
        raise OSError("connection reset")

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(seg_models, "_reachable", lambda *_a, **_k: True)
    monkeypatch.setattr(smp.encoders, "hf_hub_download", no_download)
    with pytest.raises(RuntimeError, match=r"download failed \(connection reset\).*TORCH_HOME"):
        build_segmentation_model(*SMALL, "imagenet", 4)


@pytest.mark.parametrize("reachable", [False, True])
def test_segnet_imagenet_offline_fails_fast(monkeypatch, tmp_path, reachable):
    def no_download(*_a, **_k):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path))  # empty torch hub cache
    monkeypatch.setattr(weights, "_reachable", lambda *_a, **_k: reachable)
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_download)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"vgg16_bn-6c64b313\.pth|no network"):
        build_segmentation_model(*SEGNET, "imagenet", 4)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_local_encoder_weights_file_loads(tmp_path, suffix):
    source = _build(SMALL, seed=1)
    state = {k: v.contiguous() for k, v in source.encoder.state_dict().items()}
    path = tmp_path / f"encoder{suffix}"
    if suffix == ".safetensors":
        save_file(state, path)
    else:
        torch.save(state, path)
    model = _build(SMALL, seed=2, encoder_weights=str(path))
    loaded = model.encoder.state_dict()
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    fresh = _build(SMALL, seed=2)  # same seed, no file: the decoder is untouched by the file
    assert not torch.equal(fresh.encoder.conv1.weight, model.encoder.conv1.weight)
    assert torch.equal(fresh.segmentation_head[0].weight, model.segmentation_head[0].weight)


def test_segnet_takes_torchvisions_vgg_file_and_adapts_the_first_conv(tmp_path):
    encoder = seg_models.SegNetEncoder()
    state = {**encoder.state_dict(), "classifier.0.weight": torch.zeros(2, 2)}  # full VGG file
    torch.save(state, tmp_path / "vgg16_bn.pth")
    model = _build(SEGNET, in_channels=1, encoder_weights=str(tmp_path / "vgg16_bn.pth"))
    rgb = encoder.features[0].weight
    assert torch.equal(model.encoder.features[0].weight, rgb.sum(1, keepdim=True))
    assert torch.equal(model.encoder.features[1].weight, encoder.features[1].weight)
    _, logits, _ = _run(model.eval(), (20, 27))
    assert logits.shape == (2, 4, 20, 27)


def test_mismatched_local_file_is_a_clear_error(tmp_path):
    torch.save(_build(SMALL).encoder.state_dict(), tmp_path / "resnet18.pt")
    with pytest.raises(ValueError, match=r"resnet18\.pt.*do not match the 'resnet34' encoder"):
        build_segmentation_model("deeplabv3plus", "resnet34", str(tmp_path / "resnet18.pt"), 4)
    with pytest.raises(ValueError, match=r"does not exist"):
        build_segmentation_model(*SMALL, str(tmp_path / "missing.pth"), 4)
    (tmp_path / "junk.pth").write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"could not read a state dict"):
        build_segmentation_model(*SMALL, str(tmp_path / "junk.pth"), 4)


# --- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("unet3", "resnet18", None, 4), r"unknown arch 'unet3'.*'deeplabv3plus'.*'segnet'"),
        (("deeplabv3plus", "resnet19", None, 4), r"unknown encoder 'resnet19'.*'resnet18'"),
        (("deeplabv3plus", "tu-nonexistent_net", None, 4), r"unknown timm encoder"),
        (("segnet", "resnet18", None, 4), r"SegNet's encoder must be 'vgg16_bn'"),
        (("segnet", "vgg16_bn", "instagram", 4), r"SegNet's encoder_weights must be"),
        (("deeplabv3plus", "resnet18", "instagram", 4), r"'instagram' does not exist.*'imagenet'"),
        (("deeplabv3plus", "resnet18", None, 0), r"num_classes must be an integer >= 1"),
        (("deeplabv3plus", "resnet18", None, 4, 0), r"shape_scores must be an integer >= 1"),
        (("deeplabv3plus", "resnet18", None, 4, 1, 0), r"in_channels must be an integer >= 1"),
    ],
)
def test_bad_arguments_are_value_errors(args, match):
    with pytest.raises(ValueError, match=match):
        build_segmentation_model(*args)


def test_arch_is_case_insensitive_and_bad_input_tensors_are_rejected(deeplab):
    model = build_segmentation_model("DeepLabV3Plus", "resnet18", None, 2)
    assert model.segmentation_head[0].out_channels == 2
    with pytest.raises(ValueError, match=r"3 channels"):
        deeplab(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match=r"float tensor \(B, C, H, W\)"):
        deeplab(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))
