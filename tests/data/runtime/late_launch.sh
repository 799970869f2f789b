#!/bin/bash
# Rank $LATE_RANK's interpreter starts $LATE_S seconds after the others' (its node's prolog or container
# image pull ran long), then runs train.py as the others do: eroica-run --no-python late_launch.sh
if [ "$RANK" = "${LATE_RANK:--1}" ]; then sleep "${LATE_S:-0}"; fi
exec "${PYTHON:-python3}" "$(dirname "$0")/train.py" "$@"
