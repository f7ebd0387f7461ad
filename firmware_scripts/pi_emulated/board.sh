#!/usr/bin/env bash
# An emulated Raspberry Pi: a Debian bookworm arm64 root file system (the userland of 64-bit
# Raspberry Pi OS) run by qemu-user-static and booted with systemd as PID 1 in systemd-nspawn.
# The board shares the host's network, so it reaches a broker on the host's 127.0.0.1.
#
#   sudo firmware_scripts/pi_emulated/board.sh build  [--root DIR]      debootstrap once, cached
#   sudo firmware_scripts/pi_emulated/board.sh boot   [--root DIR] [--bind[-ro] HOST:BOARD]... [--ephemeral]
#   sudo firmware_scripts/pi_emulated/board.sh exec   [--root DIR] -- COMMAND...
#   sudo firmware_scripts/pi_emulated/board.sh stop   [--root DIR]
#   sudo firmware_scripts/pi_emulated/board.sh status [--root DIR]
#
# DIR defaults to $FEDHAR_BOARD_ROOT, else ~/.cache/fedhar/pi-rootfs. `boot` binds this
# checkout read-only at /mnt/fedhar (plus any --bind), starts systemd-nspawn in the background
# (log: DIR.boot.log) and returns once the board's systemd reports that booting has finished.
# --ephemeral boots a throw-away copy (systemd-nspawn --ephemeral): whatever runs on the board
# leaves the cached root file system as it was built. `exec` runs a command inside the booted
# board (in all its namespaces, via nsenter: machinectl needs a registered machine, which a host
# without systemd as PID 1 cannot register) and returns its exit status. Needs root and the
# Debian packages debootstrap, qemu-user-static and systemd-container.
# Guide: firmware_scripts/README.md, "An emulated board".
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
root="${FEDHAR_BOARD_ROOT:-$HOME/.cache/fedhar/pi-rootfs}"
suite=bookworm
mirror="${FEDHAR_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# What a fresh 64-bit Raspberry Pi OS Lite brings that pi_setup.sh relies on.
packages=systemd,systemd-sysv,dbus,python3,python3-venv,ca-certificates,rsync,i2c-tools,procps,iproute2
binds=() ephemeral=0

die() { echo "board.sh: $*" >&2; exit 2; }
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

cmd="${1:-}"; [ $# -gt 0 ] && shift
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root="$2"; shift 2 ;;
    --bind) binds+=("--bind=$2"); shift 2 ;;
    --bind-ro) binds+=("--bind-ro=$2"); shift 2 ;;
    --ephemeral) ephemeral=1; shift ;;
    --) shift; break ;;
    -h|--help) usage; exit 0 ;;
    *) if [ "$cmd" = exec ]; then break; fi; die "unknown option $1 (see --help)" ;;
  esac
done
root="$(realpath -m "$root")"
pidfile="$root.nspawn.pid"
log="$root.boot.log"

need_root() { [ "$(id -u)" -eq 0 ] || die "run it as root (sudo): debootstrap and systemd-nspawn need it"; }
need_tool() {  # need_tool COMMAND PACKAGE
  command -v "$1" >/dev/null 2>&1 || die "$1 is missing: apt-get install -y $2"
}

# qemu-user-static registers its handlers on install where systemd runs binfmt; on a host (or
# container) without it, mount binfmt_misc and register the arm64 handler from its own file.
ensure_binfmt() {
  [ "$(uname -m)" = aarch64 ] && return 0
  if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc \
      || die "cannot mount binfmt_misc; load it (modprobe binfmt_misc) and retry"
  fi
  if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    local conf=/usr/lib/binfmt.d/qemu-aarch64.conf
    [ -r "$conf" ] || die "$conf is missing: apt-get install -y qemu-user-static"
    cat "$conf" > /proc/sys/fs/binfmt_misc/register
  fi
  grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 || die "the qemu-aarch64 binfmt handler is disabled"
}

leader() {  # the board's PID 1 as the host sees it, or nothing
  [ -r "$pidfile" ] || return 0
  local nspawn; nspawn="$(cat "$pidfile")"
  kill -0 "$nspawn" 2>/dev/null || return 0
  ps -o pid= --ppid "$nspawn" | head -n1 | tr -d ' '
}

in_board() {  # in_board COMMAND...: run it in the board's namespaces with a plain environment
  local pid; pid="$(leader)"
  [ -n "$pid" ] || die "the board at $root is not running (board.sh boot)"
  nsenter --target "$pid" --mount --uts --ipc --pid --root --wdns=/ -- \
    /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM=dumb "$@"
}

