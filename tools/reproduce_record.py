"""Record the runs that give the offline models' bands in ``bl.reproduce`` (METHODS.md §14).

    python tools/reproduce_record.py --record smollm2                    # paper-a, paper-b, falck at quick sizes
    python tools/reproduce_record.py --record gemma --papers paper-a     # one paper
    python tools/reproduce_record.py --show                              # what is recorded

Each record is ``bl.reproduce(model, paper, sizes="quick", seed=0)`` on the named offline model: its
per-row value and 95% interval, with the sizes, the seed, the date and the TransformerLens / torch
versions, stored in ``bayes_lens/data/reproduce_records.json`` (package data, read by
:func:`bayes_lens.reproduction.load_records`). A later run of the same call on the same model is held
to recorded value ± max(recorded half-width, the row's tolerance). Quick sizes only: on 2 CPU cores
each paper takes minutes on SmolLM2-135M. A model or paper without a record gives NOT COMPARABLE rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bayes_lens" / "data" / "reproduce_records.json"
MODELS = {"smollm2": "default", "gemma": "gemma-3-270m"}


def load() -> dict:
    return json.loads(RECORDS.read_text(encoding="utf-8")) if RECORDS.is_file() else {}


def record(key: str, papers) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    import bayes_lens as bl
    from bayes_lens.reproduction import record_entry

    torch.set_grad_enabled(False)
    model = bl.load_model(MODELS[key])
    data = load()
    for paper in papers:
        t = time.time()
        res = bl.reproduce(model, paper, sizes="quick", seed=0, progress=False, records={})
        entry = record_entry(res)
        entry["seconds"] = round(time.time() - t, 1)
        data.setdefault(key, {})[paper] = entry
        RECORDS.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"recorded {paper} on {key} in {entry['seconds']} s (the table holds this run against no record: "
              "it is the record)", flush=True)
        print(res.table(), flush=True)
    return data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", choices=sorted(MODELS), help="run and store the quick runs on this offline model")
    ap.add_argument("--papers", default="paper-a,paper-b,falck", help="comma-separated (default: all three)")
    ap.add_argument("--show", action="store_true", help="print what is recorded")
    args = ap.parse_args(argv)
    if args.record:
        papers = [p.strip() for p in args.papers.split(",") if p.strip()]
        bad = [p for p in papers if p not in ("paper-a", "paper-b", "falck")]
        if bad:
            ap.error(f"unknown paper(s) {bad}: choose from paper-a, paper-b, falck")
        record(args.record, papers)
    if args.show or not args.record:
        for key, per in load().items():
            for paper, e in per.items():
                print(f"{key} {paper}: {e['sizes']} sizes, seed {e['seed']}, {e['recorded']}, {e.get('seconds')} s, "
                      f"{len(e['rows'])} rows, {e['versions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
