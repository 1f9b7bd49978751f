#!/usr/bin/env bash
# FlashQLA beside, right after callV.sh (which installed its wheels into /tmp/site on the same
# warm machine): the issue shapes and the sweep's; FLA again (callV's FLA runs failed: with
# FlashQLA's wheels in /tmp/site but not z3, FLA's import of it fails).
# run(command="bash .dev/all/callW.sh", carry=[".dev/all", ".gpu/z3", ".gpu/anchors.py"])
cd "$(dirname "$0")/../.."
R=$OUT/w; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/z3/*.whl > $R/pip.txt 2>&1; echo "pip rc=$?"
export PYTHONPATH=/tmp/site
ls /tmp/site | head -30 > $R/site.txt
timeout 250 python3 .gpu/anchors.py --impl flashqla --shapes "1,32768,16,32,128,128;1,65536,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128" --varlen "64,65536,16,32,128,128" --json $R/qla_shapes.json 2>&1 | tail -8
tar czf $OUT/w.tgz -C $OUT w
timeout 100 python3 .gpu/anchors.py --impl fla --shapes "1,32768,16,32,128,128;1,65536,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6
timeout 100 python3 .gpu/anchors.py --impl fla --shapes "1,8192,16,32,128,128;1,131072,16,32,128,128;1,524288,16,32,128,128" --json $R/fla_sweep.json 2>&1 | tail -4
tar czf $OUT/w.tgz -C $OUT w
timeout 200 python3 .gpu/anchors.py --impl flashqla --shapes "1,8192,16,32,128,128;1,131072,16,32,128,128;1,524288,16,32,128,128" --json $R/qla_sweep.json 2>&1 | tail -5
tar czf $OUT/w.tgz -C $OUT w
