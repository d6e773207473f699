#!/usr/bin/env bash
# CI's clang-tidy (.ci/run): scripts/lint.sh over the C++ sources a change
# touches, not the whole tree, whose run (`make lint`) takes far longer than
# CI has on two cores (CONTRIBUTING.md, "Before you send a change").
#
#   scripts/lint_changed.sh [BUILD] [BASE]   (default: build, HEAD~1)
#
# Linted: each .cc under src/, tools/, python/, fuzz/ or bench/ that differs
# between BASE and the work tree, and for each such header the .cc of the
# same name beside it (foo.h -> foo.cc), through which lint.sh checks the
# header. For a merge commit HEAD~1 is its first parent, so the merge is
# linted for all it brings in. Deleted files are left out; a change with
# nothing to lint says so and exits 0. Otherwise exits as lint.sh does (1 on
# a finding); 2 when BASE is not a commit of this clone (a shallow clone:
# fetch more history, or name BASE).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
base="${2:-HEAD~1}"
if ! git rev-parse --verify -q "$base^{commit}" >/dev/null; then
  echo "lint_changed.sh: '$base' is not a commit of this clone (shallow?); give BASE" >&2
  exit 2
fi
mapfile -t changed < <(git diff --name-only --diff-filter=d "$base" -- 'src/*' 'tools/*' 'python/*' 'fuzz/*' 'bench/*')
sources=()
for f in "${changed[@]}"; do
  case "$f" in
    *.cc) sources+=("$f") ;;
    *.h) [[ -f "${f%.h}.cc" ]] && sources+=("${f%.h}.cc") ;;
  esac
done
if ((${#sources[@]} == 0)); then
  echo "lint_changed.sh: no C++ source changed since $base; nothing to lint"
  exit 0
fi
# One anchored alternation of the paths, their regex characters escaped.
regex=$(printf '%s\n' "${sources[@]}" | sort -u | sed 's/[][\.*^$+?(){}|]/\\&/g' | paste -sd'|')
exec scripts/lint.sh "$build" "^($regex)\$"
