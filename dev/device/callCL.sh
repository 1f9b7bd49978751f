#!/usr/bin/env bash
# The landed build beside FLA in one call, at B=8 T=8192 (bf16, H=16, HV=32, K=V=128): the exact
# and fast forwards, FLA's anchor, the forwards again (for the closing note of a stop whose GPU
# change was measured against the build before it, not beside the anchors).
# run(command="bash .dev/all/callCL.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=cl; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
ours() {
  for p in exact fast; do
    ./deltanet bench --device cuda --work prefill --dtype bf16 --precision $p --shape 8,8192,16,32,128,128 --warmup 2 --repeats 20 2>&1 | grep -E "^prefill" | sed "s/^/$p /"
  done
}
ours | tee $R/ours1.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > $R/pip.txt 2>&1
PYTHONPATH=/tmp/site timeout 100 python3 $TOP/.gpu/anchors.py --impl fla --shapes "8,8192,16,32,128,128" --json $R/fla.json 2>&1 | tail -4 | tee $R/fla.txt
ours | tee $R/ours2.txt
pack
