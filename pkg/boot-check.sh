#!/usr/bin/env bash
# Boots a real Debian system in a KVM virtual machine and proves there that the nsq-dedupe
# Debian package installs a working, hardened systemd service.
#
# What it proves. A Debian bookworm system, with systemd as PID 1, gets the package installed
# with dpkg (its maintainer scripts must succeed) and one instance, nsq-dedupe@check, configured
# from the installed /etc/nsq-dedupe/example.toml. A real nsqd runs beside it as a service. At
# boot a one-shot checker service publishes N distinct messages, each twice, and then prints one
# line per check to the serial console, "BOOT-CHECK: PASS name: ..." or "BOOT-CHECK: FAIL name:
# ...", before it powers the machine off:
#   nsqd          nsqd is up and answers on 127.0.0.1.
#   service-ready the instance is active and its /ready endpoint says it is subscribed.
#   dedupe        every message was FINished (channel depth, in flight and deferred all 0) and
#                 the file sink in the state directory holds each distinct message exactly once.
#   user          the service runs with DynamicUser=yes as an allocated user, not root.
#   state-dir     /var/lib/nsq-dedupe/check is a symlink into /var/lib/private, owned by that
#                 user, and is the process's working directory.
#   privileges    the process has no capabilities, no_new_privs and a seccomp filter.
#   security      `systemd-analyze security` rates the unit's exposure at MAX_EXPOSURE or less
#                 (the score is printed).
#   upgrade       installing the package again (dpkg's upgrade path) restarts the running
#                 instance through the postinst, and the copies published again after that
#                 restart are all dropped (the table file outlived the restart).
#   stop          `systemctl stop` ends within TimeoutStopSec, with exit status 0 and result
#                 success, and the table file is saved.
#   bad-config    an instance whose config is not valid TOML ends failed with exit status 78 and
#                 no restart (the unit's RestartPreventExitStatus), instead of a restart loop.
#   purge         `dpkg --purge` stops a running instance gracefully (prerm), removes the unit and
#                 the instance's enablement (postrm), and keeps its state directory.
# The script exits 0 only when every one of these PASS lines is on the console and no FAIL.
#
# What it needs. Root, /dev/kvm (or ACCEL=tcg), and the Debian packages debootstrap, qemu-system-x86 and
# e2fsprogs (mkfs.ext4 with -d). The system is built with debootstrap from the Debian mirror
# that this machine's apt configuration already uses for bookworm (asked from apt at run time;
# set MIRROR to use another), so only that mirror has to be reachable, and only on the first
# run. The virtual machine itself has no network: everything in it talks to 127.0.0.1.
#
# How to run it, from the project's root, as root:
#   DEB=target/debian/nsq-dedupe_0.1.0-1_amd64.deb NSQ_BIN_DIR=/path/to/nsq/bin bash pkg/boot-check.sh
# DEB is the package (pkg/build-deb.sh builds it) and NSQ_BIN_DIR a directory holding an nsqd
# binary for linux/amd64. Optional settings, from the environment:
#   WORK          work directory (default target/boot-check, under CARGO_TARGET_DIR when set).
#                 It keeps the debootstrapped system (base-bookworm/), so the second run skips
#                 the download; delete it, or set FRESH_BASE=1, to build the system again.
#   N             distinct messages published, each twice (default 1000).
#   MAX_EXPOSURE  highest accepted `systemd-analyze security` score (default 2.0).
#   TIMEOUT       seconds the virtual machine may run before it is killed (default 420).
#   MIRROR        Debian mirror URL for debootstrap (default: the one apt on this machine uses).
#   ACCEL         auto (default), kvm or tcg. auto boots with KVM and, when the kernel has printed
#                 nothing after KVM_PROBE seconds (default 30), boots again under qemu's software
#                 emulation (TCG): some machines offer a /dev/kvm that cannot run a stock kernel
#                 (a nested, paravirtual KVM), where the kernel never gets to its first line.
#                 The last line of the output names the accelerator the checks ran under.
#   VERBOSE=1     also copy the serial console to the terminal as it comes.
# The console log is WORK/console.log; the image, kernel and initrd stay in WORK for a look.
# Nothing is mounted by this script (debootstrap mounts /proc and /sys in the system it builds
# while it works, and any it leaves behind after a failure are unmounted on exit).
set -euo pipefail

