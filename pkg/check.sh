#!/usr/bin/env bash
# Checks the packaging, run by tests/run.sh after the tests have built the binary:
#   - the systemd unit passes `systemd-analyze verify` with no warning (its ExecStart pointed at
#     the binary checked, its man page reference at the generated pages);
#   - given a package (pkg/build-deb.sh passes its .deb), its files, modes, conffiles and
#     maintainer scripts, the README and docs/ as in the tree, and that its binary runs and names
#     the commit it was built from.
# Without a package the unit is checked with target/debug/nsq-dedupe and freshly generated man
# pages. The rest of the package's parts (Cargo.toml's asset list against the generated files,
# the example config, the stop timeout) are checked by `cargo test` (tests/package.rs).
#
# Usage: pkg/check.sh [PACKAGE.deb]
set -euo pipefail
cd "$(dirname "$0")/.."
deb="${1:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "pkg/check.sh: $*" >&2; exit 1; }

if [ -n "$deb" ]; then
  root="$work/root"
  dpkg-deb -x "$deb" "$root"
  dpkg-deb -e "$deb" "$work/control"
else
  root="$work/parts"
  bin="${CARGO_TARGET_DIR:-target}/debug/nsq-dedupe"
  [ -x "$bin" ] || fail "$bin is not built; run cargo test (or cargo build) first"
  install -D -m 755 "$bin" "$root/usr/bin/nsq-dedupe"
  install -D -m 644 "pkg/nsq-dedupe@.service" "$root/usr/lib/systemd/system/nsq-dedupe@.service"
  bash pkg/generate-assets.sh "$bin" "$work/assets"
  mkdir -p "$root/usr/share/man/man1"
  cp "$work/assets"/man/*.1.gz "$root/usr/share/man/man1/"
fi

# --- the unit -------------------------------------------------------------------------------
unit="$root/usr/lib/systemd/system/nsq-dedupe@.service"
[ -f "$unit" ] || fail "no unit at /usr/lib/systemd/system/nsq-dedupe@.service"
if command -v systemd-analyze >/dev/null 2>&1; then
  # verify checks that ExecStart's binary exists on this machine and that `man` finds the
  # Documentation= page, so both are pointed into the tree being checked. Any line it prints is a
  # problem (an unknown key or a bad value is only a warning).
  mkdir -p "$work/units"
  sed "s|^ExecStart=/usr/bin/nsq-dedupe |ExecStart=$root/usr/bin/nsq-dedupe |" "$unit" \
    >"$work/units/nsq-dedupe@.service"
  if ! out="$(MANPATH="$root/usr/share/man" systemd-analyze verify \
      "$work/units/nsq-dedupe@example.service" 2>&1)" || [ -n "$out" ]; then
    fail "systemd-analyze verify nsq-dedupe@example.service: ${out:-failed}"
  fi
  echo "pkg/check.sh: systemd-analyze verify nsq-dedupe@example.service: no warning"
else
  echo "pkg/check.sh: SKIPPED systemd-analyze verify: systemd-analyze is not installed" >&2
fi

[ -n "$deb" ] || exit 0

# --- the package ----------------------------------------------------------------------------
man_pages="$("$root/usr/bin/nsq-dedupe" manpage --dir "$work/man" | xargs -n1 basename)"
expected="$( {
  echo "-rwxr-xr-x ./usr/bin/nsq-dedupe"
  echo "-rw-r--r-- ./usr/lib/systemd/system/nsq-dedupe@.service"
  echo "-rw-r--r-- ./etc/nsq-dedupe/example.toml"
  for page in $man_pages; do echo "-rw-r--r-- ./usr/share/man/man1/$page.gz"; done
  echo "-rw-r--r-- ./usr/share/bash-completion/completions/nsq-dedupe"
  echo "-rw-r--r-- ./usr/share/zsh/vendor-completions/_nsq-dedupe"
  echo "-rw-r--r-- ./usr/share/fish/vendor_completions.d/nsq-dedupe.fish"
  echo "-rw-r--r-- ./usr/share/doc/nsq-dedupe/README.md"
  for page in docs/*; do echo "-rw-r--r-- ./usr/share/doc/nsq-dedupe/$page"; done
  echo "-rw-r--r-- ./usr/share/doc/nsq-dedupe/copyright"
} | sort)"
actual="$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { print $1, $6 }' | sort)"
if [ "$expected" != "$actual" ]; then
  diff <(echo "$expected") <(echo "$actual") >&2 || true
  fail "$deb: files differ from the expected list (< expected, > packaged)"
fi
cmp -s "$unit" "pkg/nsq-dedupe@.service" || fail "the packaged unit differs from pkg/nsq-dedupe@.service"
cmp -s "$root/etc/nsq-dedupe/example.toml" pkg/example.toml || fail "the packaged example differs from pkg/example.toml"
for page in README.md docs/*; do
  cmp -s "$root/usr/share/doc/nsq-dedupe/$page" "$page" || fail "/usr/share/doc/nsq-dedupe/$page differs from $page"
done
for page in $man_pages; do
  zcat "$root/usr/share/man/man1/$page.gz" | cmp -s - "$work/man/$page" \
    || fail "/usr/share/man/man1/$page.gz is not the binary's own page"
done
[ "$(cat "$work/control/conffiles")" = "/etc/nsq-dedupe/example.toml" ] \
  || fail "conffiles: expected /etc/nsq-dedupe/example.toml, got: $(cat "$work/control/conffiles")"
for script in postinst prerm postrm; do
  cmp -s "$work/control/$script" "pkg/debian/$script" || fail "maintainer script $script differs from pkg/debian/$script"
done
version="$("$root/usr/bin/nsq-dedupe" --version)"
case "$version" in
  *"(commit unknown)") fail "the packaged binary does not name its commit: $version" ;;
esac
echo "pkg/check.sh: $deb: $(echo "$actual" | wc -l) files as expected; $version"
