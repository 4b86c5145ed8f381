# numeric_only_lib.sh - sourced by the CLI tests labelled "numeric" (tests/CMakeLists.txt,
# FL_NUMERIC_TESTS). make test runs them twice: on this CPU's kernels (every section), then with
# oneDNN and OpenBLAS held to an older instruction set (scripts/test-isa.sh), which sets
# FLEET_TEST_NUMERIC_ONLY=1. There a test runs only the sections whose checks can depend on the
# kernels those libraries pick (an accuracy against a line; two runs on other kernels, backends,
# precisions or batch sizes within a tolerance; fleet's numbers against another program's) and
# leaves to the first pass those whose outcome cannot: refusals and their messages, output
# formats, two runs on the same kernels being equal bit for bit.
#   native_section NAME   whether to run the section NAME that follows, one whose checks cannot
#                         depend on the kernels: true, but under FLEET_TEST_NUMERIC_ONLY=1 false,
#                         with NAME noted (once) for numeric_only_report
#   numeric_only_report   under FLEET_TEST_NUMERIC_ONLY=1 prints one line naming the sections
#                         left: "numeric-only pass: NAME, NAME left to the native pass"; nothing
#                         otherwise
numeric_only_left=()
native_section() {
  [ "${FLEET_TEST_NUMERIC_ONLY:-0}" = 1 ] || return 0
  local s
  for s in "${numeric_only_left[@]}"; do [ "$s" = "$1" ] && return 1; done
  numeric_only_left+=("$1")
  return 1
}
numeric_only_report() {
  [ "${FLEET_TEST_NUMERIC_ONLY:-0}" = 1 ] || return 0
  local list="" s
  for s in "${numeric_only_left[@]}"; do list+="${list:+, }$s"; done
  echo "numeric-only pass: ${list:-nothing} left to the native pass"
}