die() { echo "boot-check: $*" >&2; exit 1; }
note() { echo "boot-check: $*" >&2; }

SUITE=bookworm
# The checks the console must report as PASS, in the order the checker runs them.
CHECKS=(nsqd service-ready dedupe user state-dir privileges security upgrade stop bad-config purge)

# --- settings ---------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot and dpkg in the new system)"
[ -n "${DEB:-}" ] || die "set DEB to the package to check (e.g. target/debian/nsq-dedupe_*.deb)"
[ -n "${NSQ_BIN_DIR:-}" ] || die "set NSQ_BIN_DIR to a directory holding nsqd"
[ -f "$DEB" ] || die "DEB=$DEB: no such file"
[ -x "$NSQ_BIN_DIR/nsqd" ] || die "NSQ_BIN_DIR=$NSQ_BIN_DIR: no executable nsqd there"
DEB="$(realpath "$DEB")"
NSQ_BIN_DIR="$(realpath "$NSQ_BIN_DIR")"
N="${N:-1000}"
MAX_EXPOSURE="${MAX_EXPOSURE:-2.0}"
TIMEOUT="${TIMEOUT:-420}"
[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "N=$N: expected a positive number"
[[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "TIMEOUT=$TIMEOUT: expected seconds"
[[ "$MAX_EXPOSURE" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "MAX_EXPOSURE=$MAX_EXPOSURE: expected a number"

# The project's root when the script sits in its pkg/ folder, else the current directory.
script_dir="$(cd "$(dirname "$0")" && pwd)"
if [ -f "$script_dir/../Cargo.toml" ]; then project="$(cd "$script_dir/.." && pwd)"; else project="$PWD"; fi
WORK="${WORK:-${CARGO_TARGET_DIR:-$project/target}/boot-check}"
mkdir -p "$WORK"
WORK="$(realpath "$WORK")"

[ -c /dev/kvm ] || [ "${ACCEL:-auto}" = tcg ] || die "/dev/kvm is missing: this needs KVM, or ACCEL=tcg for software emulation"
for tool in debootstrap qemu-system-x86_64 mkfs.ext4 dpkg-deb chroot timeout; do
  command -v "$tool" >/dev/null || die "$tool is not installed (apt-get install debootstrap qemu-system-x86 e2fsprogs)"
done
[ "$(dpkg-deb -f "$DEB" Package)" = nsq-dedupe ] || die "$DEB is not the nsq-dedupe package"

# Leave no mount behind: debootstrap mounts /proc and /sys in the target while it works, and a
# failure can leave them mounted.
qemu_pid=
cleanup() {
  local mnt
  if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
  for mnt in $(awk -v w="$WORK/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r); do
    umount -l "$mnt" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. the base system, debootstrapped once and kept --------------------------------------------
# The mirror: the one apt on this machine uses for the suite's main component with Debian as its
# origin (asked from apt, which reads sources.list and sources.list.d in both formats), else any
# entry for the suite and main component in the configuration.
mirror="${MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror="$(apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages' "Release: $SUITE" \
    'Component: main' 'Origin: Debian' 'Target-Of: deb' 2>/dev/null | head -n 1)"
fi
if [ -z "$mirror" ]; then
  mirror="$(apt-get indextargets --no-release-info --format '$(REPO_URI)' 'Created-By: Packages' \
    "Release: $SUITE" 'Component: main' 'Target-Of: deb' 2>/dev/null | head -n 1)"
fi

# The package's own dependencies (first alternative of each, without versions), plus what the
# checker uses: curl for nsqd's HTTP API, jq for its stats, procps for ps; libnss-systemd names
# the dynamic users.
deps="$(dpkg-deb -f "$DEB" Depends | tr ',' '\n' | sed -e 's/|.*//' -e 's/(.*)//' -e 's/:.*//' \
  -e 's/[[:space:]]//g' | grep -v '^$' | sort -u | paste -sd, -)"
include="systemd,systemd-sysv,dbus,libnss-systemd,linux-image-amd64,curl,jq,procps${deps:+,$deps}"
base="$WORK/base-$SUITE"
stamp="$base.stamp"
want_stamp="suite=$SUITE variant=minbase include=$include"
if [ "${FRESH_BASE:-0}" = 1 ] || [ ! -d "$base" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want_stamp" ]; then
  [ -n "$mirror" ] || die "no $SUITE main entry in this machine's apt sources: set MIRROR"
  note "debootstrap $SUITE (minbase + $include) from $mirror into $base"
  cleanup  # a run killed during debootstrap may have left /proc or /sys mounted in $base.tmp
  rm -rf "$base" "$base.tmp" "$stamp"
  started=$SECONDS
  if ! debootstrap --variant=minbase --include="$include" "$SUITE" "$base.tmp" "$mirror" \
      >"$WORK/debootstrap.log" 2>&1; then
    tail -n 30 "$WORK/debootstrap.log" >&2
    cleanup
    die "debootstrap failed (log: $WORK/debootstrap.log)"
  fi
  cleanup
  chroot "$base.tmp" apt-get clean
  mv "$base.tmp" "$base"
  echo "$want_stamp" >"$stamp"
  note "debootstrap done in $((SECONDS - started)) s"
else
  note "reusing the debootstrapped system in $base"
fi

# --- 2. this run's system: the package, nsqd, the instance and the checker ---------------------
root="$WORK/root"
rm -rf "$root"
cp -a "$base" "$root"

echo boot-check >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tboot-check\n' >"$root/etc/hosts"
printf '/dev/vda\t/\text4\tdefaults\t0\t0\n' >"$root/etc/fstab"
# A machine id of its own, so that this is no "first boot" (which would run systemd-firstboot).
rm -f "$root/etc/machine-id" "$root/var/lib/dbus/machine-id"
chroot "$root" systemd-machine-id-setup >/dev/null 2>&1

install -m 755 "$NSQ_BIN_DIR/nsqd" "$root/usr/local/bin/nsqd"
install -m 644 "$DEB" "$root/root/nsq-dedupe.deb"
# dpkg runs the maintainer scripts; outside a booted system they skip systemctl.
chroot "$root" dpkg -i /root/nsq-dedupe.deb >"$WORK/dpkg.log" 2>&1 \
  || { cat "$WORK/dpkg.log" >&2; die "dpkg -i failed in the new system"; }
[ -f "$root/etc/nsq-dedupe/example.toml" ] || die "the package installed no /etc/nsq-dedupe/example.toml"

# The instance: a copy of the installed example, consuming topic "check" and writing what it
# keeps to files in its state directory (fsynced before each FIN, so the count is exact once
# nsqd has nothing left in flight). Its table file and dead-letter stay as the example has them,
# relative paths, which the unit's working directory puts in the instance's state directory.
state=/var/lib/nsq-dedupe/check
awk -v state="$state" '
  /^\[/ { section = $0 }
  section == "[source]" && /^topic *=/ { print "topic = \"check\""; next }
  section == "[sink]" { if (!sink_done) { print "[sink]"; print "kind = \"file\""; print "output_dir = \"" state "\""; print ""; sink_done = 1 } next }
  { print }
' "$root/etc/nsq-dedupe/example.toml" >"$root/etc/nsq-dedupe/check.toml"
chmod 644 "$root/etc/nsq-dedupe/check.toml"
grep -q '^kind = "file"' "$root/etc/nsq-dedupe/check.toml" || die "could not set the file sink in check.toml"
grep -q '^topic = "check"' "$root/etc/nsq-dedupe/check.toml" || die "could not set the topic in check.toml"
cp "$root/etc/nsq-dedupe/check.toml" "$WORK/check.toml"

cat >"$root/etc/systemd/system/nsqd.service" <<'EOF'
[Unit]
Description=nsqd for the boot check
Before=nsq-dedupe@check.service

[Service]
Type=simple
ExecStart=/usr/local/bin/nsqd --tcp-address=127.0.0.1:4150 --http-address=127.0.0.1:4151 --broadcast-address=127.0.0.1 --data-path=/var/lib/nsqd
# Started means answering: the sidecar is ordered after this.
ExecStartPost=/bin/sh -c 'for i in $(seq 100); do curl -sf http://127.0.0.1:4151/ping >/dev/null && exit 0; sleep 0.1; done; exit 1'
StateDirectory=nsqd

[Install]
WantedBy=multi-user.target
EOF

cat >"$root/etc/systemd/system/boot-check.service" <<'EOF'
[Unit]
Description=Boot check of the nsq-dedupe package
Wants=nsqd.service
After=nsqd.service nsq-dedupe@check.service
SuccessAction=poweroff
FailureAction=poweroff

# Type=exec rather than oneshot, so that the boot completes and the console stays quiet while it
# runs; RuntimeMaxSec bounds it (exceeded, it fails, and the failure powers off too).
[Service]
Type=exec
ExecStart=/usr/local/sbin/boot-check
RuntimeMaxSec=330
StandardOutput=journal

[Install]
WantedBy=multi-user.target
EOF

printf 'N=%s\nMAX_EXPOSURE=%s\n' "$N" "$MAX_EXPOSURE" >"$root/etc/boot-check.env"
cat >"$root/usr/local/sbin/boot-check" <<'CHECKER'
#!/bin/bash
# Runs once at boot: exercises nsq-dedupe@check against nsqd and prints a PASS or FAIL line per
# check to the serial console (and the journal). Every wait is bounded.
set -u
. /etc/boot-check.env
unit=nsq-dedupe@check.service
state=/var/lib/nsq-dedupe/check
nsqd=http://127.0.0.1:4151
ready=http://127.0.0.1:9150/ready
work=/run/boot-check
mkdir -p "$work"
passed=0 failed=0

say() { printf '%s\n' "$*"; printf '%s\n' "$*" >/dev/ttyS0 2>/dev/null || true; }
pass() { passed=$((passed + 1)); say "BOOT-CHECK: PASS $1: $2"; }
fail() { failed=$((failed + 1)); say "BOOT-CHECK: FAIL $1: $2"; }
info() { say "BOOT-CHECK: info: $*"; }
prop() { systemctl show --value -p "$2" "$1"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# wait_for SECONDS COMMAND...: runs COMMAND every 0.5 s until it succeeds or the time is up.
wait_for() {
  local limit=$1 start; shift; start=$(date +%s)
  until "$@"; do
    [ $(( $(date +%s) - start )) -ge "$limit" ] && return 1
    sleep 0.5
  done
}
stats() { curl -sf --max-time 5 "$nsqd/stats?format=json&topic=check&channel=nsq-dedupe" \
  | jq -r '(.data // .) | .topics[]? | select(.topic_name == "check") | .channels[]?
           | select(.channel_name == "nsq-dedupe")
           | "\(.depth) \(.in_flight_count) \(.deferred_count) \(.message_count) \(.requeue_count) \(.timeout_count) \(.client_count)"'; }
lines() { cat "$state"/*.log 2>/dev/null | wc -l; }
# drained TOTAL: nsqd has put TOTAL messages into the channel and none is waiting, in flight or
# deferred, and the sink's files hold N lines.
drained() {
  local s; s=$(stats) || return 1
  set -- $s
  [ "${1:-x}" = 0 ] && [ "$2" = 0 ] && [ "$3" = 0 ] && [ "$4" = "$total" ] && [ "$(lines)" = "$N" ]
}
mpub_twice() {
  local r1 r2
  r1=$(curl -sS --max-time 20 --data-binary @"$work/bodies" "$nsqd/mpub?topic=check" 2>&1)
  r2=$(curl -sS --max-time 20 --data-binary @"$work/bodies" "$nsqd/mpub?topic=check" 2>&1)
  [ "$r1" = OK ] && [ "$r2" = OK ] || { echo "mpub answered: $r1 / $r2"; return 1; }
}
service_ready() { [ "$(prop $unit ActiveState)" = active ] && curl -sf --max-time 2 "$ready" >/dev/null; }

say "BOOT-CHECK: start: $(uname -r), $(systemctl --version | head -n 1), $(/usr/bin/nsq-dedupe --version)"

# --- nsqd
if wait_for 30 curl -sf --max-time 2 "$nsqd/ping" -o /dev/null; then
  pass nsqd "nsqd $(curl -sf "$nsqd/info" | jq -r '(.data // .).version') answers on 127.0.0.1:4151 ($(prop nsqd.service ActiveState))"
else
  fail nsqd "nsqd does not answer on 127.0.0.1:4151 ($(prop nsqd.service ActiveState))"
fi

# --- service-ready
start=$(now)
if wait_for 30 service_ready; then
  pass service-ready "$unit is $(prop $unit ActiveState) (SubState=$(prop $unit SubState), NRestarts=$(prop $unit NRestarts)); GET /ready: $(curl -s "$ready")"
else
  fail service-ready "$unit is $(prop $unit ActiveState)/$(prop $unit SubState), NRestarts=$(prop $unit NRestarts), /ready: $(curl -s --max-time 2 "$ready" || echo unreachable)"
  journalctl -u $unit -o cat --no-pager | tail -n 20 | while IFS= read -r l; do say "  $l"; done
fi

# --- dedupe: N distinct bodies, each published twice.
seq -f 'boot-check message %06g' 1 "$N" >"$work/bodies"
sort "$work/bodies" >"$work/bodies.sorted"
total=$((2 * N))
start=$(now)
if ! why=$(mpub_twice); then
  fail dedupe "$why"
elif wait_for 60 drained; then
  cat "$state"/*.log | sort >"$work/out.sorted"
  unique=$(sort -u "$work/out.sorted" | wc -l)
  # shellcheck disable=SC2046  # the seven numbers of stats, one per argument
  set -- $(stats)
  if [ "$(wc -l <"$work/out.sorted")" = "$N" ] && [ "$unique" = "$N" ] && cmp -s "$work/out.sorted" "$work/bodies.sorted"; then
    pass dedupe "published $total messages ($N distinct bodies, each twice); channel drained in $(since "$start") s (depth $1, in flight $2, deferred $3, message_count $4, requeued $5, timed out $6); the file sink holds $N lines, $unique distinct, exactly the bodies published"
  else
    fail dedupe "the file sink holds $(wc -l <"$work/out.sorted") lines, $unique distinct, expected exactly the $N bodies published"
  fi
else
  fail dedupe "not drained within 60 s: stats (depth in_flight deferred message_count requeue timeout clients) = $(stats), sink lines = $(lines), expected message_count $total and $N lines"
  journalctl -u $unit -o cat --no-pager | tail -n 20 | while IFS= read -r l; do say "  $l"; done
fi

# --- user
pid=$(prop $unit MainPID)
info "systemctl show $unit -p User,DynamicUser,MainPID: $(systemctl show -p User,DynamicUser,MainPID $unit | paste -sd' ')"
uids=$(awk '/^Uid:/ { print $2, $3, $4, $5 }' /proc/"$pid"/status 2>/dev/null)
set -- $uids
if [ "$pid" -gt 0 ] 2>/dev/null && [ "$(prop $unit DynamicUser)" = yes ] && [ -n "$uids" ] \
    && [ "$1" != 0 ] && [ "$1" = "$2" ] && [ "$1" = "$3" ] && [ "$1" = "$4" ]; then
  uid=$1
  pass user "DynamicUser=yes; MainPID $pid runs as user $(ps -o user= -p "$pid") (uid $uid, gid $(awk '/^Gid:/ { print $2 }' /proc/"$pid"/status)), not root"
else
  uid=
  fail user "MainPID=$pid DynamicUser=$(prop $unit DynamicUser) Uid (real, effective, saved, fs)=${uids:-none}"
fi

# --- state-dir
link=$(readlink "$state" 2>/dev/null)
if [ -L "$state" ] && [ "$(readlink -f "$state")" = /var/lib/private/nsq-dedupe/check ] \
    && [ -n "$uid" ] && [ "$(stat -c %u /var/lib/private/nsq-dedupe/check)" = "$uid" ] \
    && [ "$(stat -c %a /var/lib/private)" = 700 ] \
    && [ "$(readlink -f /proc/"$pid"/cwd)" = /var/lib/private/nsq-dedupe/check ]; then
  pass state-dir "$state -> $link (owner uid $uid, mode $(stat -c %a /var/lib/private/nsq-dedupe/check); /var/lib/private mode 700); the process's working directory is $(readlink /proc/"$pid"/cwd); it holds: $(ls /var/lib/private/nsq-dedupe/check | paste -sd' ')"
else
  fail state-dir "$state -> ${link:-not a symlink}; owner $(stat -c %u /var/lib/private/nsq-dedupe/check 2>&1); cwd $(readlink /proc/"$pid"/cwd 2>&1)"
fi

# --- privileges
st=$(cat /proc/"$pid"/status 2>/dev/null)
field() { echo "$st" | awk -v k="$1:" '$1 == k { print $2 }'; }
if [ -n "$st" ] && [ "$(field CapEff)" = 0000000000000000 ] && [ "$(field CapPrm)" = 0000000000000000 ] \
    && [ "$(field CapBnd)" = 0000000000000000 ] && [ "$(field NoNewPrivs)" = 1 ] && [ "$(field Seccomp)" = 2 ]; then
  pass privileges "CapEff=CapPrm=CapBnd=0, NoNewPrivs=1, Seccomp=2 (filtered)"
else
  fail privileges "CapEff=$(field CapEff) CapPrm=$(field CapPrm) CapBnd=$(field CapBnd) NoNewPrivs=$(field NoNewPrivs) Seccomp=$(field Seccomp)"
fi

# --- security
sec=$(systemd-analyze security --no-pager $unit 2>&1)
echo "$sec" | while IFS= read -r l; do say "  $l"; done
score=$(echo "$sec" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' | tail -n 1)
overall=$(echo "$sec" | grep 'Overall exposure level' | tail -n 1 | sed 's/^[^A-Za-z]*//')
if [ -n "$score" ] && awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s <= m) }'; then
  pass security "systemd-analyze security: exposure $score (at most $MAX_EXPOSURE accepted): $overall"
else
  fail security "systemd-analyze security: exposure ${score:-unknown}, more than $MAX_EXPOSURE: ${overall:-$(echo "$sec" | tail -n 1)}"
fi

# --- upgrade: dpkg -i again runs the postinst as for an upgrade, which restarts the instance.
old_pid=$(prop $unit MainPID)
dpkg_out=$(dpkg -i /root/nsq-dedupe.deb 2>&1); dpkg_rc=$?
new_pid() { p=$(prop $unit MainPID); [ "$p" != 0 ] && [ "$p" != "$old_pid" ] && service_ready; }
total=$((4 * N))
if [ $dpkg_rc != 0 ]; then
  fail upgrade "dpkg -i exited $dpkg_rc: $(echo "$dpkg_out" | tail -n 3 | paste -sd' ')"
elif ! wait_for 30 new_pid; then
  fail upgrade "dpkg -i did not restart $unit: MainPID $old_pid -> $(prop $unit MainPID), $(prop $unit ActiveState)"
elif ! why=$(mpub_twice); then
  fail upgrade "$why"
elif wait_for 60 drained; then
  pass upgrade "dpkg -i again: the postinst restarted $unit (MainPID $old_pid -> $(prop $unit MainPID)); the $N bodies published twice more after the restart were all dropped as copies (message_count $total, the sink still holds $(lines) lines)"
else
  fail upgrade "after the restart: stats (depth in_flight deferred message_count requeue timeout clients) = $(stats), sink lines = $(lines), expected message_count $total and $N lines"
fi

# --- stop
limit=$(prop $unit TimeoutStopUSec)
limit_s=$(systemd-analyze timespan "$limit" 2>/dev/null | awk '$1 ~ /s:$/ && $1 != "Human" { print $2 / 1000000; exit }')
start=$(now)
timeout 120 systemctl stop $unit; stop_rc=$?
took=$(since "$start")
res="ActiveState=$(prop $unit ActiveState) Result=$(prop $unit Result) ExecMainCode=$(prop $unit ExecMainCode) ExecMainStatus=$(prop $unit ExecMainStatus)"
table=$(stat -c %s "$state/table" 2>/dev/null || echo 0)
if [ $stop_rc = 0 ] && awk -v t="$took" -v l="${limit_s:-0}" 'BEGIN { exit !(t < l) }' && [ "$(prop $unit ActiveState)" = inactive ] \
    && [ "$(prop $unit Result)" = success ] && [ "$(prop $unit ExecMainStatus)" = 0 ] && [ "$table" -gt 0 ]; then
  pass stop "systemctl stop took $took s (TimeoutStopSec=$limit = ${limit_s:-?} s); $res; table file saved ($table bytes)"
else
  fail stop "systemctl stop exited $stop_rc after $took s (TimeoutStopSec=$limit = ${limit_s:-?} s); $res; table file $table bytes"
  journalctl -u $unit -o cat --no-pager | tail -n 20 | while IFS= read -r l; do say "  $l"; done
fi

# --- bad-config: an instance whose config is not TOML fails once and stays failed.
bad=nsq-dedupe@bad.service
printf '[source\ntopic = "bad"\n' >/etc/nsq-dedupe/bad.toml
chmod 644 /etc/nsq-dedupe/bad.toml
timeout 30 systemctl start $bad; start_rc=$?
is_failed() { [ "$(prop $bad ActiveState)" = failed ]; }
wait_for 20 is_failed
# Longer than RestartSec=5s: a restart would show by now.
sleep 8
res="ActiveState=$(prop $bad ActiveState) Result=$(prop $bad Result) NRestarts=$(prop $bad NRestarts) ExecMainStatus=$(prop $bad ExecMainStatus)"
why=$(journalctl -u $bad -o cat --no-pager | grep -v -e '^Started' -e '^Starting' -e "^$bad" | head -n 4 | tr -s ' ' | paste -sd' ')
if [ "$(prop $bad ActiveState)" = failed ] && [ "$(prop $bad NRestarts)" = 0 ] \
    && [ "$(prop $bad ExecMainStatus)" = 78 ] && [ "$(prop $bad Result)" = exit-code ]; then
  pass bad-config "invalid TOML: $res (systemctl start exited $start_rc); its log: $why"
else
  fail bad-config "invalid TOML: $res (systemctl start exited $start_rc); its log: $why"
fi

# --- purge: prerm stops running instances, postrm drops the unit and enabled instances.
systemctl start $unit
wait_for 30 service_ready
running_pid=$(prop $unit MainPID)
start_s=$(date +%s)
purge_out=$(timeout 120 dpkg --purge nsq-dedupe 2>&1); purge_rc=$?
deactivated=$(journalctl -u $unit -o cat --no-pager --since "@$start_s" | grep -c 'Deactivated successfully')
failed_stop=$(journalctl -u $unit -o cat --no-pager --since "@$start_s" | grep -c -e 'Failed with result' -e 'Killing process')
checks="dpkg --purge exited $purge_rc; MainPID $running_pid $( [ -d /proc/"$running_pid" ] && echo 'still runs' || echo 'is gone'); journal: $deactivated 'Deactivated successfully', $failed_stop failed or killed; LoadState=$(prop $unit LoadState); unit file $( [ -e /usr/lib/systemd/system/nsq-dedupe@.service ] && echo kept || echo removed); enablement link $( [ -e /etc/systemd/system/multi-user.target.wants/nsq-dedupe@check.service ] && echo kept || echo removed); state directory $( [ -d /var/lib/private/nsq-dedupe/check ] && echo "kept ($(ls /var/lib/private/nsq-dedupe/check | wc -l) files)" || echo removed)"
if [ $purge_rc = 0 ] && [ "$running_pid" -gt 0 ] && [ ! -d /proc/"$running_pid" ] && [ "$deactivated" -ge 1 ] \
    && [ "$failed_stop" = 0 ] && [ "$(prop $unit LoadState)" = not-found ] \
    && [ ! -e /usr/lib/systemd/system/nsq-dedupe@.service ] \
    && [ ! -e /etc/systemd/system/multi-user.target.wants/nsq-dedupe@check.service ] \
    && [ -d /var/lib/private/nsq-dedupe/check ]; then
  pass purge "$checks"
else
  fail purge "$checks; dpkg said: $(echo "$purge_out" | tail -n 3 | paste -sd' ')"
fi

say "BOOT-CHECK: DONE: $passed passed, $failed failed"
exit 0
CHECKER
chmod 755 "$root/usr/local/sbin/boot-check"

chroot "$root" systemctl enable nsqd.service boot-check.service nsq-dedupe@check.service >"$WORK/enable.log" 2>&1 \
  || { cat "$WORK/enable.log" >&2; die "systemctl enable failed in the new system"; }
# The console is for the checker's lines: no login prompt on it.
chroot "$root" systemctl mask serial-getty@ttyS0.service >>"$WORK/enable.log" 2>&1

# --- 3. the disk image, and the boot ---------------------------------------------------------------
kernel="$(ls "$root"/boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)"
initrd="$(ls "$root"/boot/initrd.img-* 2>/dev/null | sort -V | tail -n 1)"
[ -n "$kernel" ] && [ -n "$initrd" ] || die "no kernel or initrd in $root/boot"
cp "$kernel" "$WORK/vmlinuz"
cp "$initrd" "$WORK/initrd.img"
image="$WORK/disk.img"
rm -f "$image"
size_mb=$(( $(du -sm "$root" | cut -f1) + 1024 ))
mkfs.ext4 -q -F -L boot-check -d "$root" "$image" "${size_mb}M" >/dev/null \
  || die "mkfs.ext4 -d could not build the image"
rm -rf "$root"

log="$WORK/console.log"
# boot ACCEL LIMIT: boots the image with accelerator ACCEL (kvm or tcg), the console in $log, and
# kills the machine after LIMIT seconds. With PROBE set, it also gives up after PROBE seconds when
# the kernel has printed nothing yet (status 125): some hosts' /dev/kvm (nested, paravirtual)
# cannot run a stock kernel at a usable speed.
boot() {
  local accel=$1 limit=$2 pid tail_pid='' waited=0 rc
  local cmd=(timeout --kill-after=10 "$limit" qemu-system-x86_64 -m 1024 -smp 2 -nographic -nic none
    -no-reboot -kernel "$WORK/vmlinuz" -initrd "$WORK/initrd.img"
    -drive "file=$image,format=raw,if=virtio"
    -append "root=/dev/vda rw console=ttyS0 panic=1")
  if [ "$accel" = kvm ]; then cmd+=(-enable-kvm); else cmd+=(-accel tcg); fi
  : >"$log"
  "${cmd[@]}" </dev/null >"$log" 2>&1 &
  pid=$!
  qemu_pid=$pid
  if [ "${VERBOSE:-0}" = 1 ]; then tail -n +1 -f --pid="$pid" "$log" & tail_pid=$!; fi
  if [ -n "${PROBE:-}" ]; then
    while kill -0 "$pid" 2>/dev/null && ! grep -a -q 'Linux version' "$log"; do
      if [ "$waited" -ge "$PROBE" ]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        [ -z "$tail_pid" ] || wait "$tail_pid" 2>/dev/null || true
        return 125
      fi
      sleep 1; waited=$((waited + 1))
    done
  fi
  rc=0; wait "$pid" || rc=$?
  qemu_pid=
  [ -z "$tail_pid" ] || wait "$tail_pid" 2>/dev/null || true
  return "$rc"
}
ACCEL="${ACCEL:-auto}"
KVM_PROBE="${KVM_PROBE:-30}"
started=$SECONDS
qemu_rc=0
case "$ACCEL" in
  auto)
    note "booting $(basename "$kernel") with KVM, console in $log, at most $TIMEOUT s"
    PROBE=$KVM_PROBE boot kvm "$TIMEOUT" || qemu_rc=$?
    if [ "$qemu_rc" = 125 ]; then
      cp "$log" "$WORK/console-kvm.log"
      note "with KVM the kernel printed nothing in $KVM_PROBE s (this host's /dev/kvm cannot run it; console in $WORK/console-kvm.log): booting again under software emulation (TCG)"
      ACCEL=tcg; qemu_rc=0
      boot tcg "$TIMEOUT" || qemu_rc=$?
    else
      ACCEL=kvm
    fi ;;
  kvm|tcg)
    note "booting $(basename "$kernel") with $ACCEL, console in $log, at most $TIMEOUT s"
    boot "$ACCEL" "$TIMEOUT" || qemu_rc=$? ;;
  *) die "ACCEL=$ACCEL: expected auto, kvm or tcg" ;;
esac
note "the virtual machine ($ACCEL) ran $((SECONDS - started)) s (exit status $qemu_rc$([ "$qemu_rc" = 124 ] && echo ': killed at the timeout'))"

# --- the verdict -----------------------------------------------------------------------------------
results="$(tr -d '\r' <"$log" | grep -a -o 'BOOT-CHECK: .*' || true)"
echo "$results"
ok=1
for check in "${CHECKS[@]}"; do
  if ! grep -q "^BOOT-CHECK: PASS $check: " <<<"$results"; then
    note "no PASS line for $check"; ok=0
  fi
done
if grep -q '^BOOT-CHECK: FAIL ' <<<"$results"; then note "FAIL lines on the console"; ok=0; fi
grep -q '^BOOT-CHECK: DONE: ' <<<"$results" || { note "the checker did not finish"; ok=0; }
[ "$qemu_rc" = 0 ] || { note "qemu did not end by a power-off (exit status $qemu_rc)"; ok=0; }
if [ $ok = 1 ]; then
  echo "boot-check: PASS: all ${#CHECKS[@]} checks passed in Debian $SUITE booted under qemu ($ACCEL)"
  exit 0
fi
echo "boot-check: FAIL (console log: $log)"
exit 1
