"""Write ``regression.json``: the planner's full JSON output on a fixed set of cases.

It was generated from commit d4c0f75 (the level-by-level planner before issue 12)
with ``PYTHONPATH=. python tests/planner/data/make_regression.py``; the test
``tests/planner/test_regression.py`` checks that today's planner, in its greedy
mode, reproduces those results: same types, joins and ratios at every level,
and the same seconds, bytes and memory to the last bit (or within 1e-12 where
the summation order changed). Do not regenerate it to make a test pass.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CASES = [
    # model, batch, devices, objective, types, bytes per element
    ("alexnet", 256, "a100:16", "volume", 2, 4.0),
    ("alexnet", 256, "a100:16", "volume", 3, 4.0),
    ("vgg-a", 256, "a100:16", "volume", 3, 4.0),
    ("vgg-e", 128, "tpu-v3:4,tpu-v2:4", "time", 3, 2.0),
    ("resnet-50", 256, "tpu-v3:4,tpu-v2:4", "time", 3, 2.0),
    ("resnet-50", 64, "tpu-v3:64,tpu-v2:64", "time", 3, 2.0),
    ("resnet-152", 512, "tpu-v3:512,tpu-v2:512", "time", 3, 2.0),
    ("transformer", 8, "a100:3,v100:5", "time", 3, 2.0),
    ("mlp", 32, "h100:2,a100:3,tpu-v2:2", "time", 2, 2.0),
    ("lenet", 64, "v100:6", "volume", 3, 4.0),
    ("resnet-18", 32, "a100:5,tpu-v3:3", "time", 3, 2.0),
    ("vgg-c", 64, "tpu-v2:8,h100:8", "time", 3, 2.0),
]


def main() -> None:
    from hetrain.planner import plan_model

    out = []
    for model, batch, devices, objective, types, nbytes in CASES:
        result = plan_model(model, batch, devices, objective, types, nbytes)
        data = result.json()
        out.append({"case": [model, batch, devices, objective, types, nbytes], "plans": data["plans"],
                    "layers": data["layers"], "params": data["params"]})
        print(model, devices, data["plans"]["plan"]["step_s"], file=sys.stderr)
    path = Path(__file__).with_name("regression.json")
    path.write_text(json.dumps(out, indent=None, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
