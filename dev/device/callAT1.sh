#!/usr/bin/env bash
# FlashQLA's first 51 MB of wheels into /tmp/site (as callAL1.sh); callAT2.sh follows warm.
# run(command="bash dev/device/callAT1.sh", carry=[".gpu/qla"])
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/qla/*.whl 2>&1 | tail -2; echo "pip rc=$?"
ls /tmp/site | wc -l
