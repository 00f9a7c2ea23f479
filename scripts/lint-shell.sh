#!/usr/bin/env bash
# Runs shellcheck over every shell script of the repository (the lint step of
# `make test`): the files git tracks, or would (new, not ignored), that are
# named *.sh or start with a sh/bash/dash shebang, so a new script is covered
# without being listed anywhere.
#   scripts/lint-shell.sh          check them all
#   scripts/lint-shell.sh --list   only print which files those are
set -euo pipefail
cd "$(dirname "$0")/.."

files() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files -z --cached --others --exclude-standard
    else
        # Not a git checkout (e.g. an unpacked source tree): every file but build output.
        find . \( -name .git -o -name target -o -name node_modules \) -prune -o -type f -print0 | sed -z 's|^\./||'
    fi
}
scripts=()
while IFS= read -r -d '' f; do
    [ -f "$f" ] || continue   # deleted from the work tree, not yet from git's index
    case "$f" in
    *.sh) scripts+=("$f") ;;
    *) if LC_ALL=C head -n 1 -- "$f" | LC_ALL=C grep -Eq '^#![[:space:]]*([^[:space:]]*/)?(env[[:space:]]+)?(ba|da|k)?sh([[:space:]]|$)'; then
           scripts+=("$f")
       fi ;;
    esac
done < <(files)
[ ${#scripts[@]} -gt 0 ] || { echo "lint-shell: found no shell scripts (run from the repository)" >&2; exit 1; }

if [ "${1:-}" = --list ]; then
    printf '%s\n' "${scripts[@]}"
    exit 0
fi
command -v shellcheck >/dev/null \
    || { echo "lint-shell: shellcheck is missing: apt-get install shellcheck (scripts/setup.sh installs it)" >&2; exit 1; }
shellcheck -- "${scripts[@]}"
echo "lint-shell: shellcheck clean: ${scripts[*]}"
