#!/usr/bin/env bash
# Issue 8's and 9's speed bars on an H200 with the landed build (WG_TRI by default): the five
# issue shapes in both precisions, FLA and FlashQLA on the same shapes in the same call
# (callBR1.sh first on the same machine installs FlashQLA's wheels; z3 comes here), then time per
# token at T=524288 (which does not fit an H100's memory in the bench).
# run(command="bash .dev/all/callBU.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/z3"], needs_h200=true)
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=${TAG:-bu}; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
issue_shapes 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > $R/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/z3/*.whl >> $R/pip.txt 2>&1
export PYTHONPATH=/tmp/site
timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack
if python3 -c "import flash_qla" 2>/dev/null; then
  timeout 200 python3 $TOP/.gpu/anchors.py --impl flashqla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/qla_shapes.json 2>&1 | tail -6 | tee $R/qla.txt
  pack
fi
# PER_TOKEN=0 leaves it out (callBX.sh).
[ "${PER_TOKEN:-1}" = 0 ] || per_token 524288
pack
