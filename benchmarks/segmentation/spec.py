"""What the segmentation benchmark measures at: COCO-Stuff's training set size (one regularizer
state per image), the size of the timed steps, and the paper configs' models."""

from __future__ import annotations

COCO_TRAIN_IMAGES = 118287
SIZE = (106, 160)  # H, W of the timed steps
PAPER_MODELS = (  # (label, model name, encoder, batch, classes) of the configs' step times
    (
        "DeepLabV3+ resnet50 (cocostuff_deeplabv3plus.yaml), batch 8",
        "deeplabv3plus",
        "resnet50",
        8,
        92,
    ),
    ("SegNet vgg16_bn (coco_sky_segnet.yaml), batch 7 (paper)", "segnet", "vgg16_bn", 7, 2),
)
