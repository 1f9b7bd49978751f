#!/usr/bin/env bash
# One device call: FLA's test_gdn.py routed to deltanet (every case; the chunk backward through
# the harness's PyTorch recurrence, as FLA's refuses Triton 3.6 on Hopper), transformers'
# Qwen3-Next layer routed to deltanet, then the package's own tests on the GPU (python/tests:
# the CUDA ones, decode_step's pool included). run(command="bash .dev/all/callR.sh",
# carry=[".dev/all", ".gpu"]). About 9 min at most.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $OUT/$name.txt 2>&1; echo "rc=$?" >> $OUT/$name.txt; tail -${TAIL:-4} $OUT/$name.txt; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/fla/*.whl .gpu/whl/deltanet-*.whl > $OUT/install.txt 2>&1 || { cat $OUT/install.txt; exit 1; }
export PYTHONPATH=/tmp/site
run fla_gdn 250 env DELTANET_FLA_SUMMARY=$OUT/fla_gdn_summary.md DELTANET_FLA_DEADLINE_S=190 \
  bash python/fla_harness/run.sh -q --tb=short -n 14 --timeout 200
sed -n '1,40p' $OUT/fla_gdn_summary.md 2>/dev/null
TAIL=30 run qwen3next 150 python3 dev/device/qwen3next_check.py --json $OUT/qwen3next.json
TAIL=6 run pytests 120 env DELTANET_VECTORS=$PWD/.gpu/vectors python3 -m pytest -q -rs -p no:cacheprovider --timeout 100 python/tests
