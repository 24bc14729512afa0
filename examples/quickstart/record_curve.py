"""Record a quickstart run's held-out accuracy curve, the file the READMEs' quotes are checked
against (tests/test_quickstart_quotes.py):

    bash examples/quickstart/run.sh                      # seed 0
    python examples/quickstart/record_curve.py runs/quickstart-grpo-seed0

writes ``examples/quickstart/seed0_curve.json``: ``val/<source>/acc`` at every validation step,
in percent. Rerun both after a change of defaults, then update the quotes the test names.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CURVE_FILE = HERE / "seed0_curve.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run directory (holds metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=CURVE_FILE, help="where to write the curve")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from seeds import val_accuracy

    curve = val_accuracy(args.run_dir / "metrics.jsonl")
    if not curve:
        print(f"error: no val/<source>/acc in {args.run_dir / 'metrics.jsonl'}", file=sys.stderr)
        return 1
    record = {
        "what": "held-out accuracy (%) of `bash examples/quickstart/run.sh` (seed 0) per step",
        "curve": {str(step): round(100 * acc, 1) for step, acc in sorted(curve.items())},
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(curve)} validations")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
