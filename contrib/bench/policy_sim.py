#!/usr/bin/python3
"""Simulates the SSD cache's admission and eviction (2Q with a ghost list, as
src/cache/policy.h describes it, 4 KiB validity in 64 KiB blocks) under the
cache benchmark's workload: 8 KiB random reads, fio's zoned:80/10:15/20:5/70
over 512 MiB, a cache of 30% of that. Prints the read hit ratio after a
warm-up, for admit=first, admit=second, and whole-block fills on a miss.
Used to tell the policy's limit from noise in contrib/bench/CACHE.md.
  contrib/bench/policy_sim.py"""
import random
from collections import OrderedDict

DATA, BLOCK, IO = 512 << 20, 64 << 10, 8192
PER_BLOCK = BLOCK // IO
SLOTS = int(DATA * 0.3) // BLOCK


def zoned(rnd):
    x = rnd.random()
    lo, hi = (0, 0.1) if x < 0.8 else (0.1, 0.3) if x < 0.95 else (0.3, 1.0)
    return int((lo + (hi - lo) * rnd.random()) * DATA) // IO


def hit_ratio(admit_second, whole_block=False, warm=200000, measured=100000, seed=1):
    rnd = random.Random(seed)
    probation, main, ghost, valid = OrderedDict(), OrderedDict(), OrderedDict(), {}
    ghost_max = SLOTS // 2
    hits = misses = 0

    def remember(b):
        ghost[b] = True
        if len(ghost) > ghost_max:
            ghost.popitem(last=False)

    for i in range(warm + measured):
        piece = zoned(rnd)
        b, k = piece // PER_BLOCK, piece % PER_BLOCK
        cached = b in probation or b in main
        if cached and k in valid[b]:
            hits += i >= warm
            if b in probation:
                del probation[b]
                main[b] = True  # a second use: promoted
            else:
                main.move_to_end(b)
            continue
        misses += i >= warm
        if cached:
            valid[b].update(range(PER_BLOCK) if whole_block else [k])
            continue
        hot = b in ghost
        if hot:
            del ghost[b]
        elif admit_second:
            remember(b)
            continue
        if len(probation) + len(main) >= SLOTS:
            if len(probation) > SLOTS // 4 or not main:
                victim, _ = probation.popitem(last=False)
                remember(victim)
            else:
                victim, _ = main.popitem(last=False)
            del valid[victim]
        (main if hot else probation)[b] = True
        valid[b] = set(range(PER_BLOCK)) if whole_block else {k}
    return hits / (hits + misses)


if __name__ == "__main__":
    print(f"admit=first             {hit_ratio(False):.3f}")
    print(f"admit=second            {hit_ratio(True):.3f}")
    print(f"whole-block fill, first {hit_ratio(False, whole_block=True):.3f}")
