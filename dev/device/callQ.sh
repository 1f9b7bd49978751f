#!/usr/bin/env bash
# One device call: FLA's own tests/ops/test_gdn.py with FLA's two entry points routed to
# deltanet (python/fla_harness/), every case, in parallel processes (pytest-xdist: FLA's Triton
# compilation, most of the time, runs on the 16 cores at once); then transformers' Qwen3-Next
# layer check if its script is staged. run(command="bash .dev/all/callQ.sh", carry=[".dev/all",
# ".gpu"]); .gpu as callP.sh says. About 9 min at most.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $OUT/$name.txt 2>&1; echo "rc=$?" >> $OUT/$name.txt; tail -4 $OUT/$name.txt; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/fla/*.whl .gpu/whl/deltanet-*.whl > $OUT/install.txt 2>&1 || { cat $OUT/install.txt; exit 1; }
export PYTHONPATH=/tmp/site
python3 -c "import torch, triton, fla, deltanet, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, 'deltanet', deltanet.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
nproc
# Remaining tests skipped (visibly) past the deadline, so the summary is whole before the limit.
run fla_gdn ${FLA_LIMIT:-420} env DELTANET_FLA_SUMMARY=$OUT/fla_gdn_summary.md DELTANET_FLA_DEADLINE_S=${FLA_DEADLINE:-340} \
  bash python/fla_harness/run.sh -q --tb=short -n ${FLA_WORKERS:-14} --timeout 300 -p no:randomly
sed -n '1,45p' $OUT/fla_gdn_summary.md 2>/dev/null
if [ -f .dev/all/qwen3next_check.py ]; then
  run qwen3next 120 python3 .dev/all/qwen3next_check.py --json $OUT/qwen3next.json
fi
