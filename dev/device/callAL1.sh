#!/usr/bin/env bash
# FlashQLA's wheels (81 MB with z3, over what one call carries): this call installs the first
# 51 MB into /tmp/site; callAL2.sh follows on the same warm machine.
# run(command="bash dev/device/callAL1.sh", carry=[".gpu/qla"])   (with .dev/all the tree
# passes the 64 MiB a call carries)
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/qla/*.whl 2>&1 | tail -2; echo "pip rc=$?"
ls /tmp/site | wc -l
