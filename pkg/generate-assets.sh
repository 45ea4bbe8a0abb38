#!/usr/bin/env bash
# Writes the package's generated files from a built binary's flag definitions:
#   OUT/man/*.1.gz        nsq-dedupe.1 and one page per subcommand (gzip -9n, as Debian ships them)
#   OUT/completions/      nsq-dedupe.bash, _nsq-dedupe (zsh), nsq-dedupe.fish
#
# Usage: pkg/generate-assets.sh BINARY [OUT]   (OUT defaults to target/pkg, where
# Cargo.toml's [package.metadata.deb] assets read them)
set -euo pipefail
bin="$(realpath "${1:?usage: pkg/generate-assets.sh BINARY [OUT]}")"
out="$(realpath -m "${2:-$(dirname "$0")/../target/pkg}")"

rm -rf "$out/man" "$out/completions"
mkdir -p "$out/man" "$out/completions"
"$bin" manpage --dir "$out/man" >/dev/null
gzip -9n "$out"/man/*.1
"$bin" completions bash >"$out/completions/nsq-dedupe.bash"
"$bin" completions zsh >"$out/completions/_nsq-dedupe"
"$bin" completions fish >"$out/completions/nsq-dedupe.fish"
