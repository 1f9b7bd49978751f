#!/usr/bin/env bash
# FlashQLA's and FLA's wheels into /tmp/site (FlashQLA's z3 comes with callBR.sh, which follows
# on the same warm machine: together they pass the 64 MiB a call carries).
# run(command="bash dev/device/callBR1.sh", carry=[".gpu/qla", ".gpu/fla"])
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/qla/*.whl .gpu/fla/*.whl 2>&1 | tail -2; echo "pip rc=$?"
ls /tmp/site | wc -l; nvidia-smi --query-gpu=name --format=csv,noheader
