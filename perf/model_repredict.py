#!/usr/bin/env python3
"""A validation run's points (perf/model_validate.sh's JSON files) predicted again by another
build's cost model: `hicoll_model predict` of that build, with the run's calibration files, for
every point of the fixed paths, beside the prediction the run's own engine made. A change to the
model judged on the same measurements, so the emulator's run-to-run noise does not count.

    perf/model_repredict.py DIR OTHER_HICOLL_MODEL [--this build/perf/hicoll_model] [-v]

Needs the calibration files in DIR (a calibrated run, not -u). The run's prediction is matched
to this build's `hicoll_model` output to pick the variant the engine predicted (an AllReduce's
reduce-scatter + gather or its small gather), then OTHER's value for that variant is counted."""
import argparse
import importlib.util
import os
import re
import subprocess

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("model_report", os.path.join(here, "model_report.py"))
model_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model_report)


def predictions(tool, d, p):
    cmd = [tool, "predict", "--model", os.path.join(d, f"calibrate_{p['rate']}.json"), "--coll", p["coll"],
           "--bytes", str(p["size"]), "-N", str(p["N"]), "-L", str(p["L"]), "--cores", str(os.cpu_count())]
    if p["place"] == "ip":
        cmd.append("--in-place")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [float(x) for x in re.findall(rf"^{p['algo']}\s+(?:rs\+ag|gather)?\s*([0-9.]+) us =", out, re.M)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("other")
    ap.add_argument("--this", default=os.path.join(here, "..", "build", "perf", "hicoll_model"))
    ap.add_argument("-v", action="store_true", help="every point whose verdict differs")
    a = ap.parse_args()
    points = model_report.load([a.dir])[0]
    ok = lambda pred, meas: abs(pred / meas - 1) <= 0.2
    run = other = unmatched = 0
    for p in points:
        mine, theirs = predictions(a.this, a.dir, p), predictions(a.other, a.dir, p)
        i = min(range(len(mine)), key=lambda k: abs(mine[k] - p["pred"]), default=None)
        if i is None or abs(mine[i] / p["pred"] - 1) > 0.02:
            unmatched += 1  # another calibration or build made the run's prediction
            continue
        run += ok(p["pred"], p["meas"])
        other += ok(theirs[i], p["meas"])
        if a.v and ok(p["pred"], p["meas"]) != ok(theirs[i], p["meas"]):
            print(f"{p['coll']} {p['N']}x{p['L']} {p['rate']} {p['size']} {p['algo']} {p['place']}: measured "
                  f"{p['meas']:.0f} us, run's {p['pred']:.0f} ({p['pred'] / p['meas']:.2f}), other's "
                  f"{theirs[i]:.0f} ({theirs[i] / p['meas']:.2f})")
    n = len(points) - unmatched
    print(f"{n} points (of {len(points)}; {unmatched} not matched to this build's model): within 20 % "
          f"the run's predictions {run} ({100 * run / max(n, 1):.1f} %), the other build's {other} "
          f"({100 * other / max(n, 1):.1f} %)")


if __name__ == "__main__":
    main()
