#!/usr/bin/env bash
# Whichever card comes: on an H200, callCI.sh (issue 8's bar, the landed build); on an H100,
# callCH.sh (the chunk_intra A/B and checks). The other follows on the same warm machine.
# run(command="bash .dev/all/callCJ.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash ./callCI.sh
else
  bash ./callCH.sh
fi
