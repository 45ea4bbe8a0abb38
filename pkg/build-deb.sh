#!/usr/bin/env bash
# Builds the Debian package into target/debian/ and checks its contents:
#   1. cargo-deb: the one on PATH, else installed once under target/tools;
#   2. the release binary, then its man pages and completions (pkg/generate-assets.sh);
#   3. `cargo deb --no-build` with Cargo.toml's [package.metadata.deb];
#   4. pkg/check.sh on the package.
# Extra arguments go to cargo-deb (e.g. --deb-revision 2). The package's Maintainer field is
# "$DEBFULLNAME <$DEBEMAIL>" when DEBEMAIL is set (as for Debian's own tools), else the git
# user's name and email when set.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"

cargo_deb="$(command -v cargo-deb || true)"
if [ -z "$cargo_deb" ]; then
  cargo_deb="$target/tools/bin/cargo-deb"
  if [ ! -x "$cargo_deb" ]; then
    echo "pkg/build-deb.sh: installing cargo-deb into $target/tools" >&2
    cargo install --locked --root "$target/tools" --version '^3.8' cargo-deb
  fi
fi

cargo build --release --locked --bin nsq-dedupe
bash pkg/generate-assets.sh "$target/release/nsq-dedupe" target/pkg
# The release profile keeps line tables for profiling; the packaged binary goes without them.
maintainer=()
if [ -n "${DEBEMAIL:-}" ]; then
  maintainer=(--maintainer "${DEBFULLNAME:-} <$DEBEMAIL>")
elif email="$(git config user.email 2>/dev/null)"; then
  maintainer=(--maintainer "$(git config user.name 2>/dev/null) <$email>")
fi
"$cargo_deb" deb --no-build --strip "${maintainer[@]}" "$@"
deb="$(ls -t "$target"/debian/nsq-dedupe_*.deb | head -n 1)"
bash pkg/check.sh "$deb"
echo "$deb"
