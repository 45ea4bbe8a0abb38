# Shell helpers shared by the end-to-end benchmarks (sourced): the NSQ tools and the sidecar
# binary they run. Their Python helpers are in nsq_bench.py.

# need_tools NAME DIR TOOL...: exits 1, naming the script NAME, unless DIR holds every NSQ
# TOOL and python3 is on PATH.
need_tools() {
  local name=$1 dir=$2
  shift 2
  local tool
  for tool in "$@"; do
    if [ ! -x "$dir/$tool" ]; then
      echo "$name: $dir/$tool is missing: build NSQ v1.3.0's apps ($*; 'go build ./apps/...'" >&2
      echo "  in its source) and set NSQ_BIN_DIR to their directory" >&2
      exit 1
    fi
  done
  command -v python3 >/dev/null || { echo "$name: needs python3" >&2; exit 1; }
}

# sidecar_binary NAME CHECKOUT: prints the sidecar to measure: $NSQ_DEDUPE_BIN, or else
# target/release/nsq-dedupe of CHECKOUT after `cargo build --release` there.
sidecar_binary() {
  local name=$1 checkout=$2
  if [ -n "${NSQ_DEDUPE_BIN:-}" ]; then
    [ -x "$NSQ_DEDUPE_BIN" ] || { echo "$name: NSQ_DEDUPE_BIN=$NSQ_DEDUPE_BIN is not an executable file" >&2; exit 1; }
    echo "$NSQ_DEDUPE_BIN"
  else
    echo "building the sidecar: cargo build --release (set NSQ_DEDUPE_BIN to measure another binary)" >&2
    cargo build --release --quiet --manifest-path "$checkout/Cargo.toml" >&2
    echo "$checkout/target/release/nsq-dedupe"
  fi
}

# positive_whole NAME FLAG:VALUE...: exits 2, naming the script NAME and the flag as typed
# (--FLAG), unless every VALUE is a positive whole number.
positive_whole() {
  local name=$1 pair
  shift
  for pair in "$@"; do
    if ! [[ ${pair#*:} =~ ^[1-9][0-9]*$ ]]; then
      echo "$name: --${pair%%:*} must be a positive whole number, got '${pair#*:}'" >&2
      exit 2
    fi
  done
}
