#!/usr/bin/env bash
# One device call: the Python package on the GPU (python/tests, the CUDA ones included), then
# FLA's own tests/ops/test_gdn.py with FLA's two entry points routed to deltanet
# (python/fla_harness/: forward from deltanet, backward from FLA). run(command="bash
# .dev/all/callP.sh", carry=[".dev/all", ".gpu"]): .gpu/fla (FLA's wheel), .gpu/whl (ours:
# `pip wheel ./python --no-deps -w .gpu/whl`), .gpu/vectors (shared/vectors), .gpu/fla_tests
# (python/fla_harness/prepare.sh). About 7 min at most: 120 s + 330 s of limits.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $OUT/$name.txt 2>&1; echo "rc=$?" >> $OUT/$name.txt; tail -6 $OUT/$name.txt; }
ls .gpu/whl/deltanet-*.whl .gpu/fla/*.whl .gpu/fla_tests/tests/ops/test_gdn.py > /dev/null || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/fla/*.whl .gpu/whl/deltanet-*.whl > $OUT/install.txt 2>&1 || { cat $OUT/install.txt; exit 1; }
export PYTHONPATH=/tmp/site
python3 -c "import torch, triton, fla, deltanet, einops; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, 'deltanet', deltanet.__version__, torch.cuda.get_device_name(0))"
# Per-test limits where pytest-timeout is installed (the image lists it).
tmo=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout 120")
run pytests 120 env DELTANET_VECTORS=$PWD/.gpu/vectors python3 -m pytest -q -rs -p no:cacheprovider $tmo python/tests
# FLA's tests: remaining tests skipped (visibly) past 270 s, so the summary is whole before 330 s.
run fla_gdn 250 env DELTANET_FLA_SUMMARY=$OUT/fla_gdn_summary.md DELTANET_FLA_DEADLINE_S=200 bash python/fla_harness/run.sh -q --tb=short $tmo
cat $OUT/fla_gdn_summary.md 2>/dev/null | sed -n '1,40p'
# compute-sanitizer over the fused kernels (chunk_recurrent_regs included: bf16 cases take it).
cd .dev/all
export PATH=/usr/local/cuda/bin:$PATH
run fracecheck 60 compute-sanitizer --tool racecheck --error-exitcode 9 env DELTANET_FUSED_CASES=3 ./fused_test fused_fast --nocapture
run fmemcheck 45 compute-sanitizer --tool memcheck --error-exitcode 9 env DELTANET_FUSED_CASES=3 ./fused_test fused_fast --nocapture
grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $OUT/f*check.txt
