#!/usr/bin/env python3
"""Builds negative-documented-differences.json: cases taken from the reference files and broken
on purpose, one per difference eval-vectors accepts, so the replay must fail every one of them.

    python3 tests/vectors/make_negative.py   # from the repository root; standard library only
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def case(path, name):
    doc = json.load(open(os.path.join(HERE, path)))
    return doc, next(c for c in doc["cases"] if c["name"] == name)


def main():
    # older layout (MAE's () sum in 1.4.3) that migrates, but with a wrong value
    doc, mae = case("metrics-tm1.4.3.json", "MeanAbsoluteError")
    mae["name"] = "migrated_layout_wrong_value"
    mae["state_dict"]["sum_abs_error"]["data"][0] += 1.0
    # the pre-1.7 top-k rule leaves fp/tn out, but tp is still compared
    _, topk = case("metrics-tm1.4.3.json", "MulticlassAccuracy_top2_macro")
    topk["name"] = "older_topk_rule_wrong_tp"
    topk["state_dict"]["tp"]["data"][0] += 1
    # float64 kept as float32: the values are still compared
    _, f64 = case("metrics-tm1.9.0.json", "R2Score_f64")
    f64["name"] = "float64_wrong_value"
    f64["compute_after_each_batch"][-1]["data"][0] += 0.01
    out = {"generator": doc["generator"], "torchmetrics": "1.4.3", "format": doc["format"],
           "cases": [mae, topk, f64]}
    with open(os.path.join(HERE, "negative-documented-differences.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
