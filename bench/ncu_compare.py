"""Two ncu CSV reports (``--csv --page details``), one kernel each, side by side: the metrics both have, in
ncu's section order. ``python bench/ncu_compare.py a.csv b.csv``"""
import csv
import sys


def metrics(path):
    rows = [r for r in csv.DictReader(line for line in open(path) if line.startswith('"'))]
    out = {}
    for r in rows:
        if r.get("Metric Name"):
            out.setdefault((r["Section Name"], r["Metric Name"]), (r["Metric Unit"], r["Metric Value"]))
    name = rows[0]["Kernel Name"][:60] if rows else "?"
    return name, out


(na, a), (nb, b) = metrics(sys.argv[1]), metrics(sys.argv[2])
print(f"{'section':28} {'metric':44} {'unit':8} {na[:24]:>24} | {nb[:24]}")
for key, (unit, value) in a.items():
    if key in b:
        print(f"{key[0][:28]:28} {key[1][:44]:44} {unit[:8]:8} {value[:24]:>24} | {b[key][1][:24]}")
