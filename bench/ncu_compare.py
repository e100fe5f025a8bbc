"""Two ncu CSV reports (``--csv --page details``), one kernel each, side by side: the metrics both have, in
ncu's section order. ``python bench/ncu_compare.py a.csv b.csv``"""
import argparse
import csv


def metrics(path):
    rows = [r for r in csv.DictReader(line for line in open(path) if line.startswith('"'))]
    out = {}
    for r in rows:
        if r.get("Metric Name"):
            out.setdefault((r["Section Name"], r["Metric Name"]), (r["Metric Unit"], r["Metric Value"]))
    name = rows[0]["Kernel Name"][:60] if rows else "?"
    return name, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("first", help="ncu --csv --page details report of one kernel")
    ap.add_argument("second", help="the other kernel's report")
    args = ap.parse_args()
    (na, a), (nb, b) = metrics(args.first), metrics(args.second)
    print(f"{'section':28} {'metric':44} {'unit':8} {na[:24]:>24} | {nb[:24]}")
    for key, (unit, value) in a.items():
        if key in b:
            print(f"{key[0][:28]:28} {key[1][:44]:44} {unit[:8]:8} {value[:24]:>24} | {b[key][1][:24]}")


if __name__ == "__main__":
    main()
