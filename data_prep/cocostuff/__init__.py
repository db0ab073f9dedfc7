"""Build COCO-Stuff segmentation caches with shape labels: the sky task and all classes (docs/method/shape-labels.md sec. 6).

Setups (``--setup``):

* ``stuff`` -- the stuff-only annotations ``stuff_{train,val}2017.json``: 92 classes, category
  92..182 -> index 0..90 and 183 ("other": every thing pixel, merged) -> 91; unlabelled -> 255.
  The label map is painted at the original size from the RLE masks (compressed or uncompressed
  counts; start at 255, paint the annotations in id order), then resized.
* ``stuffthing`` -- the official ``stuffthingmaps_trainval2017`` PNGs (value = category id - 1,
  255 = unlabelled): 171 classes, ids 1..182 without the 11 unused COCO thing ids, contiguous in id
  order. The stuff JSON is read here too: it gives the image list (and sizes) and the stuff names.
* ``--only sky-other`` (setup ``stuff``): the paper's sky task, classes {0: rest, 1: sky}
  (category 157); unlabelled pixels stay 255; only images with >= 1 sky pixel after resizing are
  kept (the others are counted in ``meta.json``: ``dropped_no_sky``).

Images and label maps are resized to ``--size H W`` (default 106 x 160, aspect not preserved, as
the paper): images with PIL's box filter (``area``) or ``bilinear`` after conversion to RGB
(grayscale and CMYK JPEGs included), labels with nearest neighbour. Shape labels (docs/method/shape-labels.md sec. 6) are
computed on the resized maps:

* sky: ``size`` = ``s'`` = number of sky pixels; ``s = 1[s' > t]`` with ``t`` = the mean training
  ``s'`` (val uses the *training* ``t``). ``--bins P > 2``: ``s`` = number of edges ``s'``
  exceeds, the edges being the training quantiles at ``k/P`` (k = 1..P-1, numpy's linear rule).
* all classes: for each class ``c`` present (>= 1 pixel; 255 is no class, "other" is one),
  ``f_c`` = pixels of ``c`` / (H * W) -- over *all* pixels of the image, unlabelled ones included
  -- and ``s^c = 1[f_c > t]`` (``--threshold``, default 0.05); with ``--thresholds t_1 < ... <
  t_{p-1}`` (p bins) ``s^c`` = number of thresholds ``f_c`` exceeds. ``s`` = the most common
  ``s^c`` over the classes present; **ties go to the smaller bin**: an image with as many small as
  big regions is "small", it has the small regions the regularizer is meant to protect. An image
  without labelled pixels gets ``s = 0`` and is counted (``no_labelled_pixels``). ``size`` = the
  number of labelled pixels.

Cache (``--out DIR``): the layout, its format constants and its reader ``load`` (arrays
memory-mapped) are in ``train.caches.segmentation`` (shared with ``data_prep.camvid``). Per split, ``images``, ``labels``, ``shape``,
``size``, ``fractions`` and ``image_ids`` ``.npy`` arrays and ``table.csv`` (one row per image:
image_id, file_name, orig_height, orig_width, size, shape, classes = the class indices present,
space-separated); ``class_sizes.png``: histogram of per-(image, class) ``f_c`` (log x) with ``t``
(the paper's Fig. 6), sky: histogram of ``s'`` with the threshold; ``meta.json`` written last,
atomically: its presence + validity mark completion.

Images are processed in shards (``--shard-size``, 512) by a process pool (``--workers``), each
shard written atomically under ``DIR/.partial/<split>/``; an interrupted run resumes from the
shards whose options and input checksums match. A re-run with the same options and inputs (sha256
of the JSON files, number of files in the image / map folders) does nothing. Missing or unreadable
images (and missing stuffthing PNGs) are skipped and listed in ``meta.json``; inconsistent
annotations raise ``ValueError``. The same inputs and options give identical ``.npy`` bytes.
``meta.json`` holds the classes (names, COCO ids), the options that shaped the output, the edges,
per split the counts (images, shape bins, pixels and images per class, skipped images with their
reason, ``no_labelled_pixels``), the input fingerprint and the sha256 and size of every array.
``--limit N`` keeps the first N images (by id) of each split, for tests and demos.

    python -m data_prep.cocostuff --root data/cocostuff --setup stuff --only sky-other --out data/coco-sky
    python -m data_prep.cocostuff --root data/cocostuff --setup stuffthing --out data/coco-stuffthing

Modules: ``options`` (``Options``), ``classes`` (category ids -> class indices), ``inputs``
(locating and parsing the inputs), ``decode`` (one image), ``shapes`` (the shape-label rules),
``shards`` (resumable multiprocess processing), ``assemble`` (one split's arrays, table and
counts), ``plot``, ``build`` (``prepare``, ``is_complete``) and ``cli`` (``main``).
"""

from train.caches.segmentation import (
    ARRAYS,
    FORMAT_VERSION,
    IGNORE,
    META_NAME,
    PLOT_NAME,
    SPLITS,
    TABLE_NAME,
    inspect,
    load,
)

from .build import is_complete, make_jobs, prepare
from .classes import (
    OTHER_ID,
    SKY_ID,
    STUFF_IDS,
    STUFFTHING_IDS,
    THING_NAMES,
    UNUSED_THING_IDS,
    category_lut,
    class_table,
    describe_stuffthing_values,
    stuffthing_lut,
)
from .cli import main
from .decode import Job, decode_segmentation, process_image
from .inputs import Inputs, SplitSource, find_inputs, fingerprint, read_split
from .options import INTERPOLATIONS, SETUPS, Options, default_workers
from .plot import plot_class_sizes
from .shapes import bin_sizes, class_bins, majority_shape, size_edges
from .shards import PARTIAL_NAME

__all__ = [
    "ARRAYS",
    "FORMAT_VERSION",
    "IGNORE",
    "INTERPOLATIONS",
    "META_NAME",
    "OTHER_ID",
    "PARTIAL_NAME",
    "PLOT_NAME",
    "SETUPS",
    "SKY_ID",
    "SPLITS",
    "STUFFTHING_IDS",
    "STUFF_IDS",
    "TABLE_NAME",
    "THING_NAMES",
    "UNUSED_THING_IDS",
    "Inputs",
    "Job",
    "Options",
    "SplitSource",
    "bin_sizes",
    "category_lut",
    "class_bins",
    "class_table",
    "decode_segmentation",
    "default_workers",
    "describe_stuffthing_values",
    "find_inputs",
    "fingerprint",
    "inspect",
    "is_complete",
    "load",
    "main",
    "majority_shape",
    "make_jobs",
    "plot_class_sizes",
    "prepare",
    "process_image",
    "read_split",
    "size_edges",
    "stuffthing_lut",
]
