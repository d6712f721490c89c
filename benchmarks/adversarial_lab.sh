#!/bin/bash
# The adversarial lab's full protocol in one run on one GPU (docs/adversarial.md): Fashion-MNIST
# without the input-normalisation confound (3 seeds), detection at eps 0.1 and 0.3 with the
# tuned reconstructive attack, and adversarial training, every row with the full-strength
# attack (the default loss: per image the worst of the ensemble). Rows land under
# results/adversarial/gpu-*; a rerun skips the rows already there.
#
#   bash benchmarks/adversarial_lab.sh            # DATA: $CAPSNET_DATA_DIR or the cache
#
# The two CNN controls: one that standardises each image (--input-norm image, the CapsNet's
# option) and one trained with the margin loss on squashed class vectors (--cnn-head capsules,
# the control of Gu, Tresp & Hu's CVPR 2021 paper), each at the tiny and the paper size.
set -euo pipefail
R=results/adversarial
SEEDS="0 1 2"
N=1000                                    # test images per row
STRONG="--steps 200 --restarts 5"         # PGD-200 x 5 restarts
train() { python -m capsnet train --no-progress "$@"; }
attack() { python -m capsnet attack --no-download "$@"; }

# 1. Fashion-MNIST: the same recipe and length for every model, 3 seeds
for s in $SEEDS; do
  for norm in none image; do
    train --model capsnet --dataset fashion-mnist --input-norm $norm --recipe fast --epochs 10 \
        --seed $s --out-dir runs/fashion/capsnet-$norm-s$s
  done
  for preset in tiny paper; do
    train --model cnn --preset $preset --dataset fashion-mnist --recipe fast --epochs 10 \
        --seed $s --out-dir runs/fashion/cnn-$preset-s$s
    train --model cnn --preset $preset --input-norm image --dataset fashion-mnist \
        --recipe fast --epochs 10 --seed $s --out-dir runs/fashion/cnn-$preset-image-s$s
    train --model cnn --preset $preset --cnn-head capsules --dataset fashion-mnist \
        --recipe fast --epochs 10 --seed $s --out-dir runs/fashion/cnn-$preset-capsules-s$s
  done
done
for s in $SEEDS; do
  for m in capsnet-none capsnet-image cnn-tiny cnn-paper cnn-tiny-image cnn-paper-image \
      cnn-tiny-capsules cnn-paper-capsules; do
    ckpt=runs/fashion/$m-s$s/best.pt
    out=$R/gpu-fashion-$m-s$s
    attack $ckpt --labels $m-s$s --dataset fashion-mnist --attack fgsm,pgd --eps 0.05,0.1,0.2 \
        $STRONG --n $N --out-dir $out
    attack $ckpt --labels $m-s$s --dataset fashion-mnist --attack apgd --eps 0.1 --steps 100 \
        --n $N --out-dir $out
    attack $ckpt --labels $m-s$s --dataset fashion-mnist --attack square --eps 0.1 \
        --queries 10000 --n $N --out-dir $out
    attack $ckpt --labels $m-s$s --dataset fashion-mnist --attack pgd --eps 0.1 $STRONG \
        --source runs/fashion/cnn-paper-s$s/best.pt --n $N --out-dir $out
  done
  for m in capsnet-none capsnet-image; do
    attack runs/fashion/$m-s$s/best.pt --labels $m-s$s --dataset fashion-mnist --attack vote \
        --eps 0.1 $STRONG --n $N --out-dir $R/gpu-fashion-$m-s$s
  done
done

# 2. detection at eps 0.1 and 0.3: plain and reconstructive (weight per image from the grid)
for s in 0; do
  for m in capsnet-none capsnet-image; do
    attack runs/fashion/$m-s$s/best.pt --labels $m-s$s --dataset fashion-mnist \
        --attack pgd,reconstructive,vote-detect --eps 0.1,0.3 --n $N --detector \
        --out-dir $R/gpu-fashion-detect
  done
done
attack --labels capsnet --attack pgd,reconstructive,vote-detect --eps 0.1,0.3 --n $N --detector \
    --out-dir $R/gpu-mnist-detect
for dec in plain class-conditional; do
  train --model cnn --cnn-decoder $dec --recipe fast --epochs 6 --out-dir runs/adv/paper-cnn-$dec
  attack runs/adv/paper-cnn-$dec/best.pt --labels paper-cnn-$dec --attack pgd,reconstructive \
      --eps 0.1,0.3 --n $N --detector --out-dir $R/gpu-mnist-detect
done

# 3. adversarial training: FGSM with a random start and PGD-10, MNIST eps 0.3, Fashion eps 0.1
for s in $SEEDS; do
  for kind in fgsm-rs pgd; do
    for data in "mnist 0.3" "fashion-mnist 0.1"; do
      set -- $data
      for model in "capsnet paper" "cnn tiny" "cnn paper"; do
        read -r name preset <<< "$model"
        run=runs/advtrain/$1-$name-$preset-$kind-s$s
        train --adversarial $kind --adversarial-eps $2 --model $name --preset $preset \
            --dataset $1 --recipe fast --epochs 10 --seed $s --out-dir $run
        attack $run/best.pt --labels $name-$preset-$kind-s$s --dataset $1 --attack pgd,apgd \
            --eps $2 --n $N --out-dir $R/gpu-advtrain-$1
      done
    done
  done
done
