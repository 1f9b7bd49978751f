"""Sums Nsight Compute's per-instruction warp stall samples (the source page as CSV with SASS,
as the device call scripts write it: `ncu -i X.ncu-rep --page source --csv --print-source sass`)
between the kernel's barriers, so that a kernel's time can be read phase by phase.
    python3 dev/ncu_phases.py FILE.csv[.gz] [TOP]
Prints each stretch of SASS between two BAR instructions (its first and last address, its
instruction count, its share of all samples, its top stall reasons) and the TOP instructions
with the most samples."""
import csv
import gzip
import sys


def rows(path):
    f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    lines = [l for l in f if l.startswith('"')]
    r = csv.reader(lines)
    next(r)  # "Kernel Name", ...
    head = next(r)
    return head, [x for x in r if len(x) == len(head)]


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    head, data = rows(path)
    col = {h: i for i, h in enumerate(head)}
    samp = col["Warp Stall Sampling (All Samples)"]
    stall_cols = [h for h in head if h.startswith("stall_") or h.startswith("Warp Stall Sampling (All Samples):")]
    # Stall reasons appear as columns after the generic ones in some versions; fall back to none.
    total = sum(float(x[samp] or 0) for x in data) or 1.0
    seg, segs = [], []
    for x in data:
        seg.append(x)
        if "BAR" in x[col["Source"]] and ("SYNC" in x[col["Source"]] or "ARV" in x[col["Source"]] or "RED" in x[col["Source"]]):
            segs.append(seg)
            seg = []
    if seg:
        segs.append(seg)
    print(f"{len(data)} instructions, {int(total)} samples, {len(segs)} stretches between barriers")
    for i, s in enumerate(segs):
        n = sum(float(x[samp] or 0) for x in s)
        mix = {}
        for x in s:
            op = x[col["Source"]].split()[0] if x[col["Source"]].split() else "?"
            if op.startswith("@"):
                op = x[col["Source"]].split()[1]
            op = op.split(".")[0]
            mix[op] = mix.get(op, 0) + float(x[samp] or 0)
        tops = ", ".join(f"{k} {100 * v / total:.1f}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1])[:4])
        print(f"{i:3d} {s[0][0]}..{s[-1][0][-5:]} {len(s):5d} instr {100 * n / total:5.1f} %  [{tops}]  ends: {s[-1][col['Source']].strip()[:40]}")
    print(f"top {top} instructions:")
    for x in sorted(data, key=lambda x: -float(x[samp] or 0))[:top]:
        print(f"  {x[0][-5:]} {100 * float(x[samp] or 0) / total:5.2f} %  {x[col['Source']].strip()[:70]}")


main()
