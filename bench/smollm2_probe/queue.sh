#!/bin/bash
# The runs behind FINDINGS.md, as two single-threaded queues side by side (run from this folder).
# OMP_NUM_THREADS=1: on the shared 2-core box, 2 OpenMP threads were 5-18x slower (spin-waits).
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
PY="nice -n 10 /work/main/.venv/bin/python"
mkdir -p logs results
(
$PY rft.py --task demo --recipe hindsight --prompts 64 --steps 16 --lr 3e-4 --eval-every 4 > logs/demo_hindsight.log 2>&1
$PY rft.py --task demo --recipe coldstart --prompts 32 --samples 2 --steps 16 --lr 3e-4 --eval-every 8 > logs/demo_coldstart.log 2>&1
$PY rft.py --task demo --recipe rft --prompts 32 --samples 4 --steps 16 --lr 3e-4 > logs/demo_rft.log 2>&1
$PY rft.py --task reviews --recipe hindsight --prompts 64 --steps 16 --lr 3e-4 --eval-every 8 > logs/reviews_hindsight.log 2>&1
) &
(
$PY baseline.py --tasks rules,shop --n 32 --modes base,system,fewshot > logs/baseline_rules_shop.log 2>&1
$PY baseline.py --tasks reviews --n 48 --modes fewshot > logs/baseline_reviews2.log 2>&1
$PY rft.py --task shop --recipe hindsight --prompts 64 --steps 12 --lr 3e-4 --n 32 --eval-every 6 > logs/shop_hindsight.log 2>&1
$PY rft.py --task rules --recipe hindsight --prompts 64 --steps 16 --lr 3e-4 --n 32 --eval-every 8 > logs/rules_hindsight.log 2>&1
) &
wait
