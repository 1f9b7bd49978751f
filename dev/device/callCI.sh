#!/usr/bin/env bash
# Issue 8's bar on an H200, of the landed build (`deltanet_base` when staged as callCH.sh's header
# says, else `deltanet`): callCC.sh's work (the five issue shapes in both precisions beside FLA,
# then time per token from T=16384 to 524288), so that another A/B can follow on the same warm
# machine.
# run(command="bash .dev/all/callCI.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
# The bar is an H200's: on another card, stop before spending its time.
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { nvidia-smi -L; echo "not an H200"; exit 3; }
B=deltanet; [ -x ./deltanet_base ] && B=deltanet_base
BIN=$B TAG=ci PER_TOKEN="16384 131072 262144 524288" bash ./callCC.sh
