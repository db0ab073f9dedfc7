#!/bin/bash
# Does resolution bound CamVid's small-object classes? The 11-class recipe of the segmentation study
# (scale jitter [0.5, 2] + crop, poly schedule, 40 epochs; DeepLabV3+ / CE and U-Net + median-
# frequency CE) at 120x160 and at 360x480 (CamVid's own size), on one GPU, runs in parallel; the CUDA
# tests beside them. The script that produced docs/figures/segmentation_study_resolution.md (its runs:
# docs/figures/segmentation_study_runs/gpu/), run from the repository root on a lent GPU machine:
#   OUT=<folder> CAMVID=<CamVid dir> SEEDS_LO="0" SEEDS_HI="0 1" bash benchmarks/segmentation_study/resolution_gpu.sh
#   OUT=<folder> CAMVID=<CamVid dir> SEEDS_LO="1" SEEDS_HI="2" T=300 bash benchmarks/segmentation_study/resolution_gpu.sh
#   python -m benchmarks.segmentation_study resolution --runs runs/gpu   # the table
# Our CamVid travelled to the GPU machine with its images re-encoded as JPEG (quality 92, 4:2:0) to fit
# the machine's 64 MiB transfer; labels unchanged. Knobs (environment): T (seconds per run before it is
# stopped), EPOCHS, SEEDS_LO / SEEDS_HI (seeds at 120x160 / 360x480), DEV, LIMIT (frames per split, a
# dry run), PY (the python), TESTS, WORK (where data/ and runs/ go; default the repository root).
# Without a .whl folder nothing is installed.
set -u
cd "$(dirname "$0")/../.." || exit 1
W=${WORK:-.}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
T=${T:-400}; SEEDS_HI=${SEEDS_HI-"0 1"}; EPOCHS=${EPOCHS:-40}; DEV=${DEV:-cuda}; LIMIT=${LIMIT:-}
if [ -d .whl ] && [ "$DEV" = cuda ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
PY=${PY:-python3}
$PY -c "import torch; from train.torchvision_compat import ensure_torchvision_importable as e; e(); import segmentation_models_pytorch as smp; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '', 'smp', smp.__version__)" || exit 1
t0=$(date +%s)
for s in "120 160" "360 480"; do
  set -- $s
  $PY -m data_prep.camvid --root "${CAMVID:-.camvid-jpg}" --task all --size $1 $2 --out $W/data/gpu-camvid-$1x$2 ${LIMIT:+--limit $LIMIT} > $OUT/prep.log 2>&1 || { tail -20 $OUT/prep.log; exit 1; }
done
echo "caches built in $(( $(date +%s) - t0 )) s"
mkdir -p $W/runs/gpu
recipe="data.scale_range=[0.5,2.0] optim.schedule=poly train.epochs=$EPOCHS train.device=$DEV data.num_workers=2"
unet="model.name=unet train.class_weights=median_frequency"
launch() {  # name size seed extra...
  local name=$1 size=$2 seed=$3; shift 3
  timeout $T $PY -m train --config configs/camvid.yaml --out $W/runs/gpu/$name $recipe data.path=$W/data/gpu-camvid-$size train.seed=$seed "$@" > $W/runs/gpu/$name.log 2>&1 &
}
for sd in ${SEEDS_LO:-0}; do
  launch all-120x160-baseline-seed$sd 120x160 $sd
  launch all-120x160-unet_mfce-seed$sd 120x160 $sd $unet
done
for sd in $SEEDS_HI; do
  launch all-360x480-baseline-seed$sd 360x480 $sd
  launch all-360x480-unet_mfce-seed$sd 360x480 $sd $unet
done
if [ "$DEV" = cuda ]; then
  TESTS=${TESTS:-"tests/baselines/test_lp_layer.py tests/projections/test_exact.py tests/projections/test_soft.py tests/projections/test_tree.py tests/reparam/test_regularizer.py tests/train/test_compile.py tests/train/test_distributed.py tests/train/test_sync.py tests/reparam/test_sparse.py tests/reparam/test_compile.py tests/test_protocol.py tests/train/test_predict.py"}
  timeout 300 $PY -m pytest -q -s -m cuda -p no:cacheprovider $TESTS > $OUT/pytest_cuda.log 2>&1
  echo "pytest rc $? at $(( $(date +%s) - t0 )) s"; tail -15 $OUT/pytest_cuda.log
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
fi
wait
echo "runs done at $(( $(date +%s) - t0 )) s"
for f in $W/runs/gpu/*.log; do echo "== $f"; grep -E "epoch +[0-9]+|Error|error" $f | tail -2; done
tar czf $OUT/runs.tar.gz --exclude='checkpoints' --exclude='tb' -C $W runs/gpu
