"""COCO-Stuff's categories and how each setup maps them to class indices.

``stuff``: category 92..182 -> index 0..90 and 183 ("other") -> 91; the sky task: {0: rest, 1: sky
(157)}. ``stuffthing``: the PNG value is category id - 1; the 171 used ids, in id order, are the
class indices. Unlabelled stays ``IGNORE`` (255) throughout.
"""

from __future__ import annotations

import numpy as np

from train.caches.segmentation import IGNORE

from .options import Options

SKY_ID, OTHER_ID = 157, 183
STUFF_IDS = tuple(range(92, 184))  # 92..182 stuff, 183 "other" (the stuff-only files)
UNUSED_THING_IDS = (12, 26, 29, 30, 45, 66, 68, 69, 71, 83, 91)  # in 1..91, never annotated
STUFFTHING_IDS = tuple(i for i in range(1, 183) if i not in UNUSED_THING_IDS)  # 171 classes
# The 80 COCO thing categories (the stuffthing maps' ids 1..90 minus the unused ones).
THING_NAMES = {
    1: "person",
    2: "bicycle",
    3: "car",
    4: "motorcycle",
    5: "airplane",
    6: "bus",
    7: "train",
    8: "truck",
    9: "boat",
    10: "traffic light",
    11: "fire hydrant",
    13: "stop sign",
    14: "parking meter",
    15: "bench",
    16: "bird",
    17: "cat",
    18: "dog",
    19: "horse",
    20: "sheep",
    21: "cow",
    22: "elephant",
    23: "bear",
    24: "zebra",
    25: "giraffe",
    27: "backpack",
    28: "umbrella",
    31: "handbag",
    32: "tie",
    33: "suitcase",
    34: "frisbee",
    35: "skis",
    36: "snowboard",
    37: "sports ball",
    38: "kite",
    39: "baseball bat",
    40: "baseball glove",
    41: "skateboard",
    42: "surfboard",
    43: "tennis racket",
    44: "bottle",
    46: "wine glass",
    47: "cup",
    48: "fork",
    49: "knife",
    50: "spoon",
    51: "bowl",
    52: "banana",
    53: "apple",
    54: "sandwich",
    55: "orange",
    56: "broccoli",
    57: "carrot",
    58: "hot dog",
    59: "pizza",
    60: "donut",
    61: "cake",
    62: "chair",
    63: "couch",
    64: "potted plant",
    65: "bed",
    67: "dining table",
    70: "toilet",
    72: "tv",
    73: "laptop",
    74: "mouse",
    75: "remote",
    76: "keyboard",
    77: "cell phone",
    78: "microwave",
    79: "oven",
    80: "toaster",
    81: "sink",
    82: "refrigerator",
    84: "book",
    85: "clock",
    86: "vase",
    87: "scissors",
    88: "teddy bear",
    89: "hair drier",
    90: "toothbrush",
}


def class_table(options: Options, names: dict[int, str]) -> tuple[list[int], list[str]]:
    """``(class_ids, class_names)`` per class index; sky: ``[-1, 157]`` (-1 = every other id)."""
    if options.sky:
        return [-1, SKY_ID], ["rest", names[SKY_ID]]
    if options.setup == "stuff":
        return list(STUFF_IDS), [names[i] for i in STUFF_IDS]
    return list(STUFFTHING_IDS), [THING_NAMES.get(i) or names[i] for i in STUFFTHING_IDS]


def category_lut(options: Options) -> np.ndarray:
    """``lut[category id]`` -> class index for the stuff JSON (256 entries, 255 elsewhere)."""
    lut = np.full(256, IGNORE, np.uint8)
    for index, cid in enumerate(STUFF_IDS):
        lut[cid] = (cid == SKY_ID) if options.sky else index
    return lut


def stuffthing_lut() -> tuple[np.ndarray, np.ndarray]:
    """``(lut, valid)`` over PNG values: ``lut[id - 1]`` = class index, 255 -> 255."""
    lut, valid = np.full(256, IGNORE, np.uint8), np.zeros(256, bool)
    for index, cid in enumerate(STUFFTHING_IDS):
        lut[cid - 1], valid[cid - 1] = index, True
    valid[IGNORE] = True
    return lut, valid


def describe_stuffthing_values() -> str:
    unused = ", ".join(str(i - 1) for i in UNUSED_THING_IDS)
    return f"0..181 except {unused} (category id - 1), and 255 = unlabelled"
