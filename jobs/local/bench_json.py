#!/usr/bin/env python3
"""The JSON lines so_bench and the peers print among their other output: parsed as JSON, never
matched as text (so_bench prints compact JSON, Python's json.dumps puts spaces after the colons).

    jobs/local/bench_json.py nominal-peak LOG     the nominal bf16 TFLOP/s of so_bench gpu-peaks'
                                                  line in LOG (0 when there is none)
"""
import json
import sys


def json_lines(text):
    """Every line of text that is a JSON object, parsed, in order."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def first(objects, **match):
    """The first object whose fields equal match's, or None."""
    return next((o for o in objects if all(o.get(k) == v for k, v in match.items())), None)


def main(argv):
    if len(argv) == 3 and argv[1] == "nominal-peak":
        try:
            with open(argv[2], errors="replace") as f:
                peaks = first(json_lines(f.read()), bench="gpu-peaks")
        except OSError:
            peaks = None
        print(peaks["nominal_tflops"] if peaks and peaks.get("nominal_tflops") else 0)
        return 0
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
