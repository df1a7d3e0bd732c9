python -m bench.equivalences --episodes 8 --seed0 200 --clips 4 --root runs/equivalences_pool  # at f34f271
