#!/usr/bin/env bash
# `make format` and the format check (ctest format_check, part of `make test`).
#
#   scripts/format.sh           formats every C/C++ source of the project in place
#   scripts/format.sh --check   changes nothing; lists each file clang-format
#                               would change and exits 1 when there is one
#
# The files: every tracked *.h, *.cc, *.cu and *.cpp (git ls-files; a tree
# without .git, such as an unpacked archive, is searched with find) under
# the folders below. The style is .clang-format at the root, read by
# Debian's clang-format 14 (scripts/install-deps.sh installs it); another
# major version may format a few constructs differently, so the check runs
# that one when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."
dirs=(include src tools python fuzz bench tests)

fmt=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null; then fmt="$c"; break; fi
done
if [[ -z "$fmt" ]]; then
  echo "format.sh: clang-format not found (scripts/install-deps.sh build installs it)" >&2
  exit 2
fi

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- "${dirs[@]}" |
    grep -E '\.(h|cc|cu|cpp)$' || true)
else
  mapfile -t files < <(find "${dirs[@]}" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cpp' \) |
    grep -v '/corpus/' | sort)
fi
# A listed file deleted in the working tree is not there to format.
existing=()
for f in "${files[@]}"; do [[ -f "$f" ]] && existing+=("$f"); done

if [[ "${1:-}" == "--check" ]]; then
  # One clang-format run over all files; each offence is a "file:line:col:
  # error: code should be clang-formatted" line.
  mapfile -t bad < <(printf '%s\0' "${existing[@]}" | xargs -0 "$fmt" --dry-run --Werror 2>&1 |
    sed -nE 's/^([^:]+):[0-9]+:[0-9]+: error: .*/\1/p' | sort -u || true)
  if ((${#bad[@]} > 0)); then
    echo "format.sh: ${#bad[@]} of ${#existing[@]} files are not formatted with .clang-format ($fmt);" \
      "run 'make format':" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format.sh: all ${#existing[@]} C/C++ files are formatted"
  exit 0
fi
printf '%s\0' "${existing[@]}" | xargs -0 -n 50 "$fmt" -i
echo "format.sh: formatted ${#existing[@]} files"
