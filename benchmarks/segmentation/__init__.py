"""The segmentation benchmark (docs/segmentation/index.md): on COCO-Stuff, what the cache buys the loader,
and what the regularizer costs a training step.

1. Loader throughput (images/s through a ``DataLoader`` with ``--workers`` processes, the trainer's
   augmentations included; median of ``--loader-epochs`` passes of 32x / 2x the images drawn
   with replacement, after a warm-up pass): the memory-mapped cache of ``data_prep.cocostuff`` vs
   decoding each JPEG, painting its RLE masks and resizing per sample (``data_prep.cocostuff.process_image``, the
   work the cache does once). Without ``--root`` the images are a generated COCO-Stuff in the
   official format at COCO's photo size (``--photo-size``, default 480x640, JPEG quality 90).
2. Training step time, regularized / baseline, DeepLabV3+ with a ResNet-18 encoder (random init)
   on CPU at 106x160, batch ``--batch``: the two trainers' steps are interleaved (base, reg, ...),
   medians over ``--steps`` steps after warm-up; the regularizer has one state per training image
   of COCO-Stuff train2017 (118287, half of them positive) and runs with ``schedule=EpochEnd()``,
   with ``tau`` stepped densely by the optimizer (``DenseTau()``) and, as a third interleaved
   trainer, sparsely (``SparseTau()``, docs/method/cost.md sec. 11); its epoch end (projection + dual
   step) is timed too and set against an epoch of 118287 images.
3. Seconds per training step of the paper configs' models on this CPU (README numbers).

``spec``: COCO-Stuff's scale, the step size, the paper configs' models; ``run``: the measurements;
``tables``: the report and the plot; ``__main__``: the command line
(``python -m benchmarks.segmentation``).
"""
