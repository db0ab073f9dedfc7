"""The CamVid segmentation study (docs/segmentation.md): ``python -m benchmarks.segmentation_study --help``."""
