"""The CamVid segmentation study (docs/segmentation/camvid.md): ``python -m benchmarks.segmentation_study --help``."""
