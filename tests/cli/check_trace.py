#!/usr/bin/env python3
"""Checks a so_train --trace file: valid Chrome trace JSON with the four lanes populated per bucket,
and reports how much CPU-optimizer work overlapped backward compute (printed, not asserted:
overlap depends on scheduling, the structure does not).

usage: check_trace.py TRACE.json [--expect-speculation] [--expect-checkpoint-offload]"""
import json
import sys


def main():
    path = sys.argv[1]
    expect_spec = "--expect-speculation" in sys.argv
    expect_ckpt = "--expect-checkpoint-offload" in sys.argv
    with open(path) as f:
        trace = json.load(f)
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    lanes = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    for lane in ("compute", "D2H copy", "H2D copy", "CPU optimizer"):
        assert lane in lanes, f"lane '{lane}' missing"
    by_lane = {name: [s for s in spans if s["tid"] == tid] for name, tid in lanes.items()}
    assert any(s["name"].startswith("backward ") for s in by_lane["compute"]), "no backward spans on compute"
    assert any(s["name"].startswith("grads b") for s in by_lane["D2H copy"]), "no gradient copies"
    assert any(s["name"].startswith("weights b") for s in by_lane["H2D copy"]), "no weight copies"
    opt = by_lane["CPU optimizer"]
    assert any(s["name"].startswith("norm b") for s in opt), "no per-bucket norms on the optimizer lane"
    spec = [s for s in opt if "speculative" in s["name"]]
    if expect_spec:
        assert spec, "SuperOffload trace without speculative steps"
    if expect_ckpt:  # offloaded activation checkpoints: out on the D2H lane, back on the H2D lane
        assert any(s["name"].startswith("checkpoint to host") for s in by_lane["D2H copy"]), "no checkpoint stashes"
        assert any(s["name"].startswith("checkpoint from host") for s in by_lane["H2D copy"]), "no checkpoint fetches"
    for s in spans:
        assert s["dur"] >= 0 and s["ts"] >= 0, f"bad span {s}"
    backward = [(s["ts"], s["ts"] + s["dur"]) for s in by_lane["compute"] if s["name"].startswith("backward ")]
    adam = [(s["ts"], s["ts"] + s["dur"]) for s in opt if s["name"].startswith("adam")]
    overlap = sum(max(0.0, min(a1, b1) - max(a0, b0)) for a0, a1 in adam for b0, b1 in backward)
    total = sum(a1 - a0 for a0, a1 in adam)
    print(f"trace ok: {len(spans)} spans; {len(spec)} speculative bucket steps; "
          f"CPU Adam {total / 1e3:.1f} ms, of which {overlap / 1e3:.1f} ms "
          f"({100 * overlap / max(total, 1e-9):.0f}%) overlapped backward compute")


if __name__ == "__main__":
    main()
