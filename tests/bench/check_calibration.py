#!/usr/bin/env python3
"""check_calibration.py PROFILE.json RANKS: a machine profile written by `so_bench calibrate` has
every table the performance model reads, each throughput positive and finite, GEMM rows in
increasing size, attention for every head dim, and (with RANKS > 1) the four collectives."""
import json
import math
import sys

prof = json.load(open(sys.argv[1]))
ranks = int(sys.argv[2])


def positive(x, what):
    assert isinstance(x, (int, float)) and math.isfinite(x) and x > 0, f"{what}: {x!r}"


for key in ("name", "backend", "dtype", "cores", "compute", "link", "cpu_adam", "peak_tflops"):
    assert key in prof, f"missing '{key}'"
assert prof["compute"], "no compute table"
for c in prof["compute"]:
    flops = [r["flops"] for r in c["gemm"]]
    assert len(flops) >= 3 and flops == sorted(flops), flops
    for r in c["gemm"]:
        positive(r["tflops"], f"gemm {r}")
    assert {r["D"] for r in c["attention"]} == {32, 64, 128}, c["attention"]
    for r in c["attention"]:
        positive(r["fwd_tflops"], f"attention {r}")
        positive(r["bwd_tflops"], f"attention {r}")
    for op in ("rmsnorm_forward", "rmsnorm_backward", "swiglu_forward", "swiglu_backward", "rope", "copy",
               "cross_entropy", "device_adam_params_per_s"):
        positive(c["memory_gbps"][op], op)
positive(prof["link"]["h2d_gbps"], "h2d")
positive(prof["link"]["d2h_gbps"], "d2h")
for r in prof["cpu_adam"]:
    positive(r["params_per_s"], f"cpu adam {r}")
if ranks > 1:
    for op in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all"):
        positive(prof["collectives"][str(ranks)][op]["busbw_gbps"], op)
        positive(prof["collectives"][str(ranks)][op]["latency_s"], op)
print(f"profile '{prof['name']}' ok: {len(prof['compute'])} thread counts, "
      f"{len(prof['compute'][0]['gemm'])} GEMM sizes, {len(prof['cpu_adam'])} CPU Adam thread counts"
      + (f", collectives over {ranks} ranks" if ranks > 1 else ""))
