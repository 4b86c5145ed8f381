# marker_lib.sh - sourced by the multi-process CLI tests: every process a test starts carries
# FLEET_TEST_MARKER=$marker in its environment (the test exports it), so that the test's
# cleanup kills its own processes and never those of a test running beside it.
#   kill_marked PATTERN   SIGKILLs each process whose command line matches PATTERN (pgrep -f)
#                         and whose environment holds FLEET_TEST_MARKER=$marker exactly
kill_marked() {
  local p
  for p in $(pgrep -f "$1" || true); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "FLEET_TEST_MARKER=$marker" &&
      kill -9 "$p" 2>/dev/null
  done
  return 0
}
