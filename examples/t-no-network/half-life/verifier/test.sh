#!/bin/bash
# Verifier for the half-life task. Runs as root after the agent stops, and
# writes 1 to /logs/verifier/reward.txt when /app/answer.txt holds the
# half-life (12 hours, within 0.1), 0 otherwise.
set -u
mkdir -p /logs/verifier
reward=0
if [ -f /app/answer.txt ]; then
  answer=$(head -c 64 /app/answer.txt | tr -d ' \t\r\n')
  if [[ $answer =~ ^[0-9]+(\.[0-9]+)?$ ]] &&
    awk -v a="$answer" 'BEGIN { exit !(a >= 11.9 && a <= 12.1) }'; then
    reward=1
  fi
fi
echo "$reward" > /logs/verifier/reward.txt
