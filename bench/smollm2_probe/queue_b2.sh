#!/bin/bash
# Second half of queue B (shop), shrunk after the shop baseline turned out slow (~270-410-token prompts).
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
PY="nice -n 10 /work/main/.venv/bin/python"
$PY baseline.py --tasks shop --n 24 --modes base,fewshot --temps 0.0 > logs/baseline_shop.log 2>&1
$PY rft.py --task shop --recipe hindsight --prompts 64 --steps 12 --lr 3e-4 --n 24 > logs/shop_hindsight.log 2>&1
