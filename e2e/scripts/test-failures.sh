#!/usr/bin/env bash
# Prints what the failed tests of a `cargo test` log said, for `make test` to end with when a test
# failed: each failed test's captured output in full, then one short summary — every failed test's
# name with the first lines of its error or panic message — so the cause is in the last lines of
# the log even when the output in between is long (CI keeps only its head and tail).
#
#   bash e2e/scripts/test-failures.sh target/test-output.log
#
# Reads libtest's format: a failed test's output is the block from `---- NAME stdout ----` to the
# next such line or to the `failures:` list that ends its binary's report. Prints nothing when no
# test failed; exits 2 when the log cannot be read.
set -euo pipefail

log=${1:?usage: test-failures.sh CARGO_TEST_LOG}
[[ -r $log ]] || { echo "test-failures.sh: cannot read $log" >&2; exit 2; }

awk '
  # The first lines of the error a failed test returned or the panic it raised, kept for the
  # summary.
  function keep(line) {
    if (cause_lines < 6) { cause[failed] = cause[failed] "    " line "\n"; cause_lines++ }
  }
  /^---- .* stdout ----$/ {
    failed++
    name[failed] = $2
    cause_lines = 0
    in_block = 1
    in_cause = 0
    print ""
    print
    next
  }
  in_block && /^failures:$/ { in_block = 0; next }
  in_block {
    print
    if ($0 ~ /^Error: / || $0 ~ /^thread .* panicked at /) in_cause = 1
    if (in_cause) keep($0)
  }
  END {
    if (!failed) exit
    print ""
    printf "%d test(s) failed; each one and the start of its error:\n", failed
    for (i = 1; i <= failed; i++) {
      print "  " name[i]
      printf "%s", cause[i] == "" ? "    (no error or panic message in its output)\n" : cause[i]
    }
  }
' "$log"
