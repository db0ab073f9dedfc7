"""The CamVid segmentation study (issue 30): ``python -m benchmarks.segmentation_study --help``."""
