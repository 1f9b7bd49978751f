#!/usr/bin/env bash
# Issue 8 and 9 shapes in both precisions with the present default (the fast precision's
# chunk_intra variants on), FLA and (after callBR1.sh on the same machine) FlashQLA in the same
# call; callBU.sh without its T=524288 part.
# run(command="bash .dev/all/callBX.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/z3"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bx; R=$OUT/$TAG; mkdir -p $R
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
# per_token 524288 (measured after call BV)
pack
