#!/usr/bin/env bash
# FlashQLA with fast, slow and mixed gates (dev/device/qla_gates.py), after callAT1.sh.
# run(command="bash dev/device/callAT2.sh", carry=[".gpu/z3", ".gpu/fla"])
cd "$(dirname "$0")/../.."
TAG=at; R=$OUT/$TAG; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/z3/*.whl .gpu/fla/*.whl > $R/pip.txt 2>&1; echo "pip rc=$?"
export PYTHONPATH=/tmp/site
timeout 400 python3 dev/device/qla_gates.py 2>&1 | tee $R/qla_gates.txt | grep -v "^-\|^ *$" | head -60
tar czf $OUT/$TAG.tgz -C $OUT $TAG
