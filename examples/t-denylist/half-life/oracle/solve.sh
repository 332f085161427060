#!/bin/bash
# Reference solution: A(t) = A0 * 2^(-t/T), so T = t * ln 2 / ln(A0/A).
set -eu
awk 'BEGIN { printf "%.2f\n", 36 * log(2) / log(8000 / 1000) }' > /app/answer.txt
