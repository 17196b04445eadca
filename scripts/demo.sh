#!/usr/bin/env bash
# The main job on the embedded default: make the synthetic parcel snapshot (once), then run the
# governed 82-trial search on submitit's local executor and print its summary.
#   scripts/demo.sh [extra Hydra overrides...]      e.g. scripts/demo.sh search.n_trials=16
set -euo pipefail
source "$(dirname "$0")/_env.sh"
cd "$ROOT"
export PARCEL_DATA_DIR=${PARCEL_DATA_DIR:-$ROOT/data}
[ -f "$PARCEL_DATA_DIR/parcels.h5" ] || parcel-hpc make-snapshot "$PARCEL_DATA_DIR"
python -m parcel_hpc.launch -m "$@"