# qemu-user cannot emulate a fork into a new mount namespace (clone with CLONE_NEWNS gives EINVAL),
# which systemd needs to mount a unit's credentials, so on this board every LoadCredential= fails
# with 243/CREDENTIALS, and /run/credentials is read-only. Drop-ins give the two fedhar units the
# same password file in their runtime folder instead, copied by a privileged ExecStartPre; their
# ExecStart is the unit's own with %d/password replaced by that path. A real Raspberry Pi runs
# the units unchanged.
install_dropins() {
  local unit name src exec_start d
  for unit in fedhar-client@ fedhar-coordinator; do
    if [ "$unit" = fedhar-client@ ]; then name='%i'; src='/etc/fedhar/%i.password'; else name=coordinator; src=/etc/fedhar/coordinator.password; fi
    exec_start="$(grep '^ExecStart=' "$repo/firmware_scripts/systemd/$unit.service" | sed "s|%d/password|%t/fedhar-credentials/$name/password|")"
    d="$root/etc/systemd/system/$unit.service.d"
    mkdir -p "$d"
    cat > "$d/qemu-credentials.conf" <<UNIT
# Written by firmware_scripts/pi_emulated/board.sh: under qemu-user systemd cannot mount credentials.
[Service]
LoadCredential=
RuntimeDirectory=fedhar-credentials/$name
RuntimeDirectoryMode=0700
ExecStartPre=+/bin/sh -c 'install -m 0400 -o fedhar -g fedhar $src %t/fedhar-credentials/$name/password'
ExecStart=
$exec_start
UNIT
  done
}

case "$cmd" in
  build)
    need_root; need_tool debootstrap debootstrap; need_tool systemd-nspawn systemd-container
    [ "$(uname -m)" = aarch64 ] || need_tool qemu-aarch64-static qemu-user-static
    ensure_binfmt
    if [ -f "$root/etc/fedhar-board" ]; then echo "board.sh: $root is built ($(cat "$root/etc/fedhar-board"))"; exit 0; fi
    rm -rf "$root.partial"; mkdir -p "$(dirname "$root")"
    start=$(date +%s)
    debootstrap --arch=arm64 --variant=minbase --include="$packages" "$suite" "$root.partial" "$mirror"
    echo board > "$root.partial/etc/hostname"
    root="$root.partial" install_dropins
    # An empty machine id: systemd generates one at the first boot (and nspawn passes its own).
    : > "$root.partial/etc/machine-id"
    # The board's journal stays in memory; nothing else needs a console login.
    ln -sf /dev/null "$root.partial/etc/systemd/system/console-getty.service"
    echo "debian $suite arm64, built $(date -u +%FT%TZ) in $(( $(date +%s) - start )) s" > "$root.partial/etc/fedhar-board"
    mv "$root.partial" "$root"
    echo "board.sh: built $root ($(cat "$root/etc/fedhar-board"))"
    ;;
  boot)
    need_root; need_tool systemd-nspawn systemd-container; need_tool nsenter util-linux
    [ -f "$root/etc/fedhar-board" ] || die "no board at $root: run board.sh build first"
    ensure_binfmt
    if [ -n "$(leader)" ]; then echo "board.sh: already running (PID 1 is host PID $(leader))"; exit 0; fi
    install_dropins
    args=(--register=no --keep-unit --quiet -D "$root" --boot --bind-ro="$repo:/mnt/fedhar")
    args+=("${binds[@]+"${binds[@]}"}")
    [ "$ephemeral" -eq 1 ] && args+=(--ephemeral)
    start=$(date +%s)
    # The shell writes its own PID and becomes systemd-nspawn, so the file names nspawn even
    # where setsid forks (it does when called as a process group leader).
    rm -f "$pidfile"
    setsid sh -c 'echo $$ > "$0"; exec systemd-nspawn "$@"' "$pidfile" "${args[@]}" </dev/null >"$log" 2>&1 &
    for _ in $(seq 1 50); do [ -s "$pidfile" ] && break; sleep 0.1; done
    # Bounded wait: systemd in the board says "running" (or "degraded") once booting is done.
    for _ in $(seq 1 300); do
      if [ -n "$(leader)" ]; then
        state="$(in_board systemctl is-system-running 2>/dev/null || true)"
        case "$state" in running|degraded)
          echo "board.sh: booted to multi-user.target in $(( $(date +%s) - start )) s (state $state)"; exit 0 ;;
        esac
      elif ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        cat "$log" >&2; die "systemd-nspawn exited during boot (log above, $log)"
      fi
      sleep 1
    done
    die "the board did not finish booting in 300 s (log: $log)"
    ;;
  exec)
    need_root
    [ $# -gt 0 ] || die "exec needs a command: board.sh exec -- COMMAND..."
    in_board "$@"
    ;;
  stop)
    need_root
    if [ -z "$(leader)" ]; then echo "board.sh: not running"; rm -f "$pidfile"; exit 0; fi
    nspawn="$(cat "$pidfile")"
    in_board systemctl poweroff >/dev/null 2>&1 || true
    for _ in $(seq 1 120); do kill -0 "$nspawn" 2>/dev/null || break; sleep 1; done
    if kill -0 "$nspawn" 2>/dev/null; then kill -TERM "$nspawn"; sleep 5; fi
    rm -f "$pidfile"
    echo "board.sh: stopped"
    ;;
  status)
    if [ -n "$(leader)" ]; then echo "running: PID 1 is host PID $(leader), $(in_board systemctl is-system-running 2>/dev/null || true)"
    elif [ -f "$root/etc/fedhar-board" ]; then echo "built, not running: $(cat "$root/etc/fedhar-board")"
    else echo "not built: $root"; exit 1; fi
    ;;
  *) usage; exit 2 ;;
esac
